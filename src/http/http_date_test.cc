#include "http/http_date.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

namespace corral::http {
namespace {

constexpr time_t kRfcExample = 784111777;  // Sun, 06 Nov 1994 08:49:37 GMT

std::string fmt(time_t t) {
  char buf[30];
  size_t n = format_http_date(t, buf);
  EXPECT_EQ(n, kHttpDateLength);
  EXPECT_EQ(buf[n], '\0');
  return std::string(buf, n);
}

TEST(HttpDate, Formats) {
  EXPECT_EQ(fmt(kRfcExample), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(fmt(0), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(fmt(951782400), "Tue, 29 Feb 2000 00:00:00 GMT");
  EXPECT_EQ(fmt(253402300799), "Fri, 31 Dec 9999 23:59:59 GMT");
  EXPECT_EQ(fmt(253402300800), "Fri, 31 Dec 9999 23:59:59 GMT");  // clamped
}

TEST(HttpDate, ParsesTheThreeForms) {
  EXPECT_EQ(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), kRfcExample);
  EXPECT_EQ(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), kRfcExample);
  EXPECT_EQ(parse_http_date("Sun Nov  6 08:49:37 1994"), kRfcExample);
  EXPECT_EQ(parse_http_date("Sun Nov 16 08:49:37 1994"), kRfcExample + 10 * 86400);
}

TEST(HttpDate, RoundTrips) {
  for (time_t t : {time_t{0}, kRfcExample, time_t{951782400}, time_t{1700000000},
                   time_t{4102444800}, time_t{1709164799}}) {
    EXPECT_EQ(parse_http_date(fmt(t)), t) << t;
  }
}

TEST(HttpDate, Rfc850TwoDigitYears) {
  // Read as the most recent year with those digits not more than 50 years ahead.
  time_t now = time(nullptr);
  struct tm tm;
  gmtime_r(&now, &tm);
  int year = tm.tm_year + 1900;
  auto rfc850 = [](int yy) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "Monday, 01-Jan-%02d 00:00:00 GMT", yy % 100);
    return std::string(buf);
  };
  auto year_of = [](std::optional<time_t> t) {
    struct tm out;
    gmtime_r(&*t, &out);
    return out.tm_year + 1900;
  };
  auto soon = parse_http_date(rfc850(year + 10));
  ASSERT_TRUE(soon);
  EXPECT_EQ(year_of(soon), year + 10);
  auto past = parse_http_date(rfc850(year + 60));
  ASSERT_TRUE(past);
  EXPECT_EQ(year_of(past), year - 40);
  auto fifty = parse_http_date(rfc850(year + 50));
  ASSERT_TRUE(fifty);
  EXPECT_EQ(year_of(fifty), year + 50);
}

TEST(HttpDate, RejectsMalformed) {
  for (std::string_view s : {
           "",
           "Sun, 06 Nov 1994 08:49:37 UTC",
           "Sun, 06 Nov 1994 08:49:37 GMT ",
           " Sun, 06 Nov 1994 08:49:37 GMT",
           "Sun, 6 Nov 1994 08:49:37 GMT",
           "Xyz, 06 Nov 1994 08:49:37 GMT",
           "Sun, 06 Foo 1994 08:49:37 GMT",
           "Sun, 32 Jan 1994 08:49:37 GMT",
           "Sun, 29 Feb 1900 08:49:37 GMT",  // 1900 is no leap year
           "Sun, 06 Nov 1994 24:00:00 GMT",
           "Sun, 06 Nov 1994 08:60:00 GMT",
           "Sun, 06 Nov 1994 08:49:61 GMT",
           "Sun, 06 Nov 1994 08-49-37 GMT",
           "Sun, 06 Nov 19a4 08:49:37 GMT",
           "Sun, 00 Nov 1994 08:49:37 GMT",
           "Sunday, 06-Nov-1994 08:49:37 GMT",
           "Sunday, 06-Nov-94 08:49:37 GMT trailing",
           "Sun Nov 6 08:49:37 1994",
           "Sun Nov  6 08:49:37 94",
           "1994-11-06T08:49:37Z",
           "784111777",
       }) {
    EXPECT_FALSE(parse_http_date(s)) << s;
  }
  EXPECT_TRUE(parse_http_date("Tue, 29 Feb 2000 00:00:00 GMT"));
  EXPECT_TRUE(parse_http_date("Sun, 06 Nov 1994 08:49:60 GMT"));  // leap second
}

TEST(DateCache, FormatsOncePerSecond) {
  DateCache cache;
  std::string_view a = cache.get(kRfcExample);
  EXPECT_EQ(a, "Sun, 06 Nov 1994 08:49:37 GMT");
  std::string_view b = cache.get(kRfcExample);
  EXPECT_EQ(a.data(), b.data());
  EXPECT_EQ(cache.get(kRfcExample + 1), "Sun, 06 Nov 1994 08:49:38 GMT");
  EXPECT_EQ(cache.get(0), "Thu, 01 Jan 1970 00:00:00 GMT");  // a first get() at 0 is formatted too
  DateCache fresh;
  EXPECT_EQ(fresh.get(0), "Thu, 01 Jan 1970 00:00:00 GMT");
}

}  // namespace
}  // namespace corral::http
