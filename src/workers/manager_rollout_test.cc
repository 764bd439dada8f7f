// The manager's rollout step (Manager::rollout, issue 13) against real children:
// tests/workers/fake_worker.py answers `reload` as the file names of the set say (reload-fails,
// reload-crashes, reload-delay-<ms>, ...) and names the version it runs in every answer on its
// socket. Sets are made up here (the manager never reads their files); timeouts are short and every
// wait is bounded.
#include "workers/manager.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include "workers/manager_test_support.h"

namespace corral::workers {
namespace {

class RolloutTest : public manager_testing::ManagerTest {
 protected:
  void SetUp() override {
    ManagerTest::SetUp();
    kind_.code = set('a');
  }

  // A set whose version is 64 times `v` (a hex digit), with the files `names` (their digests
  // made up too), and its manifest, which the messages refer to (code.manifest).
  CodeSet set(char v, std::vector<std::string> names = {"app.py"}) {
    CodeSet s;
    s.version = std::string(64, v);
    s.dir = state_ + "/code/versions/doc/" + s.version;
    s.manifest = s.dir + ".json";
    std::sort(names.begin(), names.end());
    for (auto& n : names) s.files.push_back({n, std::string(64, '0')});
    std::filesystem::create_directories(state_ + "/code/versions/doc");
    std::ofstream(s.manifest) << nlohmann::json{{"version", s.version},
                                                {"files", s.scripts_json()}};
    return s;
  }
  static std::string ver(char v) { return std::string(64, v); }

  // rollout() and wait for its report.
  RolloutReport roll(Manager& m, CodeSet s, int timeout_ms = 10'000) {
    std::optional<RolloutReport> report;
    EXPECT_TRUE(m.rollout("doc", std::move(s), [&](const RolloutReport& r) { report = r; }));
    EXPECT_TRUE(run_until([&] { return report.has_value(); }, timeout_ms));
    return report.value_or(RolloutReport{});
  }
  // The report's entry for `address`; null if none.
  static nlohmann::json entry_for(const RolloutReport& r, const std::string& address) {
    for (const auto& w : r.workers)
      if (w["address"] == address) return w;
    return nullptr;
  }
  std::string version_of(Manager& m, const std::string& address) {
    return m.entry(address).value("version", std::string());
  }
  int pid_of(Manager& m, const std::string& address) { return m.entry(address).value("pid", 0); }
  // What the worker answers on its socket: "hello <address> version=<version>\n".
  std::string served(Manager& m, const std::string& address) {
    auto r = resolve(m, address);
    if (!r.ok()) return "error " + r.error.dump();
    auto fd = core::connect_unix(r.socket_path);
    if (!fd.ok()) return "connect failed";
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
  double event_at(const std::string& name) {
    for (auto& [t, p, e] : events())
      if (e == name) return t;
    return -1;
  }
};

TEST_F(RolloutTest, InPlaceReachesEveryWorkerAndTheKindIsCleanAfter) {
  Manager& m = make();
  std::vector<std::string> addresses = {"doc:1", "doc:2", "doc:3"};
  std::map<std::string, int> pids;
  for (auto& a : addresses) {
    ASSERT_TRUE(resolve(m, a).ok()) << a;
    pids[a] = pid_of(m, a);
    EXPECT_EQ(version_of(m, a), ver('a'));  // the set its `start` carried
  }
  EXPECT_EQ(served(m, "doc:1"), "hello doc:1 version=" + ver('a') + "\n");
  auto ks = m.kinds_state()["doc"];
  EXPECT_EQ(ks["version"], ver('a'));
  EXPECT_EQ(ks["dirty"], false);
  EXPECT_EQ(ks["workers"], 3);
  EXPECT_EQ(ks["stale"], 0);
  EXPECT_EQ(ks["rolling"], false);

  std::optional<RolloutReport> report;
  ASSERT_TRUE(m.rollout("doc", set('b', {"app.py", "lib/util.py"}),
                        [&](const RolloutReport& r) { report = r; }));
  EXPECT_FALSE(report.has_value());  // deferred, even if it were done at once
  EXPECT_EQ(m.kinds_state()["doc"]["rolling"], true);
  EXPECT_EQ(m.kinds_state()["doc"]["version"], ver('b'));
  EXPECT_FALSE(m.rollout("doc", set('c'), [](const RolloutReport&) {}));  // one at a time
  EXPECT_FALSE(m.rollout("nope", set('c'), [](const RolloutReport&) {}));
  ASSERT_TRUE(run_until([&] { return report.has_value(); }));
  EXPECT_EQ(report->kind, "doc");
  EXPECT_EQ(report->version, ver('b'));
  EXPECT_EQ(report->previous, ver('a'));
  EXPECT_EQ(report->failed, 0u);
  EXPECT_TRUE(report->cleared.empty());
  ASSERT_EQ(report->workers.size(), 3u) << report->to_json().dump();
  for (auto& a : addresses) {
    auto e = entry_for(*report, a);
    ASSERT_TRUE(e.is_object()) << a;
    EXPECT_EQ(e["report"]["version"], ver('b')) << e.dump();
    EXPECT_EQ(e["report"]["files"], 2);
    EXPECT_EQ(e["report"]["pid"], pids[a]);  // the same process, reloaded
    EXPECT_EQ(pid_of(m, a), pids[a]);
    EXPECT_EQ(version_of(m, a), ver('b'));
  }
  EXPECT_EQ(served(m, "doc:2"), "hello doc:2 version=" + ver('b') + "\n");
  ks = m.kinds_state()["doc"];
  EXPECT_EQ(ks["dirty"], false);
  EXPECT_EQ(ks["stale"], 0);
  EXPECT_EQ(ks["rolling"], false);
  EXPECT_EQ(m.versions_in_use("doc"), (std::set<std::string>{ver('b')}));
  EXPECT_EQ(forks_, 3);
  std::string log = supervisor_log();
  EXPECT_NE(log.find("rollout_started kind=doc version=bbbbbbbbbbbb"), std::string::npos) << log;
  EXPECT_NE(log.find("worker_reloaded address=\"doc:1\" version=bbbbbbbbbbbb"), std::string::npos);
  EXPECT_NE(log.find("rollout_done kind=doc version=bbbbbbbbbbbb reloaded=3 restarted=0 stopped=0 "
                     "failed=0 took_ms="),
            std::string::npos)
      << log;
  // A new worker starts on the current set; a rollout to the set every worker runs has nothing
  // to do.
  ASSERT_TRUE(resolve(m, "doc:4").ok());
  EXPECT_EQ(version_of(m, "doc:4"), ver('b'));
  auto again = roll(m, set('b'));
  EXPECT_TRUE(again.workers.empty()) << again.to_json().dump();
}

// A set of thousands of files starts and reloads: the messages carry its manifest's path, not
// its file list (inline, 3,000 entries would be about 300 KiB, more than the control socket's
// buffer, and every start and reload would fail).
TEST_F(RolloutTest, ASetOfThousandsOfFilesStartsAndReloads) {
  std::vector<std::string> many;
  for (int i = 0; i < 3000; ++i) many.push_back("lib/module_" + std::to_string(i) + ".py");
  kind_.code = set('a', many);
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:1").ok());
  EXPECT_EQ(version_of(m, "doc:1"), ver('a'));
  many.push_back("app.py");
  auto r = roll(m, set('b', many));
  ASSERT_EQ(r.workers.size(), 1u) << r.to_json().dump();
  EXPECT_EQ(r.failed, 0u) << r.to_json().dump();
  EXPECT_EQ(r.workers[0]["report"]["files"], 3001) << r.to_json().dump();
  EXPECT_EQ(version_of(m, "doc:1"), ver('b'));
}

TEST_F(RolloutTest, AFailedReloadKeepsTheOldVersionAndTheKindDirtyUntilAGoodOne) {
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:1").ok());
  ASSERT_TRUE(resolve(m, "doc:2").ok());
  auto r = roll(m, set('b', {"app.py", "reload-fails"}));
  EXPECT_EQ(r.failed, 2u);
  ASSERT_EQ(r.workers.size(), 2u);
  auto e = entry_for(r, "doc:1");
  EXPECT_EQ(e["error"], (nlohmann::json{{"message", "the reload failed"},
                                        {"code", "reload_failed"}}));  // no detail: redacted
  EXPECT_EQ(r.to_json().dump().find("SECRET"), std::string::npos);
  // Both keep serving, on the old version; the kind is dirty.
  EXPECT_EQ(status(m, "doc:1"), "running");
  EXPECT_EQ(version_of(m, "doc:1"), ver('a'));
  EXPECT_EQ(served(m, "doc:2"), "hello doc:2 version=" + ver('a') + "\n");
  auto ks = m.kinds_state()["doc"];
  EXPECT_EQ(ks["version"], ver('b'));
  EXPECT_EQ(ks["dirty"], true);
  EXPECT_EQ(ks["stale"], 2);
  EXPECT_EQ(m.versions_in_use("doc"), (std::set<std::string>{ver('a')}));
  EXPECT_NE(supervisor_log().find("worker_reload_failed address=\"doc:1\""), std::string::npos);
  // The next good rollout applies and clears it.
  auto good = roll(m, set('c'));
  EXPECT_EQ(good.failed, 0u);
  EXPECT_EQ(good.previous, ver('b'));
  EXPECT_EQ(good.workers.size(), 2u);
  EXPECT_EQ(version_of(m, "doc:1"), ver('c'));
  EXPECT_EQ(m.kinds_state()["doc"]["dirty"], false);
  EXPECT_EQ(forks_, 2);
}

TEST_F(RolloutTest, ReplacementKeepsRequestsWaitingAndStartsTheNewWorkerOnTheNewSet) {
  kind_.reload = KindConfig::Reload::restart;
  data_["doc:r"] = {{"exit_on_shutdown_slowly", 300}};  // a window for a request to come
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:r").ok());
  int old_pid = pid_of(m, "doc:r");
  std::optional<RolloutReport> report;
  ASSERT_TRUE(m.rollout("doc", set('b'), [&](const RolloutReport& r) { report = r; }));
  EXPECT_EQ(status(m, "doc:r"), "stopping");
  std::optional<Resolution> waited;
  m.resolve("doc:r", [&](const Resolution& r) { waited = r; });
  ASSERT_TRUE(run_until([&] { return report.has_value() && waited.has_value(); }));
  EXPECT_TRUE(waited->ok()) << waited->error.dump();  // never a 503
  EXPECT_EQ(waited->socket_path, state_ + "/sockets/doc%3Ar");
  auto e = entry_for(*report, "doc:r");
  EXPECT_EQ(e["report"], (nlohmann::json{{"restarted", true}})) << e.dump();
  EXPECT_EQ(report->failed, 0u);
  int new_pid = pid_of(m, "doc:r");
  EXPECT_NE(new_pid, old_pid);
  EXPECT_NE(::kill(old_pid, 0), 0);
  EXPECT_GT(event_time(new_pid, "started"), event_time(old_pid, "exiting"));
  EXPECT_EQ(version_of(m, "doc:r"), ver('b'));
  EXPECT_EQ(served(m, "doc:r"), "hello doc:r version=" + ver('b') + "\n");
  EXPECT_EQ(forks_, 2);
  std::string log = supervisor_log();
  EXPECT_NE(log.find("reason=rollout"), std::string::npos) << log;
  EXPECT_NE(log.find("restarted=1"), std::string::npos) << log;
  EXPECT_EQ(log.find("worker_failed"), std::string::npos);
  EXPECT_EQ(m.kinds_state()["doc"]["dirty"], false);
}

TEST_F(RolloutTest, AReplacementWithNobodyWaitingStartsAtOnce) {
  kind_.reload = KindConfig::Reload::restart;
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:r").ok());
  int old_pid = pid_of(m, "doc:r");
  auto r = roll(m, set('b'));
  EXPECT_EQ(entry_for(r, "doc:r")["report"]["restarted"], true);
  EXPECT_EQ(status(m, "doc:r"), "running");
  EXPECT_NE(pid_of(m, "doc:r"), old_pid);
  EXPECT_EQ(version_of(m, "doc:r"), ver('b'));
}

TEST_F(RolloutTest, AutomaticReloadsInPlaceWhatCanAndReplacesTheRest) {
  data_["doc:yes"] = nlohmann::json::object();
  data_["doc:no"] = {{"reload", false}};  // its `ready` declares no reload
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:yes").ok());
  ASSERT_TRUE(resolve(m, "doc:no").ok());
  int yes = pid_of(m, "doc:yes"), no = pid_of(m, "doc:no");
  auto r = roll(m, set('b'));
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(entry_for(r, "doc:yes")["report"]["pid"], yes);
  EXPECT_EQ(entry_for(r, "doc:no")["report"], (nlohmann::json{{"restarted", true}}));
  EXPECT_EQ(pid_of(m, "doc:yes"), yes);
  EXPECT_NE(pid_of(m, "doc:no"), no);
  EXPECT_EQ(version_of(m, "doc:yes"), ver('b'));
  EXPECT_EQ(version_of(m, "doc:no"), ver('b'));
  EXPECT_NE(supervisor_log().find("reloaded=1 restarted=1"), std::string::npos);
}

TEST_F(RolloutTest, InPlaceModeReloadsEvenAWorkerThatDeclaresNoHook) {
  kind_.reload = KindConfig::Reload::in_place;
  data_["doc:no"] = {{"reload", false}};
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:no").ok());
  int pid = pid_of(m, "doc:no");
  auto r = roll(m, set('b'));
  EXPECT_EQ(entry_for(r, "doc:no")["error"]["code"], "no_reload");
  EXPECT_EQ(pid_of(m, "doc:no"), pid);
  EXPECT_EQ(version_of(m, "doc:no"), ver('a'));
}

TEST_F(RolloutTest, ACrashDuringTheRolloutIsAnErrorAndTheAddressFails) {
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:c").ok());
  ASSERT_TRUE(resolve(m, "doc:ok").ok());
  auto r = roll(m, set('b', {"app.py", "reload-crashes"}));
  EXPECT_EQ(r.failed, 2u);
  EXPECT_EQ(entry_for(r, "doc:c")["error"]["code"], "worker_exited");
  EXPECT_EQ(status(m, "doc:c"), "failed");
  EXPECT_EQ(resolve(m, "doc:c").status, 503);
  EXPECT_NE(supervisor_log().find("worker_failed"), std::string::npos);
  // A failure during a rollout stays; the next rollout clears it and lists it.
  auto next = roll(m, set('c'));
  std::set<std::string> cleared(next.cleared.begin(), next.cleared.end());
  EXPECT_EQ(cleared, (std::set<std::string>{"doc:c", "doc:ok"}));
  EXPECT_TRUE(next.workers.empty());
  EXPECT_TRUE(m.entry("doc:c").is_null());
  ASSERT_TRUE(resolve(m, "doc:c").ok());
  EXPECT_EQ(version_of(m, "doc:c"), ver('c'));
}

TEST_F(RolloutTest, AnUnaskedCleanExitDuringTheReloadIsACrashToo) {
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:x").ok());
  auto r = roll(m, set('b', {"reload-exits"}));
  EXPECT_EQ(entry_for(r, "doc:x")["error"]["code"], "worker_exited");
  EXPECT_EQ(status(m, "doc:x"), "failed");
}

TEST_F(RolloutTest, ACleanStopDuringTheRolloutIsListedStopped) {
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:s").ok());
  ASSERT_TRUE(resolve(m, "doc:t").ok());
  std::optional<RolloutReport> report;
  ASSERT_TRUE(m.rollout("doc", set('b', {"reload-delay-3000"}),
                        [&](const RolloutReport& r) { report = r; }));
  EXPECT_TRUE(m.stop("doc:s"));
  EXPECT_TRUE(m.stop("doc:t"));
  ASSERT_TRUE(run_until([&] { return report.has_value(); }, 2'500));  // before the replies
  EXPECT_EQ(entry_for(*report, "doc:s"), (nlohmann::json{{"address", "doc:s"}, {"stopped", true}}));
  EXPECT_EQ(entry_for(*report, "doc:t")["stopped"], true);
  EXPECT_EQ(report->failed, 0u);
  EXPECT_TRUE(m.entry("doc:s").is_null());
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
  EXPECT_NE(supervisor_log().find("stopped=2 failed=0"), std::string::npos);
  // Its next start gets the new set.
  ASSERT_TRUE(resolve(m, "doc:s").ok());
  EXPECT_EQ(version_of(m, "doc:s"), ver('b'));
}

TEST_F(RolloutTest, AStopOfAReplacementCancelsItsStartAndIsListedStopped) {
  kind_.reload = KindConfig::Reload::restart;
  data_["doc:r"] = {{"exit_on_shutdown_slowly", 300}};
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:r").ok());
  std::optional<RolloutReport> report;
  ASSERT_TRUE(m.rollout("doc", set('b'), [&](const RolloutReport& r) { report = r; }));
  EXPECT_TRUE(m.stop("doc:r"));  // the queued start behind the rollout's stop is cancelled
  ASSERT_TRUE(run_until([&] { return report.has_value(); }));
  EXPECT_EQ(entry_for(*report, "doc:r")["stopped"], true);
  EXPECT_TRUE(gone(m, "doc:r"));
  EXPECT_EQ(forks_, 1);
}

TEST_F(RolloutTest, AWorkerStartingDuringTheRolloutEndsOnTheNewVersion) {
  kind_.reload = KindConfig::Reload::in_place;
  data_["doc:s"] = {{"slow_ready", 500}};
  Manager& m = make();
  std::optional<Resolution> first;
  m.resolve("doc:s", [&](const Resolution& r) { first = r; });
  ASSERT_EQ(forks_, 1);  // forked before the call, on the old set
  EXPECT_EQ(status(m, "doc:s"), "starting");
  EXPECT_EQ(version_of(m, "doc:s"), ver('a'));
  // The reload goes at once; the child applies it after its `ready`.
  auto r = roll(m, set('b'));
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->ok());
  EXPECT_EQ(entry_for(r, "doc:s")["report"]["version"], ver('b')) << r.to_json().dump();
  EXPECT_EQ(version_of(m, "doc:s"), ver('b'));
  // The child records its reply after sending it: wait for the record, not for the clock.
  ASSERT_TRUE(run_until([&] { return event_at("reload_replied:1") > 0; }));
  EXPECT_GT(event_at("reload_replied:1"), event_at("ready"));
  EXPECT_EQ(forks_, 1);
}

TEST_F(RolloutTest, AutomaticDecidesAtReadyForAWorkerStartingDuringTheRollout) {
  data_["doc:yes"] = {{"slow_ready", 400}};
  data_["doc:no"] = {{"slow_ready", 400}, {"reload", false}};
  Manager& m = make();
  std::vector<Resolution> answers;
  m.resolve("doc:yes", [&](const Resolution& r) { answers.push_back(r); });
  m.resolve("doc:no", [&](const Resolution& r) { answers.push_back(r); });
  ASSERT_EQ(forks_, 2);
  auto r = roll(m, set('b'));
  ASSERT_EQ(answers.size(), 2u);
  for (auto& a : answers) EXPECT_TRUE(a.ok()) << a.error.dump();
  EXPECT_TRUE(entry_for(r, "doc:yes")["report"].contains("version")) << r.to_json().dump();
  EXPECT_EQ(entry_for(r, "doc:no")["report"], (nlohmann::json{{"restarted", true}}));
  EXPECT_EQ(version_of(m, "doc:yes"), ver('b'));
  EXPECT_EQ(version_of(m, "doc:no"), ver('b'));
  EXPECT_EQ(forks_, 3);
}

TEST_F(RolloutTest, AReloadTimeoutFreesTheSlotAtTheLateReplyWhichSetsTheVersion) {
  kind_.reload_timeout_ms = 150;
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:l").ok());
  auto r = roll(m, set('b', {"reload-delay-700"}));
  EXPECT_EQ(entry_for(r, "doc:l")["error"]["code"], "reload_timeout") << r.to_json().dump();
  EXPECT_LT(r.took_ms, 650u);
  EXPECT_EQ(version_of(m, "doc:l"), ver('a'));
  EXPECT_EQ(m.kinds_state()["doc"]["dirty"], true);
  // The store must keep the set the reload in flight brings.
  EXPECT_EQ(m.versions_in_use("doc"), (std::set<std::string>{ver('a'), ver('b')}));
  // The late success sets the version: the kind is clean without another rollout.
  ASSERT_TRUE(run_until([&] { return version_of(m, "doc:l") == ver('b'); }, 5'000));
  EXPECT_EQ(m.kinds_state()["doc"]["dirty"], false);
  EXPECT_NE(supervisor_log().find("worker_reloaded address=\"doc:l\" version=bbbbbbbbbbbb "
                                  "late=true"),
            std::string::npos)
      << supervisor_log();
  // The slot is free: the next rollout's reload goes at once and applies.
  auto next = roll(m, set('c'));
  EXPECT_EQ(entry_for(next, "doc:l")["report"]["version"], ver('c')) << next.to_json().dump();
  EXPECT_EQ(version_of(m, "doc:l"), ver('c'));
}

TEST_F(RolloutTest, OneReloadInFlightPerWorkerTheNextGoesAtTheReply) {
  kind_.reload_timeout_ms = 100;
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:o").ok());
  auto first = roll(m, set('b', {"reload-delay-600"}));
  EXPECT_EQ(entry_for(first, "doc:o")["error"]["code"], "reload_timeout");
  // The second rollout comes while the first reload is in flight: its reload waits for that
  // reply (and this rollout gives up on it first).
  auto second = roll(m, set('c'));
  EXPECT_EQ(entry_for(second, "doc:o")["error"]["code"], "reload_timeout");
  EXPECT_LT(event_at("reload_got:2"), 0);  // not sent yet
  EXPECT_EQ(m.versions_in_use("doc"), (std::set<std::string>{ver('a'), ver('b'), ver('c')}));
  // The first reply frees the slot and sends the waiting set, whose late success sets it.
  ASSERT_TRUE(run_until([&] { return version_of(m, "doc:o") == ver('c'); }, 5'000));
  EXPECT_GT(event_at("reload_replied:1"), 0);
  EXPECT_GE(event_at("reload_got:2"), event_at("reload_replied:1"));
  EXPECT_EQ(m.kinds_state()["doc"]["dirty"], false);
  EXPECT_EQ(m.versions_in_use("doc"), (std::set<std::string>{ver('c')}));
}

TEST_F(RolloutTest, ALostLinkDuringTheRolloutIsAnError) {
  kind_.stop_grace_ms = 300;
  data_["doc:l"] = {{"mode", "close_link"}};  // closes its link 20 ms after `ready`
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:l").ok());
  auto r = roll(m, set('b', {"reload-delay-1000"}));
  EXPECT_EQ(entry_for(r, "doc:l")["error"]["code"], "link_lost") << r.to_json().dump();
}

TEST_F(RolloutTest, CloseDuringARolloutSettlesWhatIsLeftAndStillReports) {
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:1").ok());
  ASSERT_TRUE(resolve(m, "doc:2").ok());
  std::optional<RolloutReport> report;
  ASSERT_TRUE(
      m.rollout("doc", set('b', {"reload-never"}), [&](const RolloutReport& r) { report = r; }));
  bool closed = false;
  m.close([&] { closed = true; });
  ASSERT_TRUE(run_until([&] { return report.has_value() && closed; }));
  ASSERT_EQ(report->workers.size(), 2u);
  for (auto& w : report->workers) EXPECT_EQ(w["stopped"], true) << w.dump();
  EXPECT_EQ(report->failed, 0u);
  EXPECT_EQ(m.live_workers(), 0u);
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
}

TEST_F(RolloutTest, AKindWithoutCodeSendsNoSetAndHasNoVersion) {
  KindConfig note = kind_;
  note.name = "note";
  note.routes = {"/note/{id}/*"};
  note.code.reset();
  options_.kinds = {note};
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "note:1").ok());
  EXPECT_FALSE(m.entry("note:1").contains("version"));
  EXPECT_EQ(served(m, "note:1"), "hello note:1\n");  // its `start` had no code
  auto ks = m.kinds_state();
  EXPECT_TRUE(ks["note"]["version"].is_null());
  EXPECT_EQ(ks["note"]["dirty"], false);
  EXPECT_EQ(ks["note"]["workers"], 1);
  EXPECT_EQ(ks["doc"]["workers"], 0);
  EXPECT_TRUE(m.versions_in_use("note").empty());
  // Its first rollout brings the worker to a set (from none).
  std::optional<RolloutReport> r;
  ASSERT_TRUE(m.rollout("note", set('b'), [&](const RolloutReport& rep) { r = rep; }));
  ASSERT_TRUE(run_until([&] { return r.has_value(); }));
  EXPECT_EQ(r->previous, "");
  EXPECT_EQ(entry_for(*r, "note:1")["report"]["version"], ver('b'));
  EXPECT_EQ(m.entry("note:1")["version"], ver('b'));
}

TEST_F(RolloutTest, AReplacementNotReadyInTimeIsAnErrorButStillComesUp) {
  kind_.reload = KindConfig::Reload::restart;
  // A replacement's timeout runs from the new worker's fork: start_timeout + reload_timeout
  // (2.3 s here). Its setup (3 s) stays within the ready timeout (3 x start_timeout by default).
  kind_.reload_timeout_ms = 300;
  kind_.start_timeout_ms = 2'000;
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:r").ok());
  data_["doc:r"] = {{"slow_ready", 3'000}};  // the new worker's start data
  auto r = roll(m, set('b'));
  auto e = entry_for(r, "doc:r");
  EXPECT_EQ(e["error"]["code"], "reload_timeout") << e.dump();
  EXPECT_EQ(e["error"]["message"], "The worker was not replaced in time.");
  EXPECT_EQ(status(m, "doc:r"), "starting");
  ASSERT_TRUE(run_until([&] { return status(m, "doc:r") == "running"; }));
  EXPECT_EQ(version_of(m, "doc:r"), ver('b'));
  EXPECT_EQ(m.kinds_state()["doc"]["dirty"], false);
}

// Replacements queue behind max_starting: together they take longer than reload_timeout, but
// each is bounded from its own fork, so none is reported as timed out.
TEST_F(RolloutTest, QueuedReplacementsAreNotTimedOutWhileTheyProgress) {
  kind_.reload = KindConfig::Reload::restart;
  kind_.reload_timeout_ms = 400;
  options_.max_starting = 1;
  Manager& m = make();
  for (const char* a : {"doc:q1", "doc:q2", "doc:q3", "doc:q4"}) {
    ASSERT_TRUE(resolve(m, a).ok());
    data_[a] = {{"slow_ready", 250}};  // each new worker: 250 ms to ready, one at a time
  }
  auto r = roll(m, set('b'), 20'000);
  EXPECT_EQ(r.failed, 0u) << r.to_json().dump();
  for (const auto& e : r.workers) EXPECT_EQ(e["report"]["restarted"], true) << e.dump();
  EXPECT_GE(r.took_ms, 1'000u);  // longer than reload_timeout in all
  EXPECT_EQ(m.kinds_state()["doc"]["dirty"], false);
}

TEST_F(RolloutTest, AReplacementWhoseStartFailsIsAnErrorAndTheAddressFails) {
  kind_.reload = KindConfig::Reload::restart;
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:r").ok());
  throw_in_hook_ = true;  // the new worker's start hook
  auto r = roll(m, set('b'));
  EXPECT_EQ(entry_for(r, "doc:r")["error"]["code"], "start_failed") << r.to_json().dump();
  EXPECT_EQ(r.failed, 1u);
  EXPECT_EQ(status(m, "doc:r"), "failed");
  EXPECT_EQ(m.state().dump().find("SECRET"), std::string::npos);
  // The next rollout clears it.
  throw_in_hook_ = false;
  auto next = roll(m, set('c'));
  EXPECT_EQ(next.cleared, (nlohmann::json{"doc:r"}));
  ASSERT_TRUE(resolve(m, "doc:r").ok());
  EXPECT_EQ(version_of(m, "doc:r"), ver('c'));
}

TEST_F(RolloutTest, ARollbackWhileTheReloadToTheNewSetIsInFlightEndsOnTheOldSet) {
  kind_.reload_timeout_ms = 100;
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:b").ok());
  auto forward = roll(m, set('b', {"reload-delay-500"}));
  EXPECT_EQ(entry_for(forward, "doc:b")["error"]["code"], "reload_timeout");
  // It still runs 'a', but is being brought to 'b': rolling back to 'a' must include it.
  EXPECT_EQ(version_of(m, "doc:b"), ver('a'));
  auto back = roll(m, set('a'));
  // Its reload of 'a' waits for the reply of 'b' (past this rollout's 100 ms).
  EXPECT_EQ(entry_for(back, "doc:b")["error"]["code"], "reload_timeout") << back.to_json().dump();
  // Its reload of 'a' went after the reply of 'b'; it ends on 'a'.
  ASSERT_TRUE(run_until([&] { return event_at("reload_replied:2") > 0; }, 5'000));
  ASSERT_TRUE(run_until([&] { return version_of(m, "doc:b") == ver('a'); }));
  EXPECT_EQ(m.kinds_state()["doc"]["dirty"], false);
}

}  // namespace
}  // namespace corral::workers
