#include "core/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace corral::core {

size_t format_iso8601(time_t t, char* out) {
  tm g;
  gmtime_r(&t, &g);
  return strftime(out, 21, "%Y-%m-%dT%H:%M:%SZ", &g);
}

static const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      break;
  }
  return "off";
}

Logger::~Logger() {
  flush();
  if (access_fd_ >= 0) ::close(access_fd_);
}

void Logger::write_line(std::string_view line) {
  if (access_fd_ < 0) flush();  // keep order with buffered lines on the same fd
  [[maybe_unused]] ssize_t w = ::write(fd_, line.data(), line.size());
}

void Logger::log(LogLevel l, std::string_view event, std::string_view fields) {
  if (!enabled(l)) return;
  char ts[32];
  size_t n = format_iso8601(time(nullptr), ts);
  write_line(fmt::format("{} {} {}{}{}\n", std::string_view(ts, n), level_name(l), event,
                         fields.empty() ? "" : " ", fields));
}

namespace {

bool key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

// The fields of format string `f` with `args` as JSON members (",\"k\":v..."), appended to `out`;
// false when `f` is not a list of key=value pairs (then `out` is unspecified).
bool json_fields(std::string_view f, const std::vector<log_detail::JsonArg>& args,
                 std::string& out) {
  size_t i = 0, next_arg = 0;
  std::string value;
  while (i < f.size()) {
    if (f[i] == ' ') {
      ++i;
      continue;
    }
    size_t k = i;
    while (i < f.size() && key_char(f[i])) ++i;
    if (i == k || i >= f.size() || f[i] != '=') return false;
    std::string_view key = f.substr(k, i - k);
    ++i;
    bool quoted = i < f.size() && f[i] == '"';
    if (quoted) ++i;
    value.clear();
    int placeholders = 0;
    bool bare = false;
    while (i < f.size()) {
      char c = f[i];
      if (quoted ? c == '"' : c == ' ') break;
      if ((c == '{' || c == '}') && i + 1 < f.size() && f[i + 1] == c) {  // "{{", "}}"
        value += c;
        i += 2;
        continue;
      }
      if (c == '{') {
        size_t close = f.find('}', i);
        if (close == std::string_view::npos || next_arg >= args.size()) return false;
        value += args[next_arg].text;
        bare = args[next_arg].bare;
        ++next_arg;
        ++placeholders;
        i = close + 1;
        continue;
      }
      value += c;
      ++i;
    }
    if (quoted) {
      if (i >= f.size()) return false;
      ++i;  // the closing quote
    }
    out += ',';
    append_json_string(out, key);
    out += ':';
    // A lone unquoted placeholder of a number or bool: bare, as its text is JSON already
    // (fmt writes finite numbers as JSON does; "inf" and "nan" are strings).
    bool number = bare && !quoted && placeholders == 1 && value.find_first_of("in") == value.npos;
    if (number && !value.empty())
      out += value;
    else
      append_json_string(out, value);
  }
  return next_arg == args.size();
}

}  // namespace

void Logger::log_json(LogLevel l, std::string_view event, std::string_view f,
                      const std::vector<log_detail::JsonArg>& args) {
  if (!enabled(l)) return;
  char ts[32];
  size_t n = format_iso8601(time(nullptr), ts);
  std::string line = "{\"time\":";
  append_json_string(line, std::string_view(ts, n));
  line += ",\"level\":";
  append_json_string(line, level_name(l));
  line += ",\"event\":";
  append_json_string(line, event);
  size_t head = line.size();
  if (!json_fields(f, args, line)) {
    // Not key=value pairs: the whole text as one member.
    line.resize(head);
    std::string text;
    size_t next_arg = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      if ((f[i] == '{' || f[i] == '}') && i + 1 < f.size() && f[i + 1] == f[i]) {
        text += f[i++];
      } else if (f[i] == '{') {
        size_t close = f.find('}', i);
        if (close == std::string_view::npos) break;
        if (next_arg < args.size()) text += args[next_arg++].text;
        i = close;
      } else {
        text += f[i];
      }
    }
    line += ",\"message\":";
    append_json_string(line, text);
  }
  line += "}\n";
  write_line(line);
}

void Logger::access(const AccessRecord& r) {
  if (access_format_ == AccessFormat::kCombined)
    access_combined(r);
  else if (format_ == LogFormat::kJson)
    access_json(r);
  else
    access_text(r);
  buffered_.append('\n');
  if (buffered_.size() > 64 * 1024) flush();
}

void Logger::access_text(const AccessRecord& r) {
  std::string_view target = r.target.size() > 2048 ? r.target.substr(0, 2048) : r.target;
  // Escaped (log.h): a byte may become "\xNN".
  size_t cap = 320 + 4 * (r.method.size() + target.size() + r.address.size()) + r.remote.size();
  char* const begin = buffered_.reserve(cap);
  char* const end = begin + cap;
  char* w = begin;
  auto put = [&](auto f, const auto&... args) {
    w = fmt::format_to_n(w, static_cast<size_t>(end - w), f, args...).out;
  };
  put(FMT_STRING("{} info access remote={} method={} target={} status={} bytes={} ms={}"), r.time,
      r.remote, LogValue{r.method.empty() ? "-" : r.method, false},
      LogValue{target.empty() ? "-" : target, false}, r.status, r.bytes, r.duration_ms);
  if (!r.proto.empty()) put(FMT_STRING(" proto={}"), r.proto);
  if (!r.traceparent.empty()) put(FMT_STRING(" trace={}"), r.traceparent);
  if (r.proxied)
    put(FMT_STRING(" address=\"{}\" worker_pid={} cold={}"), LogValue{r.address}, r.worker_pid,
        r.cold ? 1 : 0);
  buffered_.commit(static_cast<size_t>(w - begin));
}

void Logger::access_json(const AccessRecord& r) {
  std::string& s = scratch_;
  s.assign("{\"time\":");
  append_json_string(s, r.time);
  s += ",\"level\":\"info\",\"event\":\"access\",\"remote\":";
  append_json_string(s, r.remote);
  s += ",\"method\":";
  append_json_string(s, r.method);
  s += ",\"target\":";
  append_json_string(s, r.target.size() > 2048 ? r.target.substr(0, 2048) : r.target);
  char num[96];
  auto n = fmt::format_to_n(num, sizeof num, ",\"status\":{},\"bytes\":{},\"duration\":{}.{:03}",
                            r.status, r.bytes, r.duration_ms / 1000, r.duration_ms % 1000);
  s.append(num, std::min(n.size, sizeof num));
  if (!r.proto.empty()) {
    s += ",\"proto\":";
    append_json_string(s, r.proto);
  }
  s += ",\"request_id\":";
  append_json_string(s, r.traceparent);
  if (r.proxied) {
    s += ",\"address\":";
    append_json_string(s, r.address);
    n = fmt::format_to_n(num, sizeof num, ",\"worker_pid\":{},\"cold\":{}", r.worker_pid,
                         r.cold ? "true" : "false");
    s.append(num, std::min(n.size, sizeof num));
  }
  s += '}';
  buffered_.append(s);
}

void Logger::access_combined(const AccessRecord& r) {
  // %h %l %u [%t] "%r" %>s %b "%{Referer}i" "%{User-Agent}i": the request line, referer and
  // agent escaped as corral's text values are (a '"' as \", a control byte as \xNN).
  time_t now = time(nullptr);
  if (now != clf_second_) {
    clf_second_ = now;
    tm g;
    gmtime_r(&now, &g);
    strftime(clf_time_, sizeof clf_time_, "%d/%b/%Y:%H:%M:%S +0000", &g);
  }
  std::string& s = scratch_;
  s.assign(r.remote.empty() ? "-" : r.remote);
  s += " - ";
  if (r.user.empty())
    s += '-';
  else
    append_log_escaped(s, r.user);
  s += " [";
  s += clf_time_;
  s += "] \"";
  append_log_escaped(s, r.method);
  s += ' ';
  append_log_escaped(s, r.target.size() > 2048 ? r.target.substr(0, 2048) : r.target);
  s += r.proto == "h3" ? " HTTP/3\" " : " HTTP/1.1\" ";
  char num[48];
  auto n = fmt::format_to_n(num, sizeof num, "{} {} \"", r.status, r.bytes);
  s.append(num, std::min(n.size, sizeof num));
  if (r.referer.empty())
    s += '-';
  else
    append_log_escaped(s, r.referer);
  s += "\" \"";
  if (r.user_agent.empty())
    s += '-';
  else
    append_log_escaped(s, r.user_agent);
  s += '"';
  buffered_.append(s);
}

void Logger::flush() {
  int fd = access_fd();
  while (!buffered_.empty()) {
    ssize_t w = ::write(fd, buffered_.data(), buffered_.size());
    if (w <= 0) break;
    buffered_.consume(static_cast<size_t>(w));
  }
  buffered_.clear();
}

static int open_log(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
}

std::string Logger::set_access_file(const std::string& path) {
  if (path == access_path_) return {};
  flush();
  int fd = -1;
  if (!path.empty()) {
    fd = open_log(path);
    if (fd < 0) return path + ": " + std::strerror(errno);
  }
  if (access_fd_ >= 0) ::close(access_fd_);
  access_fd_ = fd;
  access_path_ = path;
  return {};
}

void Logger::watch_event_file() {
  event_path_.clear();
  struct stat st;
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) return;
  char link[64], target[4096];
  fmt::format_to_n(link, sizeof link - 1, "/proc/self/fd/{}", fd_).out[0] = '\0';
  ssize_t n = readlink(link, target, sizeof target);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof target || target[0] != '/') return;
  std::string path(target, static_cast<size_t>(n));
  // The same file by that path (not one renamed or removed since): reopen() may open it again.
  struct stat by_path;
  if (stat(path.c_str(), &by_path) != 0 || by_path.st_ino != st.st_ino ||
      by_path.st_dev != st.st_dev)
    return;
  event_path_ = std::move(path);
}

std::string Logger::reopen() {
  flush();
  std::string failed;
  if (!access_path_.empty()) {
    int fd = open_log(access_path_);
    if (fd < 0) {
      failed = access_path_ + ": " + std::strerror(errno);
    } else {
      ::close(access_fd_);
      access_fd_ = fd;
    }
  }
  if (!event_path_.empty()) {
    int fd = open_log(event_path_);
    if (fd < 0) {
      if (!failed.empty()) failed += "; ";
      failed += event_path_ + ": " + std::strerror(errno);
    } else {
      // The fd number stays (2 is stderr for whatever else writes there).
      ::dup2(fd, fd_);
      ::close(fd);
    }
  }
  return failed;
}

}  // namespace corral::core
