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
  EXPECT_EQ(m->start.code.scripts, nlohmann::json::array({"a.js"}));
  EXPECT_EQ(m->start.lock, "/s/l");
  EXPECT_EQ(m->start.code.version, "");  // a kind without code
  EXPECT_EQ(m->start.code.dir, "");
}

TEST(ControlCodec, ParsesStartWithCode) {
  auto m = parse_manager_message(
      R"({"type":"start","lock":"/l","scripts":[{"path":"app.py","digest":"ab"}],)"
      R"("code":{"version":"v1","dir":"/s/code/versions/doc/v1"}})");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->start.code.version, "v1");
  EXPECT_EQ(m->start.code.dir, "/s/code/versions/doc/v1");
  EXPECT_EQ(m->start.code.scripts, nlohmann::json::parse(R"([{"path":"app.py","digest":"ab"}])"));
}

TEST(ControlCodec, ParsesReload) {
  auto m = parse_manager_message(R"({"type":"reload","id":7,"scripts":[{"path":"a","digest":"d"}],)"
                                 R"("code":{"version":"v2","dir":"/c/v2"}})");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->type, ManagerMessageType::kReload);
  EXPECT_EQ(m->reload.id, 7u);
  EXPECT_EQ(m->reload.code.version, "v2");
  EXPECT_EQ(m->reload.code.dir, "/c/v2");
  EXPECT_EQ(m->reload.code.scripts, nlohmann::json::parse(R"([{"path":"a","digest":"d"}])"));
  auto bare = parse_manager_message(R"({"type":"reload","id":1,"code":{"version":"v"}})");
  ASSERT_TRUE(bare);
  EXPECT_TRUE(bare->reload.code.scripts.is_array());
  EXPECT_EQ(bare->reload.code.dir, "");
}

TEST(ControlCodec, StartDefaults) {
  auto m = parse_manager_message(R"({"type":"start","lock":"/l"})");
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->start.start.is_null());
  EXPECT_TRUE(m->start.code.scripts.is_array());
  EXPECT_TRUE(m->start.code.scripts.empty());
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

TEST(ControlCodec, ParsesPing) {
  auto p = parse_manager_message(R"({"type":"ping","id":12})");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->type, ManagerMessageType::kPing);
  EXPECT_EQ(p->ping_id, 12u);
  for (const char* bad :
       {R"({"type":"ping"})", R"({"type":"ping","id":-1})", R"({"type":"ping","id":"1"})"})
    EXPECT_FALSE(parse_manager_message(bad)) << bad;
}

TEST(ControlCodec, RefusesMalformed) {
  for (const char* bad : {"",
                          "{",
                          "[]",
                          "42",
                          R"({"kind":"start"})",
                          R"({"type":7})",
                          R"({"type":"start"})",
                          R"({"type":"start","lock":""})",
                          R"({"type":"start","lock":"/l","scripts":{}})",
                          R"({"type":"start","lock":"/l","address":3})",
                          R"({"type":"start","lock":"/l","code":"v"})",
                          R"({"type":"start","lock":"/l","code":{"dir":"/d"}})",
                          R"({"type":"reload","code":{"version":"v"}})",
                          R"({"type":"reload","id":0,"code":{"version":"v"}})",
                          R"({"type":"reload","id":-1,"code":{"version":"v"}})",
                          R"({"type":"reload","id":"1","code":{"version":"v"}})",
                          R"({"type":"reload","id":1.5,"code":{"version":"v"}})",
                          R"({"type":"reload","id":1})",
                          R"({"type":"reload","id":1,"code":{"version":7}})",
                          R"({"type":"reload","id":1,"code":{"version":"v","dir":1}})",
                          R"({"type":"reload","id":1,"code":{"version":"v"},"scripts":"a"})"}) {
    auto m = parse_manager_message(bad);
    EXPECT_FALSE(m) << bad;
  }
}

TEST(ControlCodec, EncodesWorkerMessages) {
  EXPECT_EQ(nlohmann::json::parse(encode_started()), (nlohmann::json{{"type", "started"}}));
  EXPECT_EQ(nlohmann::json::parse(encode_ready(true, false, {})), (nlohmann::json{{"type", "ready"},
                                                                                  {"idle", true},
                                                                                  {"ping", true},
                                                                                  {"requests", 0},
                                                                                  {"upgraded", 0},
                                                                                  {"busy", 0}}));
  EXPECT_EQ(nlohmann::json::parse(encode_ready(false, true, {1, 2, 3})),
            (nlohmann::json{{"type", "ready"},
                            {"idle", false},
                            {"ping", true},
                            {"requests", 1},
                            {"upgraded", 2},
                            {"busy", 3},
                            {"reload", true}}));
  EXPECT_EQ(
      nlohmann::json::parse(encode_reloaded(7, "v2", {{"n", 1}})),
      (nlohmann::json{{"type", "reloaded"}, {"id", 7}, {"version", "v2"}, {"report", {{"n", 1}}}}));
  EXPECT_EQ(nlohmann::json::parse(encode_reloaded(1, "v", nullptr))["report"],
            nlohmann::json::object());
  EXPECT_EQ(nlohmann::json::parse(encode_reload_failed(3, "v", {"cannot", "no_reload", ""})),
            (nlohmann::json{{"type", "reloaded"},
                            {"id", 3},
                            {"version", "v"},
                            {"error", {{"message", "cannot"}, {"code", "no_reload"}}}}));
  EXPECT_EQ(nlohmann::json::parse(encode_idle(false, {4, 1, 0})),
            (nlohmann::json{
                {"type", "idle"}, {"idle", false}, {"requests", 4}, {"upgraded", 1}, {"busy", 0}}));
  EXPECT_EQ(nlohmann::json::parse(encode_idle(true, {})),
            (nlohmann::json{
                {"type", "idle"}, {"idle", true}, {"requests", 0}, {"upgraded", 0}, {"busy", 0}}));
  EXPECT_EQ(nlohmann::json::parse(encode_pong(7)), (nlohmann::json{{"type", "pong"}, {"id", 7}}));
}

TEST(ControlCodec, FatalLeavesOutEmptyFieldsAndSurvivesBadUtf8) {
  auto j = nlohmann::json::parse(encode_fatal({"internal error", "", ""}));
  EXPECT_EQ(j, (nlohmann::json{{"type", "fatal"}, {"error", {{"message", "internal error"}}}}));
  auto k = nlohmann::json::parse(encode_fatal({"bad \xff byte", "db_down", "timeout"}));
  EXPECT_EQ(k["error"]["code"], "db_down");
  EXPECT_EQ(k["error"]["reason"], "timeout");
  EXPECT_NE(k["error"]["message"].get<std::string>().find("bad"), std::string::npos);
}

TEST(ControlCodec, ParsesCodeManifest) {
  auto m = parse_manager_message(
      R"({"type":"reload","id":3,"code":{"version":"v","dir":"/d","manifest":"/d.json"}})");
  ASSERT_TRUE(m.ok()) << m.error().reason;
  EXPECT_EQ(m->reload.code.manifest, "/d.json");
  EXPECT_TRUE(m->reload.code.scripts.empty());
  EXPECT_FALSE(
      parse_manager_message(R"({"type":"reload","id":3,"code":{"version":"v","manifest":7}})")
          .ok());

  auto files =
      parse_code_manifest(R"({"version":"v","files":[{"path":"a.py","digest":"d"}]})", "v");
  ASSERT_TRUE(files.ok()) << files.error().reason;
  EXPECT_EQ(*files, nlohmann::json::parse(R"([{"path":"a.py","digest":"d"}])"));
  for (const char* bad :
       {R"(not json)", R"([])", R"({"version":"w","files":[]})", R"({"version":"v"})",
        R"({"version":"v","files":[{"digest":"d"}]})", R"({"version":"v","files":[7]})"}) {
    EXPECT_FALSE(parse_code_manifest(bad, "v").ok()) << bad;
  }
}

}  // namespace
}  // namespace corral::worker
