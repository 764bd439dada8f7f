// The manager's heartbeat and "why alive" (issue 14) against tests/workers/fake_worker.py: a
// worker that stops answering pings is stopped as a lost link (and a second time within the
// recovery window fails the address), one whose `ready` did not say `ping: true` is never
// pinged, and a running worker's entry says what holds it. Short heartbeats in the kind's
// options; every wait is bounded.
#include <time.h>

#include "workers/manager.h"
#include "workers/manager_test_support.h"

namespace corral::workers {
namespace {

using manager_testing::ManagerTest;

time_t parse_iso(const nlohmann::json& j) {
  if (!j.is_string()) return -1;
  tm t{};
  if (!strptime(j.get<std::string>().c_str(), "%Y-%m-%dT%H:%M:%SZ", &t)) return -1;
  return timegm(&t);
}

class HeartbeatTest : public ManagerTest {
 protected:
  int pid_of(Manager& m, const std::string& address) {
    auto e = m.entry(address);
    return e.is_object() && e.contains("pid") ? e["pid"].get<int>() : 0;
  }
  // How many events of `pid` start with `prefix` ("ping:", "pong:").
  size_t count_events(int pid, const std::string& prefix) {
    size_t n = 0;
    for (auto& [t, p, e] : events()) n += p == pid && e.rfind(prefix, 0) == 0;
    return n;
  }
};

TEST_F(HeartbeatTest, AWorkerThatStopsAnsweringPingsIsStoppedAsALostLink) {
  kind_.heartbeat_ms = 100;
  kind_.stop_grace_ms = 300;
  data_["doc:h"] = {{"ping", true}, {"pongs", 2}};  // answers two pings, then no more
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:h").ok());
  int pid = pid_of(m, "doc:h");
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(gone(m, "doc:h"));
  EXPECT_EQ(count_events(pid, "pong:"), 2u);
  EXPECT_EQ(count_events(pid, "ping:"), 3u);  // the third one was never answered
  std::string log = supervisor_log();
  auto unresponsive = log.find("worker_unresponsive address=\"doc:h\" pid=" + std::to_string(pid));
  ASSERT_NE(unresponsive, std::string::npos) << log;
  EXPECT_NE(log.find("ping=3 waited_ms=", unresponsive), std::string::npos) << log;
  // Then the lost-link path: the lost-link line, a stop, no failure.
  auto lost = log.find("worker_link_lost address=\"doc:h\"", unresponsive);
  ASSERT_NE(lost, std::string::npos) << log;
  EXPECT_NE(log.find("reason=unresponsive", lost), std::string::npos) << log;
  EXPECT_EQ(log.find("worker_failed"), std::string::npos) << log;

  // The next resolve starts a new worker; a second unresponsive one within the recovery window
  // fails the address, as a second lost link does.
  data_["doc:h"] = {{"ping", true}, {"pongs", 0}};
  EXPECT_TRUE(resolve(m, "doc:h").ok());
  EXPECT_EQ(forks_, 2);
  ASSERT_TRUE(run_until([&] { return status(m, "doc:h") == "failed"; }));
  EXPECT_EQ(m.entry("doc:h")["error"]["code"], "unresponsive");
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
  EXPECT_EQ(resolve(m, "doc:h").error["code"], "unresponsive");
  EXPECT_EQ(forks_, 2);
}

TEST_F(HeartbeatTest, OnlyAWorkerWhoseReadySaidPingIsPinged) {
  kind_.heartbeat_ms = 50;
  data_["doc:p"] = {{"ping", true}};
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:n").ok());  // its `ready` says nothing of pings
  ASSERT_TRUE(resolve(m, "doc:p").ok());
  int quiet = pid_of(m, "doc:n"), pinged = pid_of(m, "doc:p");
  // doc:n had as long as doc:p to be pinged four times.
  ASSERT_TRUE(run_until([&] { return count_events(pinged, "pong:") >= 4; }));
  EXPECT_EQ(count_events(quiet, "ping:"), 0u);
  EXPECT_EQ(status(m, "doc:n"), "running");
  EXPECT_EQ(status(m, "doc:p"), "running");
  EXPECT_EQ(supervisor_log().find("worker_unresponsive"), std::string::npos);
}

TEST_F(HeartbeatTest, AHeartbeatOfZeroNeverPings) {
  kind_.heartbeat_ms = 0;
  data_["doc:z"] = {{"ping", true}, {"pongs", 0}};
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:z").ok());
  ASSERT_TRUE(resolve(m, "doc:zz").ok());
  // A round trip on doc:zz's link later, doc:z has still had no ping (and never would: no timer).
  ASSERT_TRUE(m.stop("doc:zz"));
  EXPECT_TRUE(run_until([&] { return m.entry("doc:zz").is_null(); }));
  EXPECT_EQ(count_events(pid_of(m, "doc:z"), "ping:"), 0u);
  EXPECT_EQ(status(m, "doc:z"), "running");
}

TEST_F(HeartbeatTest, ARunningWorkersEntrySaysWhatHoldsIt) {
  kind_.idle_ms = 120'000;
  data_["doc:w"] = {{"idle", false},
                    {"counts", {{"requests", 2}, {"upgraded", 1}, {"busy", 3}}},
                    {"idle_after", 200}};
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:w").ok());
  auto e = m.entry("doc:w");
  EXPECT_EQ(e["holds"], nlohmann::json({{"requests", 2}, {"upgraded", 1}, {"busy", 3}})) << e;
  EXPECT_TRUE(e.contains("idle_since") && e["idle_since"].is_null()) << e;
  EXPECT_TRUE(e.contains("idle_stop_at") && e["idle_stop_at"].is_null()) << e;

  // Its idle flip: zero counts, and the idle stop idle_ms after it went idle.
  ASSERT_TRUE(run_until([&] { return m.entry("doc:w")["idle_since"].is_string(); }));
  e = m.entry("doc:w");
  EXPECT_EQ(e["holds"], nlohmann::json({{"requests", 0}, {"upgraded", 0}, {"busy", 0}})) << e;
  time_t since = parse_iso(e["idle_since"]), stop_at = parse_iso(e["idle_stop_at"]);
  ASSERT_GT(since, 0) << e;
  EXPECT_EQ(stop_at - since, 120) << e;
  EXPECT_LE(std::abs(since - time(nullptr)), 5) << e;
  EXPECT_FALSE(e.contains("idle_stop_delayed")) << e;
  // The flip is a change the watchers see.
  ASSERT_FALSE(changes_.empty());
  EXPECT_EQ(changes_.back().first, "doc:w");
  EXPECT_EQ(changes_.back().second, e);

  // A worker that sends no counts has no holds; its idle times are there all the same.
  ASSERT_TRUE(resolve(m, "doc:o").ok());
  e = m.entry("doc:o");
  EXPECT_FALSE(e.contains("holds")) << e;
  EXPECT_TRUE(e["idle_since"].is_string()) << e;
  EXPECT_EQ(parse_iso(e["idle_stop_at"]) - parse_iso(e["idle_since"]), 120) << e;
  // Stopping: neither.
  ASSERT_TRUE(m.stop("doc:o"));
  e = m.entry("doc:o");
  if (e.is_object()) {
    EXPECT_FALSE(e.contains("idle_stop_at")) << e;
  }
}

}  // namespace
}  // namespace corral::workers
