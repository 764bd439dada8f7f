// HTTP dates (RFC 9110 §5.6.7): formatting the IMF-fixdate that every Date and Last-Modified header
// carries, and parsing the three forms a recipient must accept (IMF-fixdate, the obsolete RFC 850
// form and asctime). Pure functions, no allocation; times are UTC seconds since the epoch.
//
// DateCache keeps the formatted Date header of the current second so a busy server formats it once
// per second, not once per response. One per event loop (not thread-safe); the view it returns is
// valid until the next get() with a different second.
#pragma once

#include <cstddef>
#include <ctime>
#include <optional>
#include <string_view>

namespace corral::http {

inline constexpr size_t kHttpDateLength = 29;  // "Sun, 06 Nov 1994 08:49:37 GMT"

// Writes the IMF-fixdate of `t` and a terminating NUL into out; returns 29. Years outside
// 0..9999 (never met in practice) are clamped to that range's ends.
size_t format_http_date(time_t t, char out[30]);

// Parses an IMF-fixdate, an RFC 850 date ("Sunday, 06-Nov-94 08:49:37 GMT", two-digit years read
// as the most recent matching year not more than 50 years ahead) or an asctime date
// ("Sun Nov  6 08:49:37 1994"). The weekday is checked for spelling, not for consistency.
// Anything else, including trailing bytes, yields nullopt.
std::optional<time_t> parse_http_date(std::string_view s);

class DateCache {
 public:
  // The IMF-fixdate of `now`, formatted again only when the second changes.
  std::string_view get(time_t now);

 private:
  time_t second_ = 0;
  size_t len_ = 0;  // 0 until the first get()
  char buf_[30] = {};
};

}  // namespace corral::http
