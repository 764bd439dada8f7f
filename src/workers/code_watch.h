// CodeWatcher: `corral serve --watch` (issue 13). inotify on a kind's code directory and every
// directory under it (a new subdirectory is watched as it appears); after a burst of changes
// has been quiet for `settle_ms`, on_change() runs once. On the loop: the inotify descriptor is
// an IoHandler, the settle a core::Timer. Single-threaded (the loop's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/result.h"
#include "core/unique_fd.h"

namespace corral::workers {

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

  core::EventLoop& loop_;
  core::Logger& log_;
  std::string dir_;
  uint32_t settle_ms_;
  std::function<void()> on_change_;
  core::UniqueFd fd_;
  std::map<int, std::string> dirs_;  // watch descriptor -> directory
  core::Timer settle_;
};

}  // namespace corral::workers
