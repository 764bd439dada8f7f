#include "core/escape.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/log.h"

namespace corral::core {
namespace {

using namespace std::string_literals;

TEST(WireForm, TextReadsUnchanged) {
  EXPECT_EQ(wire_encode("doc:42"), "doc:42");
  EXPECT_EQ(wire_encode("doc:caf\xc3\xa9 x"), "doc:caf\xc3\xa9 x");
  EXPECT_EQ(wire_encode("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

TEST(WireForm, EscapesPercentInvalidUtf8AndControls) {
  EXPECT_EQ(wire_encode("50%"), "50%25");
  EXPECT_EQ(wire_encode("\xff"), "%FF");
  EXPECT_EQ(wire_encode("\xc0\xae\xc0\xae"), "%C0%AE%C0%AE");  // overlong '.'
  EXPECT_EQ(wire_encode("\xed\xa0\x80"), "%ED%A0%80");         // a surrogate
  EXPECT_EQ(wire_encode("\xf4\x90\x80\x80"), "%F4%90%80%80");  // above U+10FFFF
  EXPECT_EQ(wire_encode("a\r\nX:y"), "a%0D%0AX:y");
  EXPECT_EQ(wire_encode("\x7f\xc2\x9b\xe2\x80\xa8"), "%7F%C2%9B%E2%80%A8");
  EXPECT_EQ(wire_encode("a\0b"s), "a%00b");
  EXPECT_EQ(wire_encode("\xe2\x82"), "%E2%82");  // a truncated sequence
}

TEST(WireForm, DecodesEveryEncodingBack) {
  std::string out;
  for (int i = 0; i < 256; ++i) {
    for (int j = 0; j < 256; j += 7) {
      std::string b{static_cast<char>(i), static_cast<char>(j), '%', '\xe2', '\x80'};
      ASSERT_TRUE(wire_decode(wire_encode(b), out));
      EXPECT_EQ(out, b);
    }
  }
  EXPECT_FALSE(wire_decode("50%", out));
  EXPECT_FALSE(wire_decode("%4", out));
  EXPECT_FALSE(wire_decode("%G1", out));
  ASSERT_TRUE(wire_decode("%c3%A9", out));
  EXPECT_EQ(out, "\xc3\xa9");
}

TEST(LogForm, EscapesWhatCouldEndAValueOrALine) {
  EXPECT_EQ(log_escaped("doc:a\r\nX:y"), "doc:a\\x0d\\x0aX:y");
  EXPECT_EQ(log_escaped("say \"hi\" \\"), "say \\\"hi\\\" \\\\");
  EXPECT_EQ(log_escaped("say \"hi\"", false), "say \"hi\"");
  EXPECT_EQ(log_escaped("\xff\xc3\xa9\x1b[31m"), "\\xff\xc3\xa9\\x1b[31m");
}

TEST(LogForm, LoggerEscapesEveryValue) {
  EXPECT_EQ(log_detail::format("address=\"{}\" pid={} ok={}", std::string("a\r\n\"b"), 42, true),
            "address=\"a\\x0d\\x0a\\\"b\" pid=42 ok=true");
  EXPECT_EQ(log_detail::format("public={}", Verbatim{"{\"m\":\"x\"}\n"}),
            "public={\"m\":\"x\"}\\x0a");
  EXPECT_EQ(log_detail::format("x={:016x}", uint64_t{255}), "x=00000000000000ff");
}

TEST(FileName, BoundedInjectiveAndSafe) {
  EXPECT_EQ(bounded_file_name("doc:42", 200), "doc%3A42");
  EXPECT_EQ(bounded_file_name("", 200), "%");
  EXPECT_EQ(bounded_file_name("..", 200), "%..");
  std::set<std::string> names;
  std::string prefix(300, 'p');
  for (int i = 0; i < 100; ++i) {
    std::string name = bounded_file_name(prefix + std::to_string(i), 200);
    EXPECT_LE(name.size(), 200u);
    EXPECT_EQ(name.find('/'), std::string::npos);
    EXPECT_NE(name.find('~'), std::string::npos);
    names.insert(name);
  }
  EXPECT_EQ(names.size(), 100u);
  std::string ff(250, '\xff');
  std::string name = bounded_file_name(ff, 60);
  EXPECT_LE(name.size(), 60u);
  EXPECT_EQ(name.substr(0, 3), "%FF");
  EXPECT_EQ(bounded_file_name(ff, 60), name);  // stable
  EXPECT_LE(bounded_file_name(ff, kMinFileName).size(), kMinFileName);
}

}  // namespace
}  // namespace corral::core
