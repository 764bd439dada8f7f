#include "ws/utf8.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace corral::ws {
namespace {

// The result of feeding `s` split at every position, checked to agree with the whole feed.
bool valid_any_split(std::string_view s) {
  const bool whole = is_valid_utf8(s);
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    Utf8Validator v;
    const bool a = v.feed(s.substr(0, cut));
    const bool b = v.feed(s.substr(cut));
    EXPECT_EQ(whole, a && b && v.complete()) << "cut at " << cut;
  }
  Utf8Validator v;  // one byte at a time
  bool ok = true;
  for (char c : s) ok = v.feed(std::string_view(&c, 1)) && ok;
  EXPECT_EQ(whole, ok && v.complete());
  return whole;
}

TEST(Utf8, ValidForms) {
  EXPECT_TRUE(valid_any_split(""));
  EXPECT_TRUE(valid_any_split("plain ascii text, long enough for the word loop"));
  EXPECT_TRUE(valid_any_split("\x7f"));
  EXPECT_TRUE(valid_any_split("\xc2\x80"));          // U+0080
  EXPECT_TRUE(valid_any_split("\xdf\xbf"));          // U+07FF
  EXPECT_TRUE(valid_any_split("\xe0\xa0\x80"));      // U+0800
  EXPECT_TRUE(valid_any_split("\xed\x9f\xbf"));      // U+D7FF, just below the surrogates
  EXPECT_TRUE(valid_any_split("\xee\x80\x80"));      // U+E000, just above
  EXPECT_TRUE(valid_any_split("\xef\xbf\xbf"));      // U+FFFF
  EXPECT_TRUE(valid_any_split("\xf0\x90\x80\x80"));  // U+10000
  EXPECT_TRUE(valid_any_split("\xf4\x8f\xbf\xbf"));  // U+10FFFF
  EXPECT_TRUE(
      valid_any_split("Hello-\xc2\xb5@\xc3\x9f\xc3\xb6\xc3\xa4\xc3\xbc\xc3\xa0\xc3\xa1-UTF-8!!"));
  EXPECT_TRUE(valid_any_split("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5"));
}

TEST(Utf8, InvalidForms) {
  EXPECT_FALSE(valid_any_split("\x80"));  // continuation without a lead
  EXPECT_FALSE(valid_any_split("\xbf"));
  EXPECT_FALSE(valid_any_split("\xc0\x80"));      // overlong NUL
  EXPECT_FALSE(valid_any_split("\xc1\xbf"));      // overlong 2-byte
  EXPECT_FALSE(valid_any_split("\xe0\x80\x80"));  // overlong 3-byte
  EXPECT_FALSE(valid_any_split("\xe0\x9f\xbf"));
  EXPECT_FALSE(valid_any_split("\xf0\x80\x80\x80"));  // overlong 4-byte
  EXPECT_FALSE(valid_any_split("\xf0\x8f\xbf\xbf"));
  EXPECT_FALSE(valid_any_split("\xed\xa0\x80"));              // U+D800
  EXPECT_FALSE(valid_any_split("\xed\xbf\xbf"));              // U+DFFF
  EXPECT_FALSE(valid_any_split("\xed\xa0\x80\xed\xb0\x80"));  // a surrogate pair (CESU-8)
  EXPECT_FALSE(valid_any_split("\xf4\x90\x80\x80"));          // U+110000
  EXPECT_FALSE(valid_any_split("\xf5\x80\x80\x80"));
  EXPECT_FALSE(valid_any_split("\xff"));
  EXPECT_FALSE(valid_any_split("\xfe"));
  EXPECT_FALSE(valid_any_split("\xc2"));  // truncated at the end
  EXPECT_FALSE(valid_any_split("\xe2\x82"));
  EXPECT_FALSE(valid_any_split("\xf0\x9f\x98"));
  EXPECT_FALSE(valid_any_split("\xc2\x41"));  // lead followed by ASCII
  EXPECT_FALSE(valid_any_split("\xe2\x82\xac\xe2"));
}

TEST(Utf8, FailsAtTheFirstBadByte) {
  Utf8Validator v;
  EXPECT_TRUE(v.feed("ok \xed"));
  EXPECT_FALSE(v.feed("\xa0"));  // a surrogate is known at its second byte
  EXPECT_TRUE(v.failed());
  EXPECT_FALSE(v.feed("more ascii"));  // sticky
  EXPECT_FALSE(v.complete());
  v.reset();
  EXPECT_TRUE(v.feed("\xe2\x82"));
  EXPECT_FALSE(v.complete());  // open sequence: not complete, not failed
  EXPECT_FALSE(v.failed());
  EXPECT_TRUE(v.feed("\xac"));
  EXPECT_TRUE(v.complete());

  Utf8Validator w;
  EXPECT_FALSE(w.feed("\xf0\x80"));  // overlong is known at the second byte too
}

// The word-at-a-time ASCII skip must see a non-ASCII byte at every offset of a word.
TEST(Utf8, NonAsciiAtEveryOffset) {
  for (size_t at = 0; at < 40; ++at) {
    std::string s(48, 'a');
    s[at] = '\x80';
    EXPECT_FALSE(is_valid_utf8(s)) << at;
    s[at] = '\xc3';
    s[at + 1] = '\xa9';
    EXPECT_TRUE(is_valid_utf8(s)) << at;
    s.resize(at + 1);  // truncated 2-byte sequence at the very end
    EXPECT_FALSE(is_valid_utf8(s)) << at;
  }
}

}  // namespace
}  // namespace corral::ws
