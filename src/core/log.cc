#include "core/log.h"

#include <unistd.h>

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

void Logger::log(LogLevel l, std::string_view event, std::string_view fields) {
  if (!enabled(l)) return;
  char ts[32];
  size_t n = format_iso8601(time(nullptr), ts);
  std::string line = fmt::format("{} {} {}{}{}\n", std::string_view(ts, n), level_name(l), event,
                                 fields.empty() ? "" : " ", fields);
  flush();  // keep order with buffered lines
  [[maybe_unused]] ssize_t w = ::write(fd_, line.data(), line.size());
}

void Logger::flush() {
  while (!buffered_.empty()) {
    ssize_t w = ::write(fd_, buffered_.data(), buffered_.size());
    if (w <= 0) break;
    buffered_.consume(static_cast<size_t>(w));
  }
  buffered_.clear();
}

}  // namespace corral::core
