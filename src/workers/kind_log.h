// KindLog: a worker kind's log file, <state>/logs/<kind>.log, where the manager appends its
// workers' stdout and stderr lines (manager.cc's on_output), rotated by size (issue 14):
//
//  * before a line that would take the file past max_size, <kind>.log becomes <kind>.log.1,
//    .1 becomes .2, ..., and the oldest past `keep` is removed; keep 0 truncates the file instead.
//    A file always takes at least one line, so every file is at most max_size, or one line long
//    (a line is bounded: the manager cuts a partial line at 16 KiB, log-escaped at most 4x that).
//  * what it buffers: nothing. write() goes straight to the file (a regular file: the write
//    blocks for the disk, it never queues), and a failed write is dropped, so a worker that
//    floods its stdout grows no memory here; the pipe's own buffer (64 KiB) is what makes the
//    worker wait.
//  * a failure (open, write, rotate) is reported once per spell: write() returns it the first
//    time after a success, so a full disk does not flood the supervisor's log.
//
// The file is opened on the first write, appended to (O_APPEND), and its size taken from fstat
// then, so a restarted supervisor goes on with the file it finds. Lifetime: KindLogs, one per
// Manager, owns a KindLog per kind that has written. Single-threaded (the manager's loop).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "core/result.h"
#include "core/unique_fd.h"

namespace corral::workers {

// [workers.<kind>] log_max_size, log_keep.
struct LogRotation {
  uint64_t max_size = 10 * 1024 * 1024;
  uint32_t keep = 3;  // rotated files kept: <kind>.log.1 .. <kind>.log.<keep>
};

class KindLog {
 public:
  KindLog(std::string path, LogRotation rotation);
  KindLog(const KindLog&) = delete;
  KindLog& operator=(const KindLog&) = delete;

  // Appends `lines`: whole lines, each ending in '\n' (a last one without is written as is).
  // The error is a new failure's (see above); ok otherwise, also while a failure goes on.
  core::Result<void> write(std::string_view lines);
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

 private:
  core::Result<void> open();
  core::Result<void> rotate();
  core::Result<void> append(std::string_view data);
  core::Result<void> report(core::Result<void> r);

  std::string path_;
  LogRotation rotation_;
  core::UniqueFd fd_;
  uint64_t size_ = 0;
  bool failing_ = false;
};

class KindLogs {
 public:
  // The log of `kind` in `dir`, made on first use with `rotation`.
  KindLog& of(const std::string& kind, const std::string& dir, LogRotation rotation);

 private:
  std::map<std::string, std::unique_ptr<KindLog>, std::less<>> logs_;
};

}  // namespace corral::workers
