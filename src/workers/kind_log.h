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
// then, so a restarted supervisor goes on with the file it finds; reopen() closes it so the next
// write opens the path anew (a log moved away by logrotate). Lifetime: KindLogs, one per
// Manager, owns a KindLog per kind that has written. Single-threaded (the manager's loop).
//
// A line of the file (append_kind_log_line) is
//   2026-12-05T19:03:33.123Z doc:7 [4242] Traceback (most recent call last):
// the UTC time its first byte was read, the address in its wire form with spaces as %20 (so it
// ends at the first space), the worker's pid, then what the worker wrote, log-escaped.
// tail_kind_log reads the last lines of one address back, for `corral ctl logs`.
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
  // Closes the file: the next write opens the path again (and makes it if it was moved away).
  void reopen() { fd_.reset(); }

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
  // Every kind's log opens its path anew at its next write (SIGUSR1, after a rotation by
  // logrotate: nothing written is lost, the old file gets what came before).
  void reopen();

 private:
  std::map<std::string, std::unique_ptr<KindLog>, std::less<>> logs_;
};

// An address as the second field of a kind log line: its wire form, spaces as %20.
std::string kind_log_address(std::string_view address);
// Appends one line: "<time> <address field> [<pid>] <line, log-escaped>\n"; `unix_ms` is the
// wall clock time (ms since the epoch) of the line's first byte.
void append_kind_log_line(std::string& out, int64_t unix_ms, std::string_view address_field,
                          int64_t pid, std::string_view line);
// Whether a line of the file is one of `address_field`'s.
bool kind_log_line_of(std::string_view line, std::string_view address_field);

// The last `lines` lines of `address_field` in the kind log `path` and, when it has fewer, its
// rotated files (path.1 .. path.<keep>), oldest first, each ending in '\n'. Reads the files
// backwards and at most `max_bytes` of them: what an address wrote long ago in a busy kind's log
// may not be found (the cost of a request stays bounded). A missing file is no error.
core::Result<std::string> tail_kind_log(const std::string& path, uint32_t keep,
                                        std::string_view address_field, size_t lines,
                                        uint64_t max_bytes = 8 << 20);

}  // namespace corral::workers
