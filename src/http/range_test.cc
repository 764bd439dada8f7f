#include "http/range.h"

#include <gtest/gtest.h>

#include <string>

#include "http/http_date.h"

namespace corral::http {
namespace {

using R = std::vector<ByteRange>;

RangeResult sat(std::string_view h, uint64_t size) {
  RangeResult r = parse_range(h, size);
  EXPECT_EQ(r.kind, RangeKind::kSatisfiable) << h;
  return r;
}

TEST(ParseRange, SingleForms) {
  EXPECT_EQ(sat("bytes=0-99", 1000).ranges, (R{{0, 99}}));
  EXPECT_EQ(sat("bytes=500-", 1000).ranges, (R{{500, 999}}));
  EXPECT_EQ(sat("bytes=-100", 1000).ranges, (R{{900, 999}}));
  EXPECT_EQ(sat("bytes=0-0", 1).ranges, (R{{0, 0}}));
  EXPECT_EQ(sat("bytes=999-999", 1000).ranges, (R{{999, 999}}));
}

TEST(ParseRange, ClampsToSize) {
  EXPECT_EQ(sat("bytes=0-5000", 1000).ranges, (R{{0, 999}}));
  EXPECT_EQ(sat("bytes=-5000", 1000).ranges, (R{{0, 999}}));
  EXPECT_EQ(sat("bytes=10-9999999999999999999", 1000).ranges, (R{{10, 999}}));
}

TEST(ParseRange, UnitIsCaseInsensitive) {
  EXPECT_EQ(sat("BYTES=1-2", 10).ranges, (R{{1, 2}}));
  EXPECT_EQ(sat("Bytes=1-2", 10).ranges, (R{{1, 2}}));
}

TEST(ParseRange, ListWithWhitespaceAndEmptyElements) {
  EXPECT_EQ(sat("bytes=0-1, 5-6,\t-1", 10).ranges, (R{{0, 1}, {5, 6}, {9, 9}}));
  EXPECT_EQ(sat("bytes=,0-1,,  ,5-6,", 10).ranges, (R{{0, 1}, {5, 6}}));
  EXPECT_EQ(sat("  bytes=0-1  ", 10).ranges, (R{{0, 1}}));
}

TEST(ParseRange, KeepsClientOrderWithoutOverlap) {
  EXPECT_EQ(sat("bytes=50-59,0-9", 100).ranges, (R{{50, 59}, {0, 9}}));
}

TEST(ParseRange, CoalescesOverlappingAndAdjacent) {
  EXPECT_EQ(sat("bytes=0-10,5-20", 100).ranges, (R{{0, 20}}));
  EXPECT_EQ(sat("bytes=0-9,10-19", 100).ranges, (R{{0, 19}}));
  EXPECT_EQ(sat("bytes=50-60,0-9,55-70", 100).ranges, (R{{0, 9}, {50, 70}}));
  EXPECT_EQ(sat("bytes=0-,-10", 100).ranges, (R{{0, 99}}));
  // A gap of one byte is not adjacent.
  EXPECT_EQ(sat("bytes=0-9,11-19", 100).ranges, (R{{0, 9}, {11, 19}}));
}

TEST(ParseRange, InvalidIsIgnored) {
  for (std::string_view h : {"",
                             "bytes",
                             "bytes=",
                             "bytes= , ",
                             "items=0-1",
                             "bytes 0-1",
                             "bytes =0-1",
                             "bytes=a-b",
                             "bytes=1",
                             "bytes=-",
                             "bytes=5-1",
                             "bytes=0-1-2",
                             "bytes=0 -1",
                             "bytes=- 5",
                             "bytes=+1-2",
                             "bytes=0x1-2",
                             "bytes=0-1,x",
                             "bytes=0-1;q",
                             "bytes=1-2,3-1",
                             "bytes=99999999999999999999-",
                             "bytes=0-99999999999999999999",
                             "bytes=-99999999999999999999"}) {
    EXPECT_EQ(parse_range(h, 1000).kind, RangeKind::kNone) << h;
  }
}

TEST(ParseRange, NineteenDigitsAreFine) {
  // 19 nines < 2^64: parsed without overflow, unsatisfiable against a small size.
  EXPECT_EQ(parse_range("bytes=9999999999999999999-", 1000).kind, RangeKind::kUnsatisfiable);
  EXPECT_EQ(sat("bytes=-9999999999999999999", 1000).ranges, (R{{0, 999}}));
  EXPECT_EQ(sat("bytes=0000000000000000001-2", 1000).ranges, (R{{1, 2}}));
}

TEST(ParseRange, Unsatisfiable) {
  EXPECT_EQ(parse_range("bytes=1000-", 1000).kind, RangeKind::kUnsatisfiable);
  EXPECT_EQ(parse_range("bytes=1000-2000", 1000).kind, RangeKind::kUnsatisfiable);
  EXPECT_EQ(parse_range("bytes=-0", 1000).kind, RangeKind::kUnsatisfiable);
  EXPECT_EQ(parse_range("bytes=2000-,-0", 1000).kind, RangeKind::kUnsatisfiable);
  // Unsatisfiable ranges among satisfiable ones are dropped.
  EXPECT_EQ(sat("bytes=2000-,0-1", 1000).ranges, (R{{0, 1}}));
}

TEST(ParseRange, EmptyRepresentationSatisfiesNothing) {
  for (std::string_view h : {"bytes=0-", "bytes=0-0", "bytes=-1", "bytes=-100"})
    EXPECT_EQ(parse_range(h, 0).kind, RangeKind::kUnsatisfiable) << h;
  EXPECT_EQ(parse_range("bytes=x", 0).kind, RangeKind::kNone);
}

TEST(ParseRange, TooManyRangesAreIgnored) {
  std::string h = "bytes=";
  for (int i = 0; i < 17; ++i) h += std::to_string(i * 10) + "-" + std::to_string(i * 10 + 1) + ",";
  EXPECT_EQ(parse_range(h, 10000).kind, RangeKind::kNone);
  // Exactly 16 disjoint ranges are served.
  std::string h16 = "bytes=";
  for (int i = 0; i < 16; ++i)
    h16 += std::to_string(i * 10) + "-" + std::to_string(i * 10 + 1) + ",";
  EXPECT_EQ(sat(h16, 10000).ranges.size(), 16u);
}

TEST(ParseRange, ManyOverlappingRangesCoalesce) {
  // 100 overlapping ranges collapse into one instead of multiplying the bytes sent.
  std::string h = "bytes=";
  for (int i = 0; i < 100; ++i) h += "0-999,";
  EXPECT_EQ(sat(h, 1000).ranges, (R{{0, 999}}));
}

TEST(ParseRange, TooManySpecsAreIgnoredOutright) {
  std::string h = "bytes=";
  for (size_t i = 0; i <= kMaxRangeSpecs; ++i) h += "0-0,";
  EXPECT_EQ(parse_range(h, 1000).kind, RangeKind::kNone);
}

TEST(ParseRange, HugeSize) {
  EXPECT_EQ(sat("bytes=9999999999999999998-", UINT64_MAX).ranges,
            (R{{9999999999999999998u, UINT64_MAX - 1}}));
  EXPECT_EQ(sat("bytes=-1,0-0", UINT64_MAX).ranges, (R{{UINT64_MAX - 1, UINT64_MAX - 1}, {0, 0}}));
}

TEST(IfRange, StrongEtag) {
  EXPECT_TRUE(if_range_allows("\"abc\"", "\"abc\"", 0));
  EXPECT_TRUE(if_range_allows(" \"abc\" ", "\"abc\"", 0));
  EXPECT_FALSE(if_range_allows("\"abd\"", "\"abc\"", 0));
  EXPECT_FALSE(if_range_allows("W/\"abc\"", "\"abc\"", 0));
  EXPECT_FALSE(if_range_allows("\"abc\"", "W/\"abc\"", 0));
  EXPECT_FALSE(if_range_allows("\"abc", "\"abc", 0));
  EXPECT_FALSE(if_range_allows("", "\"abc\"", 0));
  EXPECT_FALSE(if_range_allows("\"abc\"", "", 0));
}

TEST(IfRange, Date) {
  time_t t = 784111777;  // Sun, 06 Nov 1994 08:49:37 GMT
  EXPECT_TRUE(if_range_allows("Sun, 06 Nov 1994 08:49:37 GMT", "\"x\"", t));
  EXPECT_FALSE(if_range_allows("Sun, 06 Nov 1994 08:49:38 GMT", "\"x\"", t));
  EXPECT_FALSE(if_range_allows("Sun, 06 Nov 1994 08:49:36 GMT", "\"x\"", t));
  EXPECT_FALSE(if_range_allows("yesterday", "\"x\"", t));
}

}  // namespace
}  // namespace corral::http
