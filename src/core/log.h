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
// LogValue does the same for lines built by hand.
//
// Two renderings (LogFormat): text, as above, or JSON, one object per line with "time", "level",
// "event" first, then one member per "key=value" of the format string (a lone `{}` of a number
// is a JSON number, a bool true/false, anything else a JSON string of the unescaped value, made
// safe by append_json_string). The format strings are ours, written as key=value pairs; one that
// is not (a word without '=') is kept whole as "message".
//
// Access lines are records (AccessRecord) rendered into the buffer in the access format: corral's
// text line, a JSON object, or Apache/nginx "combined". They go to the access file when one is
// set (`access_log = "/path"`), else to the event fd. reopen() (SIGUSR1) flushes, then opens the
// access file and the event file (when the fd was a regular file at watch_event_file()) by path
// again: the logrotate convention (rename, then signal).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

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
// An argument as the JSON rendering sees it: its unescaped text, and whether it is a number or a
// bool (written bare when it is a whole value).
struct JsonArg {
  std::string text;
  bool bare = false;
};
template <typename T>
JsonArg json_arg(const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, Verbatim>)
    return {v.text, false};
  else if constexpr (std::is_same_v<D, LogValue>)
    return {std::string(v.text), false};
  else if constexpr (std::is_same_v<D, bool>)
    return {v ? "true" : "false", true};
  else if constexpr (std::is_same_v<D, char>)
    return {std::string(1, v), false};
  else if constexpr (std::is_arithmetic_v<D>)
    return {fmt::format("{}", v), true};
  else if constexpr (std::is_convertible_v<const T&, std::string_view>)
    return {std::string(std::string_view(v)), false};
  else
    return {fmt::format("{}", v), false};
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
enum class LogFormat : uint8_t { kText, kJson };
// The access log's format: corral's own line (text or JSON, as LogFormat) or Apache/nginx
// "combined".
enum class AccessFormat : uint8_t { kCorral, kCombined };

// One request as the access log tells it. Views: valid for the call to Logger::access only.
struct AccessRecord {
  std::string_view time;  // ISO-8601 (the server's once-a-second copy)
  std::string_view remote;
  std::string_view method;
  std::string_view target;
  std::string_view proto;  // "" (HTTP/1.1, not written in text) or "h3"
  int status = 0;
  uint64_t bytes = 0;
  uint64_t duration_ms = 0;
  std::string_view traceparent;  // the request's W3C traceparent ("" when none was made)
  // Proxied to a worker: its address (bytes), its pid (0: not known), whether it was started
  // for this request.
  std::string_view address;
  int64_t worker_pid = 0;
  bool proxied = false;
  bool cold = false;
  // Combined format only.
  std::string_view referer;
  std::string_view user_agent;
  std::string_view user;  // the principal's id, "" for none
};

class Logger {
 public:
  explicit Logger(int fd = 2, LogLevel level = LogLevel::kInfo) : fd_(fd), level_(level) {}
  ~Logger();
  // A forked process gets a copy (fork copies memory), never a C++ copy.
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  void set_level(LogLevel level) { level_ = level; }
  LogLevel level() const { return level_; }
  bool enabled(LogLevel l) const { return l >= level_; }
  void set_format(LogFormat f) { format_ = f; }
  LogFormat format() const { return format_; }
  void set_access_format(AccessFormat f) { access_format_ = f; }
  AccessFormat access_format() const { return access_format_; }
  // Access lines go to `path` (opened O_APPEND, created 0640), or, with "", to the event fd.
  // Keeps the current file when the path is the same. An error names the path.
  std::string set_access_file(const std::string& path);
  const std::string& access_file() const { return access_path_; }
  // A forked process whose inherited descriptors were closed (fanout's launcher keeps only its
  // own): forgets the access file without closing it, so that set_access_file opens it anew.
  void forget_access_file() {
    access_fd_ = -1;
    access_path_.clear();
  }
  // When the event fd is a regular file, remembers its path so that reopen() opens it again.
  void watch_event_file();
  // Flushes, then opens the access file and the watched event file again by path (a rotated
  // file was renamed: lines from here on go to the new one). Returns what failed, "" if nothing.
  std::string reopen();

  // `fields` is pre-formatted "key=value ..." text.
  void log(LogLevel l, std::string_view event, std::string_view fields = {});
  template <typename... Args>
  void info(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    emit<Args...>(LogLevel::kInfo, event, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void warn(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    emit<Args...>(LogLevel::kWarn, event, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void error(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    emit<Args...>(LogLevel::kError, event, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void debug(std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    emit<Args...>(LogLevel::kDebug, event, f, std::forward<Args>(args)...);
  }
  // The JSON rendering of an event whose fields are `f` with `args` (see the header).
  void log_json(LogLevel l, std::string_view event, std::string_view f,
                const std::vector<log_detail::JsonArg>& args);

  // One access line, rendered in the access format into the buffer (flushed by the owner).
  void access(const AccessRecord& r);

  // Buffered line (access log); `line` without the trailing newline.
  Buffer& buffered() { return buffered_; }
  void end_buffered_line() {
    buffered_.append('\n');
    if (buffered_.size() > 64 * 1024) flush();
  }
  void flush();

 private:
  template <typename... Args>
  void emit(LogLevel l, std::string_view event, fmt::format_string<Args...> f, Args&&... args) {
    if (!enabled(l)) return;
    if (format_ == LogFormat::kJson)
      log_json(l, event, std::string_view(fmt::string_view(f).data(), fmt::string_view(f).size()),
               {log_detail::json_arg(args)...});
    else
      log(l, event, log_detail::format<Args...>(f, args...));
  }
  void write_line(std::string_view line);
  void access_text(const AccessRecord& r);
  void access_json(const AccessRecord& r);
  void access_combined(const AccessRecord& r);
  int access_fd() const { return access_fd_ >= 0 ? access_fd_ : fd_; }

  int fd_;
  LogLevel level_;
  LogFormat format_ = LogFormat::kText;
  AccessFormat access_format_ = AccessFormat::kCorral;
  Buffer buffered_;
  std::string scratch_;  // the JSON and combined renderings of an access line (capacity kept)
  std::string access_path_;
  int access_fd_ = -1;
  std::string event_path_;
  time_t clf_second_ = 0;
  char clf_time_[32] = {};  // "05/Dec/2026:19:03:33 +0000", once a second
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
