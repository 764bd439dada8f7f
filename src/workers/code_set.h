// CodeSet: one version of a worker kind's code, as a snapshot in the code store
// (workers/code_store.h) holds it and as the worker protocol ships it (docs/worker-protocol.md:
// `start` and `reload` carry `code`: its version, its directory and the path of its manifest, the
// file list a worker library reads). A value type; the manager keeps the current set of each kind
// and the version each worker runs.
#pragma once

#include <string>
#include <string_view>
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
  std::string manifest;         // its manifest, {version, files}: beside dir, "<dir>.json"
  std::vector<CodeFile> files;  // sorted by path (bytewise)

  // [{path, digest}]: the manifest's `files`, what the worker libraries give as `scripts`.
  nlohmann::json scripts_json() const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& f : files) out.push_back({{"path", f.path}, {"digest", f.digest}});
    return out;
  }
  // {version, dir, manifest}: the protocol's `code`. The file list goes by reference (the
  // manifest's path), never inline: a message of any set's size fits the control socket.
  nlohmann::json code_json() const {
    return {{"version", version}, {"dir", dir}, {"manifest", manifest}};
  }
  // The first 12 hex digits: what logs and tables show.
  std::string short_version() const { return version.substr(0, 12); }
};

// Names a code directory's set leaves out, wherever they are in its tree, and that --watch does
// not watch: names beginning with '.' (.git, editor swap files), and what Python writes beside the
// code it imports (`__pycache__` directories, `.pyc` and `.pyo` files), which would otherwise make
// every start of a Python worker a change of its own code.
inline bool code_set_skips(std::string_view name, bool is_dir) {
  if (name.empty() || name[0] == '.') return true;
  if (is_dir) return name == "__pycache__";
  return name.ends_with(".pyc") || name.ends_with(".pyo");
}

}  // namespace corral::workers
