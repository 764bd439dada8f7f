#include "http/percent.h"

#include <gtest/gtest.h>

namespace corral::http {
namespace {

std::string decoded(std::string_view in) {
  std::string out;
  EXPECT_TRUE(percent_decode_segment(in, out)) << in;
  return out;
}

bool refused(std::string_view in) {
  std::string out;
  return !percent_decode_segment(in, out);
}

TEST(PercentTest, PlainTextIsUnchanged) {
  EXPECT_EQ(decoded(""), "");
  EXPECT_EQ(decoded("abc"), "abc");
  EXPECT_EQ(decoded("a-b.c_d~e!$&'()*,;=:@"), "a-b.c_d~e!$&'()*,;=:@");
}

TEST(PercentTest, DecodesHexEitherCase) {
  EXPECT_EQ(decoded("a%20b"), "a b");
  EXPECT_EQ(decoded("%41%62"), "Ab");
  EXPECT_EQ(decoded("%c3%a9"), "\xc3\xa9");
  EXPECT_EQ(decoded("%C3%A9"), "\xc3\xa9");
  EXPECT_EQ(decoded("%25"), "%");
  EXPECT_EQ(decoded("%2525"), "%25");  // decoded once, never twice
  EXPECT_EQ(decoded("%ff"), "\xff");
}

TEST(PercentTest, PlusIsNotASpaceInPaths) {
  EXPECT_EQ(decoded("a+b"), "a+b");
  EXPECT_EQ(decoded("%2B"), "+");
}

TEST(PercentTest, RefusesMalformedEscapes) {
  EXPECT_TRUE(refused("%"));
  EXPECT_TRUE(refused("a%"));
  EXPECT_TRUE(refused("%1"));
  EXPECT_TRUE(refused("a%1"));
  EXPECT_TRUE(refused("%G1"));
  EXPECT_TRUE(refused("%1G"));
  EXPECT_TRUE(refused("%%41"));
  EXPECT_TRUE(refused("% 1"));
}

TEST(PercentTest, RefusesDecodedNulAndSlash) {
  EXPECT_TRUE(refused("%00"));
  EXPECT_TRUE(refused("a%00b"));
  EXPECT_TRUE(refused("%2F"));
  EXPECT_TRUE(refused("%2f"));
  EXPECT_TRUE(refused("..%2F..%2Fetc"));
}

TEST(PercentTest, RefusesRawSlashAndNulInASegment) {
  EXPECT_TRUE(refused("a/b"));
  EXPECT_TRUE(refused(std::string_view("a\0b", 3)));
}

TEST(PercentTest, OutputIsClearedAndCapacityKept) {
  std::string out(100, 'x');
  out = "previous value that is long enough to be on the heap";
  const size_t cap = out.capacity();
  ASSERT_TRUE(percent_decode_segment("ab", out));
  EXPECT_EQ(out, "ab");
  EXPECT_EQ(out.capacity(), cap);
}

TEST(PercentTest, DecodePathKeepsRawSlashes) {
  std::string out;
  ASSERT_TRUE(percent_decode_path("a/b%20c//d/", out));
  EXPECT_EQ(out, "a/b c//d/");
  EXPECT_FALSE(percent_decode_path("a/b%2Fc", out));
  EXPECT_FALSE(percent_decode_path("a/%00", out));
  EXPECT_FALSE(percent_decode_path("a/%4", out));
}

TEST(PercentTest, PathDecodableAgreesWithDecodePath) {
  for (std::string_view p : {"/", "/a%20b/c", "/a%2fb", "/%00", "/%zz", "/%", "/a+b", "//"}) {
    std::string out;
    EXPECT_EQ(percent_path_decodable(p), percent_decode_path(p, out)) << p;
  }
}

TEST(PercentTest, ValidPathChars) {
  for (char c : std::string_view("azAZ09-._~!$&'()*+,;=:@"))
    EXPECT_TRUE(is_valid_path_char(c)) << c;
  for (char c : std::string_view("%/?# \"<>[]\\^`{|}\t\x7f"))
    EXPECT_FALSE(is_valid_path_char(c)) << c;
  EXPECT_FALSE(is_valid_path_char('\0'));
  EXPECT_FALSE(is_valid_path_char('\xc3'));
}

TEST(PercentTest, HexDigitValue) {
  EXPECT_EQ(hex_digit_value('0'), 0);
  EXPECT_EQ(hex_digit_value('9'), 9);
  EXPECT_EQ(hex_digit_value('a'), 10);
  EXPECT_EQ(hex_digit_value('F'), 15);
  EXPECT_EQ(hex_digit_value('g'), -1);
  EXPECT_EQ(hex_digit_value('/'), -1);
}

}  // namespace
}  // namespace corral::http
