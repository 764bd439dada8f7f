// CodeStore: content-addressed snapshots of the worker kinds' code (issue 13). A rollout never
// lets a worker read the live directory: snapshot() copies the directory's current set into the
// store first, so a worker's code never changes under it and a half-written directory is never
// what it runs.
//
// Layout under <state>/code (docs/deploying.md):
//   objects/<digest>                one file per distinct content, 0444, written under a temp
//                                   name, fsync'd, renamed; hashed while it is copied
//   versions/<kind>/<version>/      the version's tree: each file a hard link to its object, so
//                                   files unchanged between versions are stored once
//   versions/<kind>/<version>.json  its manifest {version, files:[{path, digest}]}
//   versions/<kind>/history         the versions in the order they became current, newest last
//
// The current set of a directory: every regular file under it, recursively, but names that begin
// with '.' (.git, editor swap files); a symlink counts only when it resolves to a regular file
// inside the directory; anything else (a device, a socket, a symlink out of the tree) is an error
// naming the path. Its version is the SHA-256 of "<path>\0<digest>\n" over the files in bytewise
// path order.
//
// Blocking file I/O: runs on the supervisor's loop, once per rollout (code directories are
// small; the cost is one read of each file and one write of each new content).
// Not thread-safe. One store per state directory: two processes must not collect at once.
#pragma once

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/result.h"
#include "workers/code_set.h"

namespace corral::workers {

// How many versions of a kind a store keeps for rollback (besides any a live worker runs).
inline constexpr size_t kKeepVersions = 5;

class CodeStore {
 public:
  // Creates <state_dir>/code, objects/ and versions/ (0700) if missing.
  static core::Result<CodeStore> open(const std::string& state_dir);

  // Reads `dir`'s current set into the store and makes it the kind's newest version (appended to
  // its history; a version already stored is reused, not copied again).
  core::Result<CodeSet> snapshot(const std::string& kind, const std::string& dir);
  // A kept version of the kind by its full hex version or a unique prefix of at least 8 hex
  // digits; with `make_current` it is appended to the history (a rollback). Errors: ENOENT no
  // such kept version; EINVAL not hex, shorter than 8 digits, or ambiguous (the reason says which).
  core::Result<CodeSet> find(const std::string& kind, const std::string& version_or_prefix,
                             bool make_current);
  // The kind's kept versions, newest first (distinct).
  std::vector<std::string> versions(const std::string& kind) const;
  // Removes the kind's versions that are neither among the `keep` newest of its history nor in
  // `in_use`, then every object no version links (link count 1). Errors are logged by the
  // caller; a failed removal is tried again at the next collect.
  core::Result<void> collect(const std::string& kind, size_t keep,
                             const std::set<std::string>& in_use);

  const std::string& root() const { return root_; }  // <state>/code

 private:
  explicit CodeStore(std::string root) : root_(std::move(root)) {}
  core::Result<std::string> kind_dir(const std::string& kind) const;  // versions/<kind>
  // Copies one file into objects/ (unless its content is there already); returns its digest.
  core::Result<std::string> store_object(const std::string& source);
  // versions/<kind>/<version>/ and its manifest, unless they exist.
  core::Result<void> build_version(const std::string& kdir, const CodeSet& set);
  core::Result<CodeSet> load(const std::string& kdir, const std::string& version) const;
  core::Result<std::vector<std::string>> read_history(const std::string& kdir) const;
  core::Result<void> write_history(const std::string& kdir,
                                   const std::vector<std::string>& history);
  core::Result<void> make_current(const std::string& kdir, const std::string& version);

  std::string root_;
  bool wrote_object_ = false;  // during a snapshot: objects/ needs an fsync
};

}  // namespace corral::workers
