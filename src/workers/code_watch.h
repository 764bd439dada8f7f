// CodeWatcher: `corral serve --watch` (issue 13). inotify on a kind's code directory and every
// directory under it (a new subdirectory is watched as it appears; what code_set_skips() leaves
// out of a set, `.git`, `__pycache__`, is not watched); after a burst of changes has been quiet
// for `settle_ms`, on_change() runs once.
//
// It follows the path, not the directory: the parent is watched for the directory's name, so a
// directory replaced by a rename (`mv code code.old; mv code.new code`, a symlink swapped by a
// deploy tool) or removed and made again (`rm -rf code; mkdir code`) is watched again at once,
// logged (`code_watch_rearmed`), and is a change; the old one is no longer watched. While nothing
// is at the path (`code_watch_lost`, logged) no change is reported. The parent itself must stay.
//
// On the loop: the inotify descriptor is an IoHandler, the settle a core::Timer. Single-threaded
// (the loop's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/result.h"
#include "core/unique_fd.h"

namespace corral::workers {

// What an event on the parent directory means for the watched directory's path (sans-IO).
enum class PathChange {
  kNone,      // another name, or nothing that moves the path
  kReplaced,  // something new is at the path (made, or moved or linked there): watch it again
  kGone,      // nothing is at the path any more (removed, or moved away)
};
// `mask` and `name` of an inotify event on the parent; `watched` is the directory's own name.
PathChange parent_event(uint32_t mask, std::string_view name, std::string_view watched);

class CodeWatcher final : public core::IoHandler {
 public:
  // Watches `dir` (recursively) until destroyed; the error names the path inotify refused.
  static core::Result<std::unique_ptr<CodeWatcher>> create(core::EventLoop& loop, core::Logger& log,
                                                           std::string dir, uint32_t settle_ms,
                                                           std::function<void()> on_change);
  ~CodeWatcher();
  CodeWatcher(const CodeWatcher&) = delete;
  CodeWatcher& operator=(const CodeWatcher&) = delete;

  void on_io(uint32_t events) override;

 private:
  CodeWatcher(core::EventLoop& loop, core::Logger& log, std::string dir, uint32_t settle_ms,
              std::function<void()> on_change);
  core::Result<void> add_tree(const std::string& dir);
  void drop_tree(const std::string& dir);  // unwatches `dir` and everything under it
  // The directory at the path is another one now (or none): the old tree's watches go; `why`
  // is logged.
  void rearm(const char* why);
  void lose(const char* why);

  core::EventLoop& loop_;
  core::Logger& log_;
  std::string dir_;     // the path, as configured (no trailing '/')
  std::string parent_;  // its directory, and its name in it
  std::string name_;
  uint32_t settle_ms_;
  std::function<void()> on_change_;
  core::UniqueFd fd_;
  int parent_wd_ = -1;
  int root_wd_ = -1;                 // the watch on the directory at the path; -1: none there
  std::map<int, std::string> dirs_;  // watch descriptor -> directory (the tree)
  core::Timer settle_;
};

}  // namespace corral::workers
