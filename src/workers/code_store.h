// CodeStore: content-addressed snapshots of the worker kinds' code (issue 13). A rollout never
// lets a worker read the live directory: snapshot() copies the directory's current set into the
// store first, so a worker's code never changes under it and a half-written file is never what it
// runs (each file is copied, then checked unchanged: same size, mtime and ctime before and after;
// one that changed is copied again, and refused after a few tries).
//
// Layout under <state>/code (docs/deploying.md):
//   objects/<digest>                one file per distinct content, 0444, written under a temp
//                                   name, fsync'd, renamed; hashed while it is copied; a sparse
//                                   file stays sparse (its holes are skipped, not written)
//   versions/<kind>/<version>/      the version's tree: each file a hard link to its object, so
//                                   files unchanged between versions are stored once
//   versions/<kind>/<version>.json  its manifest {version, files:[{path, digest}]}: the file list
//                                   the worker protocol refers to (`code.manifest`)
//   versions/<kind>/history         the versions in the order they became current, newest last
//
// The current set of a directory: every regular file under it, recursively, but what
// code_set_skips() leaves out (names that begin with '.', `__pycache__`, `.pyc`); a symlink counts
// only when it resolves to a regular file inside the directory; anything else (a device, a socket,
// a symlink out of the tree, an unreadable file) is an error naming the path. Its version is the
// SHA-256 of "<path>\0<digest>\n" over the files in bytewise path order.
//
// Blocking file I/O, meant for a thread of its own (workers/code_store_thread.h): snapshot() reads
// every file and may take seconds (a large file, thousands of files). Not thread-safe: one thread
// at a time uses a store, except versions() (reads only). One store per state directory: two
// processes must not collect at once.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <vector>

#include "core/result.h"
#include "workers/code_set.h"

namespace corral::workers {

// How many versions of a kind a store keeps for rollback (besides any a live worker runs).
inline constexpr size_t kKeepVersions = 5;
// How often a file that changes while it is copied is copied again before the snapshot is refused.
inline constexpr int kCopyTries = 3;

// What a snapshot may be told besides its directory.
struct SnapshotControl {
  std::stop_token stop;  // asked: the snapshot ends soon with ECANCELED, nothing made current
  // Runs after each file's content was read and before it is checked unchanged (tests change the
  // file here; a test build holds the snapshot here). Empty: nothing.
  std::function<void(const std::string& path)> after_copy;
};

class CodeStore {
 public:
  // Creates <state_dir>/code, objects/ and versions/ (0700) if missing.
  static core::Result<CodeStore> open(const std::string& state_dir);

  // What snapshot() would refuse in `dir`, without copying anything: every file of its set is
  // opened for reading. Returns the number of files. The error names the path, as snapshot's.
  static core::Result<size_t> check(const std::string& dir);

  // Reads `dir`'s current set into the store (a version already stored is reused, not copied
  // again). It is not current until make_current() says so: a set the caller refuses is never
  // the kind's current one. ECANCELED once `control.stop` was asked.
  core::Result<CodeSet> snapshot(const std::string& kind, const std::string& dir,
                                 const SnapshotControl& control = {});
  // Appends `version` (stored) to the kind's history: it is the kind's current one.
  core::Result<void> make_current(const std::string& kind, const std::string& version);
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
  // `wrote` is set when an object was written (objects/ then needs an fsync).
  core::Result<std::string> store_object(const std::string& source, const SnapshotControl& control,
                                         bool& wrote);
  // versions/<kind>/<version>/ and its manifest, unless they exist.
  core::Result<void> build_version(const std::string& kdir, const CodeSet& set);
  core::Result<CodeSet> load(const std::string& kdir, const std::string& version) const;
  core::Result<std::vector<std::string>> read_history(const std::string& kdir) const;
  core::Result<void> write_history(const std::string& kdir,
                                   const std::vector<std::string>& history);
  core::Result<void> append_history(const std::string& kdir, const std::string& version);

  std::string root_;
};

}  // namespace corral::workers
