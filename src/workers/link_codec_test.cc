// The link codec: each message's text both ways, addresses in their wire form, and what decode
// refuses or tolerates in untrusted text.
#include "workers/link_codec.h"

#include <gtest/gtest.h>

#include <string>

#include "core/message_link.h"

namespace corral::workers::link {
namespace {

template <typename T>
T decoded_as(std::string_view text) {
  auto m = decode(text);
  EXPECT_TRUE(m.ok()) << text << ": " << (m.ok() ? "" : m.error().reason);
  if (!m.ok()) return T{};
  const T* t = std::get_if<T>(&m.value());
  EXPECT_NE(t, nullptr) << text;
  return t ? *t : T{};
}

TEST(LinkCodec, EncodesEachMessageAsTheProtocolSays) {
  EXPECT_EQ(encode(Resolve{1, "doc:42"}), R"({"address":"doc:42","id":1,"type":"resolve"})");
  EXPECT_EQ(encode(Resolved{2, "/s/doc%3A42.sock"}),
            R"({"id":2,"socket":"/s/doc%3A42.sock","type":"resolved"})");
  EXPECT_EQ(encode(Resolved{2, "/s.sock", 4242, true}),
            R"({"cold":true,"id":2,"pid":4242,"socket":"/s.sock","type":"resolved"})");
  EXPECT_EQ(encode(Refused{3, 503, {{"message", "busy"}}, 2}),
            R"({"error":{"message":"busy"},"id":3,"retryAfter":2,"status":503,"type":"refused"})");
  EXPECT_EQ(encode(Refused{3, 404, {{"message", "no"}}, 0}),
            R"({"error":{"message":"no"},"id":3,"status":404,"type":"refused"})");
  EXPECT_EQ(encode(Forget{"doc:42"}), R"({"address":"doc:42","type":"forget"})");
  EXPECT_EQ(encode(Report{{{"proxy", {{"requests", 1}}}}}),
            R"({"proxy":{"requests":1},"type":"report"})");
}

TEST(LinkCodec, AddressesTravelInTheirWireFormAndComeBackAsBytes) {
  std::string bytes = std::string("doc:a%b\xff", 8) + std::string(1, '\0') + "\n";
  std::string text = encode(Forget{bytes});
  EXPECT_EQ(text, R"({"address":"doc:a%25b%FF%00%0A","type":"forget"})");
  EXPECT_EQ(decoded_as<Forget>(text).address, bytes);
  auto r = decoded_as<Resolve>(encode(Resolve{5, bytes}));
  EXPECT_EQ(r.id, 5u);
  EXPECT_EQ(r.address, bytes);
}

TEST(LinkCodec, DecodesWhatTheOtherEndSends) {
  auto resolved = decoded_as<Resolved>(R"({"type":"resolved","id":7,"socket":"/x.sock"})");
  EXPECT_EQ(resolved.id, 7u);
  EXPECT_EQ(resolved.socket, "/x.sock");
  EXPECT_EQ(resolved.pid, 0);
  EXPECT_FALSE(resolved.cold);
  resolved =
      decoded_as<Resolved>(R"({"type":"resolved","id":7,"socket":"/x","pid":9,"cold":true})");
  EXPECT_EQ(resolved.pid, 9);
  EXPECT_TRUE(resolved.cold);
  // What only describes the worker is lenient: the answer still goes to its request.
  resolved = decoded_as<Resolved>(R"({"type":"resolved","id":7,"socket":"/x","pid":-1,"cold":1})");
  EXPECT_EQ(resolved.pid, 0);
  EXPECT_FALSE(resolved.cold);
  auto refused = decoded_as<Refused>(
      R"({"type":"refused","id":8,"status":429,"error":{"message":"m","code":"c"},"retryAfter":3})");
  EXPECT_EQ(refused.id, 8u);
  EXPECT_EQ(refused.status, 429);
  EXPECT_EQ(refused.error, (nlohmann::json{{"message", "m"}, {"code", "c"}}));
  EXPECT_EQ(refused.retry_after_s, 3u);
  auto report = decoded_as<Report>(R"({"type":"report","quic":{"a":1}})");
  EXPECT_EQ(report.fields, (nlohmann::json{{"quic", {{"a", 1}}}}));
}

TEST(LinkCodec, ARefusalsShapeIsLenientSoTheWaitingRequestIsAnswered) {
  for (const char* text :
       {R"({"type":"refused","id":1})",
        R"({"type":"refused","id":1,"status":"500","error":"x","retryAfter":-4})",
        R"({"type":"refused","id":1,"status":200,"retryAfter":1.5})",
        R"({"type":"refused","id":1,"status":99999999999})"}) {
    auto r = decoded_as<Refused>(text);
    EXPECT_EQ(r.status, 503) << text;
    EXPECT_TRUE(r.error.is_null()) << text;
    EXPECT_EQ(r.retry_after_s, 0u) << text;
  }
  EXPECT_EQ(
      decoded_as<Refused>(R"({"type":"refused","id":1,"retryAfter":99999999999})").retry_after_s,
      86'400u);
}

TEST(LinkCodec, AResolveWithoutAWireFormAddressStillDecodesToBeAnswered) {
  EXPECT_EQ(decoded_as<Resolve>(R"({"type":"resolve","id":4,"address":"doc:%zz"})").address,
            std::nullopt);
  EXPECT_EQ(decoded_as<Resolve>(R"({"type":"resolve","id":4})").address, std::nullopt);
  EXPECT_EQ(decoded_as<Resolve>(R"({"type":"resolve","id":4})").id, 4u);
}

TEST(LinkCodec, WhatIsNotAMessageIsAnErrorValue) {
  std::string deep(40, '[');
  for (std::string text :
       {std::string(""), std::string("not json"), std::string("[1]"), std::string("{}"),
        std::string(R"({"type":7})"), std::string(R"({"type":"nope","id":1})"),
        std::string(R"({"type":"resolve","address":"doc:1"})"),
        std::string(R"({"type":"resolve","id":0,"address":"doc:1"})"),
        std::string(R"({"type":"resolve","id":-1,"address":"doc:1"})"),
        std::string(R"({"type":"resolve","id":"1","address":"doc:1"})"),
        std::string(R"({"type":"resolved","id":1})"),
        std::string(R"({"type":"resolved","id":1,"socket":""})"),
        std::string(R"({"type":"forget"})"), std::string(R"({"type":"forget","address":"%"})"),
        std::string(R"({"type":"forget","address":1})"), std::string("{\"type\":\"forget\xff\"}"),
        R"({"type":"report","x":)" + deep + std::string(40, ']') + "}",
        R"({"type":"report","x":")" + std::string(core::MessageLink::kMaxMessage, 'a') + "\"}"}) {
    auto m = decode(text);
    EXPECT_FALSE(m.ok()) << text.substr(0, 80);
    if (!m.ok()) {
      EXPECT_EQ(m.error().code, EINVAL);
    }
  }
  // Brackets inside strings are not nesting.
  EXPECT_TRUE(decode(R"({"type":"report","x":")" + deep + R"(\"[["})").ok());
}

TEST(LinkCodec, EncodeNeverThrowsOnTextThatIsNotUtf8) {
  std::string text = encode(Resolved{1, "/s/\xff.sock"});
  EXPECT_EQ(decoded_as<Resolved>(text).socket, "/s/\xEF\xBF\xBD.sock");  // U+FFFD
  text = encode(Refused{1, 503, {{"message", "\xc3"}}, 0});
  EXPECT_EQ(decoded_as<Refused>(text).error["message"], "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace corral::workers::link
