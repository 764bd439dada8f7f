// CodeSet: one version of a worker kind's code, as a snapshot in the code store
// (workers/code_store.h) holds it and as the worker protocol ships it (docs/worker-protocol.md:
// `start` and `reload` carry `scripts` and `code`). A value type; the manager keeps the current
// set of each kind and the version each worker runs.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace corral::workers {

struct CodeFile {
  std::string path;    // relative, '/'-separated ("lib/app.py")
  std::string digest;  // hex SHA-256 of the content
  bool operator==(const CodeFile&) const = default;
};

struct CodeSet {
  std::string version;          // hex SHA-256 of the "<path>\0<digest>\n" lines, in path order
  std::string dir;              // the snapshot's directory (read-only files)
  std::vector<CodeFile> files;  // sorted by path (bytewise)

  // [{path, digest}]: the protocol's `scripts`.
  nlohmann::json scripts_json() const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& f : files) out.push_back({{"path", f.path}, {"digest", f.digest}});
    return out;
  }
  // {version, dir}: the protocol's `code`.
  nlohmann::json code_json() const { return {{"version", version}, {"dir", dir}}; }
  // The first 12 hex digits: what logs and tables show.
  std::string short_version() const { return version.substr(0, 12); }
};

}  // namespace corral::workers
