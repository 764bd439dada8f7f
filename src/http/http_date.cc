#include "http/http_date.h"

#include <cstdint>
#include <cstring>

namespace corral::http {
namespace {

constexpr const char kDays[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
constexpr const char* kLongDays[7] = {"Sunday",   "Monday", "Tuesday", "Wednesday",
                                      "Thursday", "Friday", "Saturday"};
constexpr const char kMonths[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

void put2(char* p, int v) {
  p[0] = static_cast<char>('0' + v / 10);
  p[1] = static_cast<char>('0' + v % 10);
}

bool is_leap(int64_t y) {
  return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

int days_in_month(int64_t y, int m) {
  static constexpr int kDaysIn[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 1 && is_leap(y) ? 29 : kDaysIn[m];
}

// Days since 1970-01-01 of a proleptic Gregorian civil date (Howard Hinnant's algorithm), so that
// parsing needs neither timegm() nor the time zone machinery. m is 1..12.
int64_t days_from_civil(int64_t y, int m, int d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// A cursor over the input; every read checks bounds, a failed read leaves ok_ false.
class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && pos_ == s_.size(); }

  void lit(std::string_view l) {
    if (!ok_ || s_.substr(pos_, l.size()) != l) {
      ok_ = false;
      return;
    }
    pos_ += l.size();
  }
  // Exactly n digits.
  int digits(size_t n) {
    if (!ok_ || s_.size() - pos_ < n) return fail();
    int v = 0;
    for (size_t i = 0; i < n; ++i) {
      char c = s_[pos_ + i];
      if (c < '0' || c > '9') return fail();
      v = v * 10 + (c - '0');
    }
    pos_ += n;
    return v;
  }
  // Month abbreviation, 0..11.
  int month() {
    if (!ok_ || s_.size() - pos_ < 3) return fail();
    for (int m = 0; m < 12; ++m) {
      if (s_.compare(pos_, 3, kMonths[m]) == 0) {
        pos_ += 3;
        return m;
      }
    }
    return fail();
  }
  // One of the names in `names` (none a prefix of another at the same position).
  void one_of(const char* const* names, size_t n) {
    if (!ok_) return;
    for (size_t i = 0; i < n; ++i) {
      std::string_view name(names[i]);
      if (s_.substr(pos_, name.size()) == name) {
        pos_ += name.size();
        return;
      }
    }
    ok_ = false;
  }
  char peek() const { return ok_ && pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip(size_t n) { pos_ += n; }

 private:
  int fail() {
    ok_ = false;
    return 0;
  }
  std::string_view s_;
  size_t pos_ = 0;
  bool ok_ = true;
};

std::optional<time_t> make_time(int64_t year, int mon, int day, int h, int mi, int sec) {
  // 60 is a leap second (RFC 5322 allows it); it reads as the next second's first instant.
  if (day < 1 || day > days_in_month(year, mon) || h > 23 || mi > 59 || sec > 60)
    return std::nullopt;
  int64_t days = days_from_civil(year, mon + 1, day);
  return static_cast<time_t>(days * 86400 + h * 3600 + mi * 60 + sec);
}

void parse_time(Scanner& sc, int& h, int& mi, int& sec) {
  h = sc.digits(2);
  sc.lit(":");
  mi = sc.digits(2);
  sc.lit(":");
  sec = sc.digits(2);
}

const char* const kShortDayNames[7] = {kDays[0], kDays[1], kDays[2], kDays[3],
                                       kDays[4], kDays[5], kDays[6]};

}  // namespace

size_t format_http_date(time_t t, char out[30]) {
  struct tm tm;
  if (gmtime_r(&t, &tm) == nullptr || tm.tm_year + 1900 > 9999 || tm.tm_year + 1900 < 0) {
    // Out of gmtime's or the format's range: clamp.
    std::memcpy(out, t < 0 ? "Sat, 01 Jan 0000 00:00:00 GMT" : "Fri, 31 Dec 9999 23:59:59 GMT",
                kHttpDateLength + 1);
    return kHttpDateLength;
  }
  std::memcpy(out, kDays[tm.tm_wday], 3);
  out[3] = ',';
  out[4] = ' ';
  put2(out + 5, tm.tm_mday);
  out[7] = ' ';
  std::memcpy(out + 8, kMonths[tm.tm_mon], 3);
  out[11] = ' ';
  int year = tm.tm_year + 1900;
  put2(out + 12, year / 100);
  put2(out + 14, year % 100);
  out[16] = ' ';
  put2(out + 17, tm.tm_hour);
  out[19] = ':';
  put2(out + 20, tm.tm_min);
  out[22] = ':';
  put2(out + 23, tm.tm_sec);
  std::memcpy(out + 25, " GMT", 5);
  return kHttpDateLength;
}

std::optional<time_t> parse_http_date(std::string_view s) {
  int h = 0, mi = 0, sec = 0;
  if (s.size() == kHttpDateLength && s[3] == ',') {
    // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
    Scanner sc(s);
    sc.one_of(kShortDayNames, 7);
    sc.lit(", ");
    int day = sc.digits(2);
    sc.lit(" ");
    int mon = sc.month();
    sc.lit(" ");
    int year = sc.digits(4);
    sc.lit(" ");
    parse_time(sc, h, mi, sec);
    sc.lit(" GMT");
    if (!sc.done()) return std::nullopt;
    return make_time(year, mon, day, h, mi, sec);
  }
  if (s.size() == 24 && s[3] == ' ') {
    // asctime: "Sun Nov  6 08:49:37 1994" (a one-digit day is padded with a space)
    Scanner sc(s);
    sc.one_of(kShortDayNames, 7);
    sc.lit(" ");
    int mon = sc.month();
    sc.lit(" ");
    int day;
    if (sc.peek() == ' ') {
      sc.skip(1);
      day = sc.digits(1);
    } else {
      day = sc.digits(2);
    }
    sc.lit(" ");
    parse_time(sc, h, mi, sec);
    sc.lit(" ");
    int year = sc.digits(4);
    if (!sc.done()) return std::nullopt;
    return make_time(year, mon, day, h, mi, sec);
  }
  {
    // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"
    Scanner sc(s);
    sc.one_of(kLongDays, 7);
    sc.lit(", ");
    int day = sc.digits(2);
    sc.lit("-");
    int mon = sc.month();
    sc.lit("-");
    int yy = sc.digits(2);
    sc.lit(" ");
    parse_time(sc, h, mi, sec);
    sc.lit(" GMT");
    if (!sc.done()) return std::nullopt;
    // RFC 9110: a two-digit year more than 50 years in the future is the most recent past year
    // with those digits.
    struct tm now_tm;
    time_t now = time(nullptr);
    int64_t this_year = gmtime_r(&now, &now_tm) ? now_tm.tm_year + 1900 : 2000;
    int64_t year = this_year - this_year % 100 + yy;
    if (year > this_year + 50) year -= 100;
    return make_time(year, mon, day, h, mi, sec);
  }
}

std::string_view DateCache::get(time_t now) {
  if (len_ == 0 || now != second_) {
    len_ = format_http_date(now, buf_);
    second_ = now;
  }
  return {buf_, len_};
}

}  // namespace corral::http
