// The manager's warm spares (issue 14, manager_spares.cc) against real children:
// tests/workers/fake_worker.py launched without an address sends `standby` and learns its address
// from `start`. The fixture's launcher counts every launch and records its address ("" for a
// spare), so "no fork at the first request" is checked by what was launched, not by timing.
#include "workers/manager.h"

#include <dirent.h>
#include <signal.h>

#include "workers/manager_test_support.h"

namespace corral::workers {
namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class SparesTest : public manager_testing::ManagerTest {
 protected:
  void SetUp() override {
    ManagerTest::SetUp();
    kind_.spares = 2;
  }

  // The spares' entries: {key: {kind, status, pid, ...}}.
  std::vector<nlohmann::json> spares(Manager& m) {
    std::vector<nlohmann::json> out;
    nlohmann::json state = m.spares_state();  // items() borrows it
    for (auto& [key, e] : state.items()) out.push_back(e);
    return out;
  }
  size_t standby(Manager& m, const std::string& kind = "doc") {
    size_t n = 0;
    for (auto& e : spares(m)) n += e["kind"] == kind && e["status"] == "standby";
    return n;
  }
  std::set<int> spare_pids(Manager& m) {
    std::set<int> out;
    for (auto& e : spares(m)) out.insert(e["pid"].get<int>());
    return out;
  }
  int pid_of(Manager& m, const std::string& address) { return m.entry(address).value("pid", 0); }
  // What the worker answers on its socket: "hello <address>\n" (or with its version).
  std::string served(const std::string& socket_path) {
    auto fd = core::connect_unix(socket_path);
    if (!fd.ok()) return "connect failed: " + fd.error().reason;
    std::string got;
    char buf[256];
    pollfd p{fd->get(), POLLIN, 0};
    while (::poll(&p, 1, 5'000) > 0) {
      ssize_t n = ::read(fd->get(), buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  size_t launched_for(const std::string& address) {
    return static_cast<size_t>(std::count(launched_.begin(), launched_.end(), address));
  }
  std::vector<std::string> spare_sockets() {
    std::vector<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(state_ + "/sockets"))
      if (e.path().filename().string().rfind(".spare-", 0) == 0) out.push_back(e.path());
    return out;
  }
};

TEST_F(SparesTest, TheFirstRequestBindsASpareWhichIsReplacedAndServesTheAddress) {
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 2; }));
  EXPECT_EQ(forks_, 2);
  EXPECT_EQ(launched_, (std::vector<std::string>{"", ""}));  // launched without an address
  EXPECT_EQ(m.live_workers(), 2u);
  std::set<int> before = spare_pids(m);
  EXPECT_EQ(spare_sockets().size(), 2u);

  auto r = resolve(m, "doc:1");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  int pid = pid_of(m, "doc:1");
  EXPECT_TRUE(before.count(pid)) << pid;  // a spare, not a fork
  EXPECT_EQ(launched_for("doc:1"), 0u);
  EXPECT_EQ(status(m, "doc:1"), "running");
  // The spare's socket, renamed to the address's: the bound worker answers there, as doc:1.
  EXPECT_EQ(r.socket_path, state_ + "/sockets/doc%3A1");
  EXPECT_EQ(served(r.socket_path), "hello doc:1\n");
  // Replaced at once: two spares again, the new one launched after the bind.
  ASSERT_TRUE(run_until([&] { return standby(m) == 2; }));
  EXPECT_EQ(forks_, 3);
  EXPECT_EQ(spare_pids(m).count(pid), 0u);
  EXPECT_EQ(m.live_workers(), 3u);
  EXPECT_EQ(spare_sockets().size(), 2u);
  EXPECT_NE(supervisor_log().find("worker_spare_bound address=\"doc:1\""), std::string::npos);
  // The kind's state counts them; GET /workers lists them under keys that are not addresses.
  EXPECT_EQ(m.kinds_state()["doc"]["spares"], 2);
  nlohmann::json state = m.spares_state();
  for (auto& [key, e] : state.items()) {
    EXPECT_EQ(key.rfind("spare/doc/", 0), 0u) << key;
    EXPECT_EQ(key.find(':'), std::string::npos) << key;
  }
  EXPECT_FALSE(m.state().contains("spare/doc/1"));  // state() stays the addresses'
}

TEST_F(SparesTest, ASpareThatHasNotSentStandbyIsBoundToo) {
  kind_.env["FAKE_WORKER_STANDBY"] = "0";  // a library without `standby`
  kind_.spares = 1;
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return spares(m).size() == 1; }));
  int spare = *spare_pids(m).begin();
  EXPECT_EQ(spares(m)[0]["status"], "warming");
  auto r = resolve(m, "doc:7");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  EXPECT_EQ(pid_of(m, "doc:7"), spare);
  EXPECT_EQ(served(r.socket_path), "hello doc:7\n");
}

TEST_F(SparesTest, StartBoundsHoldForBindsToo) {
  options_.max_starting = 1;
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 2; }));
  std::set<int> before = spare_pids(m);
  std::optional<Resolution> r1, r2;
  m.resolve("doc:1", [&](const Resolution& r) { r1 = r; });
  m.resolve("doc:2", [&](const Resolution& r) { r2 = r; });
  // One start place: doc:2 waits (queued) for doc:1's `ready`, then binds the other spare.
  EXPECT_EQ(m.starting_workers(), 1u);
  EXPECT_EQ(status(m, "doc:2"), "queued");
  ASSERT_TRUE(run_until([&] { return r1 && r2; }));
  ASSERT_TRUE(r1->ok() && r2->ok());
  EXPECT_TRUE(before.count(pid_of(m, "doc:1")));
  EXPECT_TRUE(before.count(pid_of(m, "doc:2")));
  EXPECT_LT(event_time(pid_of(m, "doc:1"), "ready"), event_time(pid_of(m, "doc:2"), "started"));
  EXPECT_EQ(launched_for("doc:1") + launched_for("doc:2"), 0u);
  ASSERT_TRUE(run_until([&] { return standby(m) == 2; }));  // both replaced
}

TEST_F(SparesTest, NoSpareWhileRealWorkersFillTheBoundAndSparesGoFirstForRoom) {
  options_.max_workers = 2;
  kind_.spares = 1;
  KindConfig other = kind_;
  other.name = "other";
  other.routes = {"/other/{id}/*"};
  other.spares = 0;
  options_.kinds = {other};
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 1; }));
  ASSERT_TRUE(resolve(m, "doc:1").ok());  // binds it; the refill takes the last place
  ASSERT_TRUE(run_until([&] { return standby(m) == 1; }));
  EXPECT_EQ(m.live_workers(), 2u);
  int doc1 = pid_of(m, "doc:1");
  // other:1 needs room: the spare goes, not doc:1 (an idle worker, which would be evicted).
  auto r = resolve(m, "other:1");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  EXPECT_EQ(pid_of(m, "doc:1"), doc1);
  EXPECT_EQ(status(m, "doc:1"), "running");
  EXPECT_NE(supervisor_log().find("worker_spare_stopping kind=doc"), std::string::npos);
  EXPECT_NE(supervisor_log().find("reason=room"), std::string::npos);
  EXPECT_EQ(supervisor_log().find("worker_evicted"), std::string::npos);
  // Both places hold real workers now: no spare comes back.
  run_for(300);
  EXPECT_EQ(spares(m).size(), 0u);
  EXPECT_EQ(m.live_workers(), 2u);
  // One of them goes: the spare is back.
  ASSERT_TRUE(m.stop("other:1"));
  ASSERT_TRUE(run_until([&] { return standby(m) == 1; }));
  EXPECT_EQ(m.live_workers(), 2u);
}

TEST_F(SparesTest, AKindFullOfItsOwnWorkersKeepsNoSpare) {
  kind_.max_workers = 1;
  kind_.spares = 1;
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 1; }));
  ASSERT_TRUE(resolve(m, "doc:1").ok());
  run_for(300);
  EXPECT_EQ(spares(m).size(), 0u);
  EXPECT_EQ(forks_, 1);
}

TEST_F(SparesTest, ACrashingSpareCommandBacksOff) {
  kind_.command = {"/bin/sh", "-c", "echo spare dies >&2; exit 3"};
  kind_.spares = 1;
  Manager& m = make();
  run_for(1'000);
  // Launches at about 0, 100, 300, 700 ms (100 ms doubling): a handful, not a fork loop.
  EXPECT_GE(forks_, 2);
  EXPECT_LE(forks_, 6);
  std::string log = supervisor_log();
  EXPECT_NE(log.find("worker_spare_exited kind=doc"), std::string::npos);
  EXPECT_NE(log.find("asked=false"), std::string::npos);
  EXPECT_NE(log.find("backoff_ms=200"), std::string::npos);
  EXPECT_NE(log.find("spare dies"), std::string::npos);  // its stderr, in the log line
  EXPECT_NE(manager_testing::read_file(state_ + "/logs/doc.log").find("] spare dies"),
            std::string::npos);
  EXPECT_EQ(m.state(), nlohmann::json::object());  // no address is failed by it
}

TEST_F(SparesTest, CloseStopsTheSpares) {
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 2; }));
  bool done = false;
  m.close([&] { done = true; });
  ASSERT_TRUE(run_until([&] { return done; }));
  EXPECT_EQ(m.live_workers(), 0u);
  EXPECT_EQ(m.spare_count(), 0u);
  EXPECT_TRUE(spare_sockets().empty());
  run_for(200);
  EXPECT_EQ(forks_, 2);  // no refill after close
}

TEST_F(SparesTest, ABoundSpareRunsTheKindsCurrentSet) {
  auto set = [this](char v) {
    CodeSet s;
    s.version = std::string(64, v);
    s.dir = state_ + "/code/versions/doc/" + s.version;
    s.files.push_back({"app.py", std::string(64, '0')});
    return s;
  };
  kind_.code = set('a');
  kind_.spares = 1;
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 1; }));
  int spare = *spare_pids(m).begin();
  std::optional<RolloutReport> report;
  ASSERT_TRUE(m.rollout("doc", set('b'), [&](const RolloutReport& r) { report = r; }));
  ASSERT_TRUE(run_until([&] { return report.has_value(); }));
  EXPECT_TRUE(report->workers.empty());  // a spare runs no set: nothing to bring
  EXPECT_EQ(*spare_pids(m).begin(), spare);
  auto r = resolve(m, "doc:1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(pid_of(m, "doc:1"), spare);
  EXPECT_EQ(m.entry("doc:1")["version"], std::string(64, 'b'));
  EXPECT_EQ(served(r.socket_path), "hello doc:1 version=" + std::string(64, 'b') + "\n");
}

TEST_F(SparesTest, ASpareKilledBeforeItsBindIsReplaced) {
  kind_.spares = 1;
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 1; }));
  int spare = *spare_pids(m).begin();
  ASSERT_EQ(kill(spare, SIGKILL), 0);
  ASSERT_TRUE(run_until([&] { return standby(m) == 1 && !spare_pids(m).count(spare); }));
  EXPECT_EQ(forks_, 2);
  EXPECT_EQ(spare_sockets().size(), 1u);
  ASSERT_TRUE(resolve(m, "doc:1").ok());
}

// A spare that dies after its bind and before `started` (here: the first spare to read `start`
// exits) never ran anything of the address: the start is made again, and served.
TEST_F(SparesTest, ASpareThatDiesWhileBeingBoundIsNoFailureTheStartIsMadeAgain) {
  kind_.spares = 1;
  kind_.env["FAKE_WORKER_SPARE_DIES"] = state_ + "/spare-died";
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 1; }));
  int spare = *spare_pids(m).begin();
  auto r = resolve(m, "doc:1");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  EXPECT_TRUE(std::filesystem::exists(state_ + "/spare-died"));  // the bound spare did die
  EXPECT_NE(pid_of(m, "doc:1"), spare);
  EXPECT_EQ(status(m, "doc:1"), "running");
  EXPECT_EQ(served(r.socket_path), "hello doc:1\n");
  EXPECT_NE(supervisor_log().find("worker_spare_lost address=\"doc:1\""), std::string::npos);
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
}

// Once only: a start of the address that dies before `started` again fails it as any crash does
// (a command that dies at every `start` is not started for ever).
TEST_F(SparesTest, ASecondDeathBeforeStartedFailsTheAddress) {
  kind_.spares = 1;
  data_["doc:1"] = {{"mode", "exit_at_start"}};
  Manager& m = make();
  ASSERT_TRUE(run_until([&] { return standby(m) == 1; }));
  auto r = resolve(m, "doc:1");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error["code"], "worker_exited");
  EXPECT_EQ(status(m, "doc:1"), "failed");
  EXPECT_EQ(count_of(supervisor_log(), "worker_spare_lost address=\"doc:1\""), 1u);
}

}  // namespace
}  // namespace corral::workers
