#include "worker/control.h"

#include <gtest/gtest.h>

namespace corral::worker {
namespace {

TEST(ControlCodec, ParsesStart) {
  auto m = parse_manager_message(
      R"({"type":"start","address":"doc:42","start":{"n":1},"scripts":["a.js"],"lock":"/s/l"})");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->type, ManagerMessageType::kStart);
  EXPECT_EQ(m->start.address, "doc:42");
  EXPECT_EQ(m->start.start, (nlohmann::json{{"n", 1}}));
  EXPECT_EQ(m->start.scripts, nlohmann::json::array({"a.js"}));
  EXPECT_EQ(m->start.lock, "/s/l");
}

TEST(ControlCodec, StartDefaults) {
  auto m = parse_manager_message(R"({"type":"start","lock":"/l"})");
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->start.start.is_null());
  EXPECT_TRUE(m->start.scripts.is_array());
  EXPECT_TRUE(m->start.scripts.empty());
  EXPECT_EQ(m->start.address, "");
}

TEST(ControlCodec, ParsesShutdownAndIgnoresUnknown) {
  auto s = parse_manager_message(R"({"type":"shutdown"})");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->type, ManagerMessageType::kShutdown);
  auto u = parse_manager_message(R"({"type":"suspend","extra":[1,2]})");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->type, ManagerMessageType::kUnknown);
  EXPECT_EQ(u->type_name, "suspend");
}

TEST(ControlCodec, RefusesMalformed) {
  for (const char* bad :
       {"", "{", "[]", "42", R"({"kind":"start"})", R"({"type":7})", R"({"type":"start"})",
        R"({"type":"start","lock":""})", R"({"type":"start","lock":"/l","scripts":{}})",
        R"({"type":"start","lock":"/l","address":3})"}) {
    auto m = parse_manager_message(bad);
    EXPECT_FALSE(m) << bad;
  }
}

TEST(ControlCodec, EncodesWorkerMessages) {
  EXPECT_EQ(nlohmann::json::parse(encode_started()), (nlohmann::json{{"type", "started"}}));
  EXPECT_EQ(nlohmann::json::parse(encode_ready(true)),
            (nlohmann::json{{"type", "ready"}, {"idle", true}}));
  EXPECT_EQ(nlohmann::json::parse(encode_idle(false)),
            (nlohmann::json{{"type", "idle"}, {"idle", false}}));
}

TEST(ControlCodec, FatalLeavesOutEmptyFieldsAndSurvivesBadUtf8) {
  auto j = nlohmann::json::parse(encode_fatal({"internal error", "", ""}));
  EXPECT_EQ(j, (nlohmann::json{{"type", "fatal"}, {"error", {{"message", "internal error"}}}}));
  auto k = nlohmann::json::parse(encode_fatal({"bad \xff byte", "db_down", "timeout"}));
  EXPECT_EQ(k["error"]["code"], "db_down");
  EXPECT_EQ(k["error"]["reason"], "timeout");
  EXPECT_NE(k["error"]["message"].get<std::string>().find("bad"), std::string::npos);
}

}  // namespace
}  // namespace corral::worker
