// The manager side of the control protocol (control_codec.h): bytes in, messages out, no socket.
#include "workers/control_codec.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace corral::workers::control {
namespace {

TEST(ControlCodec, DecodesEachWorkerMessageByItsType) {
  struct Case {
    const char* text;
    WorkerMessageType type;
  };
  for (const Case& c :
       {Case{R"({"type":"started"})", WorkerMessageType::started},
        Case{R"({"type":"ready","idle":true,"reload":true})", WorkerMessageType::ready},
        Case{R"({"type":"idle","idle":false})", WorkerMessageType::idle},
        Case{R"({"type":"fatal","error":{"message":"m"}})", WorkerMessageType::fatal},
        Case{R"({"type":"reloaded","id":1})", WorkerMessageType::reloaded},
        Case{R"({"type":"pong","id":3})", WorkerMessageType::pong},
        Case{R"({"type":"standby"})", WorkerMessageType::standby},
        Case{R"({"type":"later","x":1})", WorkerMessageType::unknown}}) {
    auto m = decode(c.text);
    ASSERT_TRUE(m.ok()) << c.text;
    EXPECT_EQ(m->type, c.type) << c.text;
    EXPECT_EQ(m->body, nlohmann::json::parse(c.text));
  }
  EXPECT_EQ(decode(R"({"type":"later"})")->type_name, "later");
}

TEST(ControlCodec, AnythingButAnObjectWithAStringTypeIsAnError) {
  for (const std::string& text : std::vector<std::string>{
           "", "null", "[]", "\"ready\"", "{}", R"({"type":1})", R"({"type":null})",
           "{\"type\":\"ready\"", "\xff\xfe", std::string(100'000, '[')}) {
    auto m = decode(text);
    ASSERT_FALSE(m.ok()) << text.substr(0, 40);
    EXPECT_EQ(m.error().reason, "not a JSON message");
  }
}

TEST(ControlCodec, TheManagersMessages) {
  CodeSet set;
  set.version = std::string(64, 'b');
  set.dir = "/s/code/b";
  set.manifest = "/s/code/b.json";
  EXPECT_EQ(start("doc:1", {{"k", 1}}, "/s/locks/doc%3A1.lock", &set),
            (nlohmann::json{{"type", "start"},
                            {"address", "doc:1"},
                            {"start", {{"k", 1}}},
                            {"lock", "/s/locks/doc%3A1.lock"},
                            {"code", set.code_json()}}));
  EXPECT_FALSE(start("doc:1", nullptr, "l", nullptr).contains("code"));
  EXPECT_EQ(encode(shutdown()).value(), R"({"type":"shutdown"})");
  EXPECT_EQ(reload(7, set)["id"], 7);
  EXPECT_EQ(reload(7, set)["code"]["version"], set.version);
  EXPECT_EQ(encode(ping(3)).value(), R"({"id":3,"type":"ping"})");
}

TEST(ControlCodec, AMessageThatCannotBeWrittenIsAnErrorNotAThrow) {
  auto text = encode(start("doc:1", {{"k", "\xff"}}, "l", nullptr));
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.error().code, EINVAL);
}

}  // namespace
}  // namespace corral::workers::control
