// Logger: structured one-line logs ("<time> <level> <event> key=value ...") to a file descriptor,
// passed explicitly to whoever logs (no global logger). Error lines are written at once; access
// lines are buffered and flushed by the owner (on a timer and at exit), so a request costs no
// syscall for its log line.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>

#include "core/buffer.h"

namespace corral::core {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

class Logger {
 public:
  explicit Logger(int fd = 2, LogLevel level = LogLevel::kInfo) : fd_(fd), level_(level) {}
  ~Logger() { flush(); }

  void set_level(LogLevel level) { level_ = level; }
  LogLevel level() const { return level_; }
  bool enabled(LogLevel l) const { return l >= level_; }

  // `fields` is pre-formatted "key=value ..." text.
  void log(LogLevel l, std::string_view event, std::string_view fields = {});
  template <typename... Args>
  void info(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(LogLevel::kInfo))
      log(LogLevel::kInfo, event, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void warn(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(LogLevel::kWarn))
      log(LogLevel::kWarn, event, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void error(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(LogLevel::kError))
      log(LogLevel::kError, event, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void debug(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(LogLevel::kDebug))
      log(LogLevel::kDebug, event, fmt::format(f, std::forward<Args>(args)...));
  }

  // Buffered line (access log); `line` without the trailing newline.
  Buffer& buffered() { return buffered_; }
  void end_buffered_line() {
    buffered_.append('\n');
    if (buffered_.size() > 64 * 1024) flush();
  }
  void flush();

 private:
  int fd_;
  LogLevel level_;
  Buffer buffered_;
};

// "2026-11-29T21:40:00Z" into out (at least 21 bytes); returns the length.
size_t format_iso8601(time_t t, char* out);

}  // namespace corral::core
