// Logger: structured one-line logs ("<time> <level> <event> key=value ...") to a file descriptor,
// passed explicitly to whoever logs (no global logger). Error lines are written at once; access
// lines are buffered and flushed by the owner (on a timer and at exit), so a request costs no
// syscall for its log line.
//
// Every value formatted into a line is escaped (core/escape.h): a string argument of info(),
// warn(), error() and debug() has its control characters and invalid UTF-8 written as "\xNN" and
// its '\' and '"' escaped, so no value a client or a worker chose can end its quotes, its line or
// its entry (`address="doc:a\x0d\x0aX:y"`). Numbers and booleans are written as they are; any
// other argument is formatted first, then escaped. A value that is already escaped text (a JSON
// dump) goes through as Verbatim: only control bytes and invalid UTF-8 are escaped in it.
// LogValue does the same for lines built by hand (the access log).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/buffer.h"
#include "core/escape.h"

namespace corral::core {

// A value escaped as it is formatted (quoted: '\' and '"' too, for a value between quotes).
struct LogValue {
  std::string_view text;
  bool quoted = true;
};
// Text that is already escaped (a JSON dump): only control bytes and invalid UTF-8 are escaped.
struct Verbatim {
  std::string text;
};

namespace log_detail {
struct Owned {
  std::string text;
};
template <typename T>
auto wrap(const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, Verbatim>)
    return LogValue{v.text, false};
  else if constexpr (std::is_same_v<D, LogValue>)
    return v;
  else if constexpr (std::is_same_v<D, char>)
    return Owned{std::string(1, v)};
  else if constexpr (std::is_arithmetic_v<D> || std::is_enum_v<D>)
    return v;
  else if constexpr (std::is_convertible_v<const T&, std::string_view>)
    return LogValue{std::string_view(v)};
  else
    return Owned{fmt::format("{}", v)};
}
template <typename... W>
std::string vformat(fmt::string_view f, const W&... w) {
  return fmt::vformat(f, fmt::make_format_args(w...));
}
// Formats `f` with every argument escaped (see the header).
template <typename... Args>
std::string format(fmt::format_string<Args...> f, const Args&... args) {
  return vformat(f, wrap(args)...);
}
}  // namespace log_detail

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
      log(LogLevel::kInfo, event, log_detail::format<Args...>(f, args...));
  }
  template <typename... Args>
  void warn(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(LogLevel::kWarn))
      log(LogLevel::kWarn, event, log_detail::format<Args...>(f, args...));
  }
  template <typename... Args>
  void error(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(LogLevel::kError))
      log(LogLevel::kError, event, log_detail::format<Args...>(f, args...));
  }
  template <typename... Args>
  void debug(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(LogLevel::kDebug))
      log(LogLevel::kDebug, event, log_detail::format<Args...>(f, args...));
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

template <>
struct fmt::formatter<corral::core::LogValue> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(const corral::core::LogValue& v, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(
        std::string_view(corral::core::log_escaped(v.text, v.quoted)), ctx);
  }
};
template <>
struct fmt::formatter<corral::core::Verbatim> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(const corral::core::Verbatim& v, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(
        std::string_view(corral::core::log_escaped(v.text, false)), ctx);
  }
};
template <>
struct fmt::formatter<corral::core::log_detail::Owned> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(const corral::core::log_detail::Owned& v, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(
        std::string_view(corral::core::log_escaped(v.text)), ctx);
  }
};
