// The worker manager against a real child: tests/workers/fake_worker.py (Python standard library)
// speaks docs/worker-protocol.md and misbehaves as its start data says. The loop runs with
// run_once, bounded by a deadline per wait; no sleeps. The fixture is in manager_test_support.h;
// the rollout step's tests are in manager_rollout_test.cc.
#include "workers/manager.h"

#include <regex>

#include "workers/manager_test_support.h"
#include "workers/orphans.h"

namespace corral::workers {
namespace {

using manager_testing::ManagerTest;
using manager_testing::open_fds;
using manager_testing::read_file;

TEST_F(ManagerTest, StartsOnFirstResolveAndServesOnItsSocket) {
  Manager& m = make();
  EXPECT_EQ(forks_, 0);
  EXPECT_TRUE(m.state().empty());
  auto r = resolve(m, "doc:1");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  EXPECT_EQ(r.socket_path, state_ + "/sockets/doc%3A1");
  EXPECT_EQ(forks_, 1);
  auto e = m.entry("doc:1");
  EXPECT_EQ(e["status"], "running");
  EXPECT_GT(e["pid"].get<int>(), 0);
  EXPECT_TRUE(e["startedAt"].is_string());
  struct stat st;
  ASSERT_EQ(::stat((state_ + "/sockets").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // fd 4 is the listening socket the manager made: the fake answers on it.
  auto fd = core::connect_unix(r.socket_path);
  ASSERT_TRUE(fd.ok());
  char buf[64];
  ssize_t n = ::read(fd->get(), buf, sizeof buf);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))), "hello doc:1\n");
  // A second resolve is answered at once by the running worker.
  auto r2 = resolve(m, "doc:1");
  EXPECT_TRUE(r2.ok());
  EXPECT_EQ(forks_, 1);
  EXPECT_TRUE(m.stop("doc:1"));
  EXPECT_TRUE(gone(m, "doc:1"));
  EXPECT_TRUE(m.state().empty());
  EXPECT_NE(::access(r.socket_path.c_str(), F_OK), 0);  // the socket file is removed
  // Output: one log per kind, the time, the address and the pid on every line.
  std::string out = read_file(state_ + "/logs/doc.log");
  for (const char* text : {"starting doc:1", "stderr line for doc:1", "bye from doc:1"})
    EXPECT_TRUE(std::regex_search(
        out,
        std::regex(std::string(R"((^|\n)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z doc:1 \[\d+\] )") +
                   text + "\n")))
        << text << "\n"
        << out;
  // The changes seen: starting, running, stopping, then no entry.
  std::vector<std::string> seen;
  for (auto& [a, entry] : changes_)
    seen.push_back(entry.is_null() ? "-" : entry["status"].get<std::string>());
  EXPECT_EQ(seen, (std::vector<std::string>{"starting", "running", "stopping", "-"}));
}

TEST_F(ManagerTest, StartedBeforeSlowSetupAndStartTimerDoesNotKillSlowReady) {
  kind_.start_timeout_ms = 400;
  kind_.ready_timeout_ms = 10'000;  // the setup has a bound of its own
  data_["doc:slow"] = {{"slow_ready", 1'200}};
  Manager& m = make();
  std::optional<Resolution> r;
  m.resolve("doc:slow", [&](const Resolution& res) { r = res; });
  run_for(800);  // past the start timer: `started` came before the slow setup
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(status(m, "doc:slow"), "starting");
  ASSERT_TRUE(run_until([&] { return r.has_value(); }));
  EXPECT_TRUE(r->ok()) << r->error.dump();
  EXPECT_EQ(status(m, "doc:slow"), "running");
  EXPECT_EQ(forks_, 1);
}

TEST_F(ManagerTest, StartTimerFailsAndKillsAWorkerThatNeverStarts) {
  kind_.start_timeout_ms = 300;
  data_["doc:t"] = {{"mode", "never_started"}};
  Manager& m = make();
  auto r = resolve(m, "doc:t");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error["code"], "start_timeout");
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
  EXPECT_EQ(status(m, "doc:t"), "failed");
  EXPECT_EQ(m.entry("doc:t")["error"]["code"], "start_timeout");
  // Stays failed, nothing forks.
  auto again = resolve(m, "doc:t");
  EXPECT_EQ(again.error["code"], "start_timeout");
  EXPECT_EQ(forks_, 1);
  EXPECT_NE(supervisor_log().find("worker_failed"), std::string::npos);
  // retry clears it; the next resolve forks again.
  data_["doc:t"] = {{"mode", "normal"}};
  EXPECT_TRUE(m.retry("doc:t"));
  EXPECT_TRUE(m.entry("doc:t").is_null());
  EXPECT_TRUE(resolve(m, "doc:t").ok());
  EXPECT_EQ(forks_, 2);
}

// A worker that takes its lock and never says `ready`: the ready timer fails the address (its
// waiters get the 503 at once), kills it, and its start place goes to the next start.
TEST_F(ManagerTest, ReadyTimerFailsKillsAndFreesTheStartPlaceOfAWorkerThatNeverGetsReady) {
  kind_.ready_timeout_ms = 300;
  options_.max_starting = 1;
  data_["doc:stuck"] = {{"mode", "never_ready"}};
  Manager& m = make();
  std::optional<Resolution> stuck, stuck2, other;
  m.resolve("doc:stuck", [&](const Resolution& r) { stuck = r; });
  m.resolve("doc:stuck", [&](const Resolution& r) { stuck2 = r; });
  m.resolve("doc:other", [&](const Resolution& r) { other = r; });
  ASSERT_TRUE(run_until([&] { return status(m, "doc:stuck") == "starting"; }));
  EXPECT_EQ(status(m, "doc:other"), "queued");  // the one start place is held
  ASSERT_TRUE(run_until([&] { return stuck && stuck2; }));
  for (auto* r : {&stuck, &stuck2}) {
    EXPECT_EQ((*r)->status, 503);
    EXPECT_EQ((*r)->error["code"], "ready_timeout");
  }
  EXPECT_EQ(m.entry("doc:stuck")["status"], "failed");
  EXPECT_EQ(m.entry("doc:stuck")["error"]["code"], "ready_timeout");
  ASSERT_TRUE(run_until([&] { return other.has_value(); }));
  EXPECT_TRUE(other->ok()) << other->error.dump();
  EXPECT_EQ(m.live_workers(), 1u);  // the stuck one was killed (it ignores SIGTERM)
  EXPECT_EQ(resolve(m, "doc:stuck").error["code"], "ready_timeout");  // failed until retry
  EXPECT_EQ(forks_, 2);
  EXPECT_NE(supervisor_log().find("no `ready` within 300 ms of `started`"), std::string::npos);
}

// Its default: three times the start timeout.
TEST_F(ManagerTest, ReadyTimeoutDefaultsToThreeStartTimeouts) {
  kind_.start_timeout_ms = 200;
  data_["doc:stuck"] = {{"mode", "never_ready"}};
  Manager& m = make();
  uint64_t t0 = core::monotonic_ms();
  auto r = resolve(m, "doc:stuck");
  EXPECT_EQ(r.error["code"], "ready_timeout");
  EXPECT_GE(core::monotonic_ms() - t0, 600u);
}

// What a worker daemonized (fork, setsid, fork: outside its process group and session) goes
// with it: at a stop, and at a crash.
TEST_F(ManagerTest, WhatAWorkerDaemonizedDiesWithItsStopAndItsCrash) {
  auto daemon_of = [&](const std::string& address, const std::string& file) {
    pid_t d = 0;
    EXPECT_TRUE(run_until([&] {
      d = static_cast<pid_t>(std::atoi(read_file(file).c_str()));
      return d > 0;
    })) << address;
    return d;
  };
  auto gone = [](pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; };  // killed, reaped
  data_["doc:s"] = {{"daemon", state_ + "/s.pid"}};
  data_["doc:c"] = {
      {"daemon", state_ + "/c.pid"}, {"mode", "crash_after_ready"}, {"crash_after", 300}};
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:s").ok());
  int worker = m.entry("doc:s")["pid"].get<int>();
  pid_t d = daemon_of("doc:s", state_ + "/s.pid");
  EXPECT_NE(getsid(d), worker);
  EXPECT_NE(getpgid(d), worker);
  EXPECT_EQ(proc_stat(d)->ppid, worker);  // the worker is a subreaper: its orphan is its child
  EXPECT_TRUE(m.stop("doc:s"));
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
  EXPECT_TRUE(run_until([&] { return gone(d); })) << d;

  ASSERT_TRUE(resolve(m, "doc:c").ok());
  pid_t dc = daemon_of("doc:c", state_ + "/c.pid");
  ASSERT_TRUE(run_until([&] { return status(m, "doc:c") == "failed"; }));
  EXPECT_TRUE(run_until([&] { return gone(dc); })) << dc;
  EXPECT_NE(supervisor_log().find("worker_orphans killed="), std::string::npos);
}

TEST_F(ManagerTest, StartHookThrowingFailsWithoutAForkAndKeepsTheMessagePrivate) {
  throw_in_hook_ = true;
  Manager& m = make();
  auto r = resolve(m, "doc:h");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error["code"], "start_failed");
  EXPECT_EQ(forks_, 0);
  EXPECT_EQ(m.state().dump().find("SECRET"), std::string::npos);
  EXPECT_NE(supervisor_log().find("SECRET-HOOK"), std::string::npos);
  EXPECT_EQ(resolve(m, "doc:h").error["code"], "start_failed");
  throw_in_hook_ = false;
  EXPECT_TRUE(m.retry("doc:h"));
  EXPECT_TRUE(resolve(m, "doc:h").ok());
  EXPECT_EQ(forks_, 1);
}

TEST_F(ManagerTest, CrashAfterReadyStaysFailedUntilRetry) {
  data_["doc:c"] = {{"mode", "crash_after_ready"}, {"crash_after", 100}};
  Manager& m = make();
  EXPECT_TRUE(resolve(m, "doc:c").ok());
  ASSERT_TRUE(run_until([&] { return status(m, "doc:c") == "failed"; }));
  EXPECT_EQ(m.entry("doc:c")["error"]["code"], "worker_exited");
  EXPECT_EQ(m.live_workers(), 0u);
  EXPECT_EQ(resolve(m, "doc:c").status, 503);
  run_for(200);
  EXPECT_EQ(forks_, 1);
  EXPECT_NE(supervisor_log().find("worker_failed"), std::string::npos);
  data_["doc:c"] = {{"mode", "normal"}};
  EXPECT_TRUE(m.retry("doc:c"));
  EXPECT_TRUE(resolve(m, "doc:c").ok());
  EXPECT_EQ(forks_, 2);
}

TEST_F(ManagerTest, FatalIsRedactedInStateAndWaitersButLoggedInFull) {
  data_["doc:f"] = {{"mode", "fatal"}};
  Manager& m = make();
  auto r = resolve(m, "doc:f");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error, (nlohmann::json{{"message", "public message"}, {"code", "E_TEST"}}));
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
  auto e = m.entry("doc:f");
  EXPECT_EQ(e["status"], "failed");
  EXPECT_EQ(e["error"]["message"], "public message");
  EXPECT_EQ(m.state().dump().find("SECRET"), std::string::npos);
  for (auto& [a, entry] : changes_) EXPECT_EQ(entry.dump().find("SECRET"), std::string::npos);
  std::string log = supervisor_log();
  auto at = log.find("worker_failed");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_NE(log.find("SECRET-42", at), std::string::npos);  // the full error and the stderr tail
  EXPECT_NE(m.stderr_tail("doc:f").find("the secret is SECRET-42"), std::string::npos);
  EXPECT_EQ(forks_, 1);
  EXPECT_EQ(resolve(m, "doc:f").status, 503);
  EXPECT_EQ(forks_, 1);
  // retry clears it; the next resolve forks again.
  data_["doc:f"] = {{"mode", "normal"}};
  EXPECT_TRUE(m.retry("doc:f"));
  EXPECT_TRUE(m.entry("doc:f").is_null());
  EXPECT_TRUE(resolve(m, "doc:f").ok());
  EXPECT_EQ(forks_, 2);
}

TEST_F(ManagerTest, LostLinkAfterReadyIsRecoveredOnceAMinute) {
  kind_.stop_grace_ms = 300;
  data_["doc:l"] = {{"mode", "close_link"}};
  Manager& m = make();
  EXPECT_TRUE(resolve(m, "doc:l").ok());
  // The child lives with its link closed: stopped (grace, then kill), no failure.
  EXPECT_TRUE(gone(m, "doc:l"));
  EXPECT_NE(supervisor_log().find("worker_link_lost"), std::string::npos);
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
  // The next resolve starts a new worker; its lost link within the minute fails the address.
  EXPECT_TRUE(resolve(m, "doc:l").ok());
  EXPECT_EQ(forks_, 2);
  ASSERT_TRUE(run_until([&] { return status(m, "doc:l") == "failed"; }));
  EXPECT_EQ(m.entry("doc:l")["error"]["code"], "link_lost");
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
  EXPECT_EQ(resolve(m, "doc:l").status, 503);
  EXPECT_EQ(forks_, 2);
  // retry clears it.
  data_["doc:l"] = {{"mode", "normal"}};
  EXPECT_TRUE(m.retry("doc:l"));
  EXPECT_TRUE(resolve(m, "doc:l").ok());
  EXPECT_EQ(forks_, 3);
}

TEST_F(ManagerTest, LostLinkBeforeReadyFailsAndTheLiveChildIsKilledAfterTheGrace) {
  // The child closes fd 3 after `started` and ignores SIGTERM: it lives on without a link.
  kind_.stop_grace_ms = 300;
  data_["doc:lb"] = {{"mode", "close_link_before_ready"}};
  Manager& m = make();
  auto r = resolve(m, "doc:lb");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error["code"], "link_lost");
  EXPECT_EQ(status(m, "doc:lb"), "failed");
  int pid = 0;
  for (auto& [t, p, e] : events())
    if (e == "link_closed") pid = p;
  ASSERT_GT(pid, 0);
  // Only the SIGKILL after stop_grace ends it (it ignores SIGTERM).
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
  EXPECT_NE(::kill(pid, 0), 0);
  std::string log = supervisor_log();
  EXPECT_NE(log.find("pid=" + std::to_string(pid) + " how=\"signal 9\""), std::string::npos) << log;
  EXPECT_NE(log.find("worker_failed"), std::string::npos);
  // Stays failed: no fork for a new resolve, until retry.
  EXPECT_EQ(resolve(m, "doc:lb").error["code"], "link_lost");
  run_for(100);
  EXPECT_EQ(forks_, 1);
  EXPECT_EQ(m.entry("doc:lb")["error"]["code"], "link_lost");
  data_["doc:lb"] = {{"mode", "normal"}};
  EXPECT_TRUE(m.retry("doc:lb"));
  EXPECT_TRUE(resolve(m, "doc:lb").ok());
  EXPECT_EQ(forks_, 2);
}

TEST_F(ManagerTest, IdleWorkerIsStoppedAfterIdleTime) {
  kind_.idle_ms = 300;
  Manager& m = make(/*idle_check_ms=*/50);
  EXPECT_TRUE(resolve(m, "doc:i").ok());
  EXPECT_TRUE(gone(m, "doc:i"));
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
  // The next request starts it again.
  EXPECT_TRUE(resolve(m, "doc:i").ok());
  EXPECT_EQ(forks_, 2);
}

TEST_F(ManagerTest, BusyWorkerIsKeptUntilItReportsIdle) {
  kind_.idle_ms = 200;
  data_["doc:b"] = {{"idle", false}, {"idle_after", 1'000}};
  Manager& m = make(50);
  EXPECT_TRUE(resolve(m, "doc:b").ok());
  run_for(800);
  EXPECT_EQ(status(m, "doc:b"), "running");
  uint64_t t0 = core::monotonic_ms();
  EXPECT_TRUE(gone(m, "doc:b"));
  EXPECT_GE(core::monotonic_ms() - t0, 300u);  // idle at ~1 s, then 200 ms of idle time
}

// A request handed to a worker that has not accepted it yet (under load a worker may take longer
// than `idle` to accept) keeps the worker: stopping it would reset the connection, and a POST on
// it would be lost (the proxy answers 502 for a request that may have left).
TEST_F(ManagerTest, ConnectionWaitingToBeAcceptedKeepsIdleWorker) {
  kind_.idle_ms = 200;
  data_["doc:q"] = {{"accept_after", 1'500}};  // says idle, accepts only 1.5 s after `ready`
  Manager& m = make(/*idle_check_ms=*/50);
  auto r = resolve(m, "doc:q");
  ASSERT_TRUE(r.ok());
  auto fd = core::connect_unix(r.socket_path);  // queued: nobody accepts yet
  ASSERT_TRUE(fd.ok()) << fd.error().reason;
  // Answered once the worker accepts; the manager runs meanwhile (had it stopped the worker, the
  // connection would be reset: the read fails).
  std::string got;
  ASSERT_TRUE(run_until([&] {
    pollfd p{fd->get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    char buf[64];
    ssize_t n = ::read(fd->get(), buf, sizeof buf);
    got.assign(buf, static_cast<size_t>(std::max<ssize_t>(n, 0)));
    return true;
  }));
  EXPECT_EQ(got, "hello doc:q\n");
  // Nothing waits any more: stopped once idle.
  EXPECT_TRUE(gone(m, "doc:q"));
  EXPECT_EQ(forks_, 1);
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
}

// From the stop on, a connect fails (nothing is sent, so the proxy resolves again and the new
// worker, queued behind the stop, answers) instead of queueing on a worker that no longer accepts.
TEST_F(ManagerTest, StoppingWorkerTakesNoNewConnection) {
  data_["doc:r"] = {{"exit_on_shutdown_slowly", 1'000}};
  Manager& m = make();
  auto r = resolve(m, "doc:r");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(m.stop("doc:r"));
  EXPECT_EQ(status(m, "doc:r"), "stopping");
  auto fd = core::connect_unix(r.socket_path);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.error().code, ENOENT) << fd.error().reason;
  // A resolve meanwhile waits for the exit, then gets the new worker's socket.
  auto r2 = resolve(m, "doc:r");
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(forks_, 2);
  EXPECT_TRUE(core::connect_unix(r2.socket_path).ok());
}

TEST_F(ManagerTest, StopDuringStartWaitsForStartedThenStops) {
  data_["doc:s"] = {{"slow_ready", 5'000}};
  Manager& m = make();
  std::optional<Resolution> r;
  m.resolve("doc:s", [&](const Resolution& res) { r = res; });
  EXPECT_TRUE(m.stop("doc:s"));  // before `started`
  EXPECT_EQ(status(m, "doc:s"), "starting");
  ASSERT_TRUE(run_until([&] { return r.has_value(); }));
  EXPECT_EQ(r->error["code"], "stopped");
  EXPECT_TRUE(gone(m, "doc:s"));
  int pid = 0;
  for (auto& [t, p, e] : events()) pid = p;
  EXPECT_GT(event_time(pid, "started"), 0);  // it took its lock before the stop ran
  EXPECT_EQ(forks_, 1);
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
}

TEST_F(ManagerTest, StopBetweenStartedAndReadyStopsAfterTheStartAndRecordsNoFailure) {
  data_["doc:sr"] = {{"slow_ready", 5'000}};
  Manager& m = make();
  std::optional<Resolution> r;
  m.resolve("doc:sr", [&](const Resolution& res) { r = res; });
  int pid = 0;
  ASSERT_TRUE(run_until([&] {
    for (auto& [t, p, e] : events())
      if (e == "started") pid = p;
    return pid != 0;
  }));
  ASSERT_TRUE(run_until([&] { return m.entry("doc:sr").value("pid", 0) == pid; }));
  EXPECT_EQ(status(m, "doc:sr"), "starting");  // `started`, not `ready`
  EXPECT_TRUE(m.stop("doc:sr"));
  ASSERT_TRUE(run_until([&] { return r.has_value(); }));
  EXPECT_EQ(r->error["code"], "stopped");
  EXPECT_EQ(r->status, 503);
  // A resolve during that stop waits for the exit, then starts a new worker.
  data_["doc:sr"] = nlohmann::json::object();
  auto again = resolve(m, "doc:sr");
  ASSERT_TRUE(again.ok()) << again.error.dump();
  EXPECT_NE(m.entry("doc:sr")["pid"].get<int>(), pid);
  EXPECT_NE(::kill(pid, 0), 0);
  EXPECT_EQ(forks_, 2);
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
  EXPECT_EQ(status(m, "doc:sr"), "running");
}

TEST_F(ManagerTest, CrashWhileStoppingIsNoFailureAndTheQueuedStartRuns) {
  // The old worker dies with exit 3 after `shutdown`: asked for, so the start queued behind it
  // runs and nothing is failed.
  data_["doc:cs"] = {{"exit_on_shutdown_slowly", 300}, {"shutdown_exit_code", 3}};
  Manager& m = make();
  EXPECT_TRUE(resolve(m, "doc:cs").ok());
  int old_pid = m.entry("doc:cs")["pid"];
  EXPECT_TRUE(m.stop("doc:cs"));
  data_["doc:cs"] = nlohmann::json::object();
  auto r = resolve(m, "doc:cs");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  EXPECT_NE(m.entry("doc:cs")["pid"].get<int>(), old_pid);
  EXPECT_EQ(forks_, 2);
  std::string log = supervisor_log();
  EXPECT_NE(log.find("how=\"exit 3\" asked=true"), std::string::npos) << log;
  EXPECT_EQ(log.find("worker_failed"), std::string::npos);
}

TEST_F(ManagerTest, StartDuringStopWaitsForTheOldWorkersExit) {
  data_["doc:q"] = {{"exit_on_shutdown_slowly", 600}};
  Manager& m = make();
  EXPECT_TRUE(resolve(m, "doc:q").ok());
  int old_pid = m.entry("doc:q")["pid"];
  EXPECT_TRUE(m.stop("doc:q"));
  EXPECT_EQ(status(m, "doc:q"), "stopping");
  auto r = resolve(m, "doc:q");  // queued behind the exit
  ASSERT_TRUE(r.ok()) << r.error.dump();
  int new_pid = m.entry("doc:q")["pid"];
  EXPECT_NE(new_pid, old_pid);
  EXPECT_EQ(forks_, 2);
  double old_exit = event_time(old_pid, "exiting");
  double new_started = event_time(new_pid, "started");
  EXPECT_GT(old_exit, 0);
  EXPECT_GT(new_started, old_exit);
}

TEST_F(ManagerTest, LockMakesASecondManagersWorkerWaitForTheOldOnesExit) {
  // corral restarted while an old worker still stops: two managers on one state directory. The
  // new worker's `started` comes only after the old one exited (flock, no polling).
  data_["doc:k"] = {{"exit_on_shutdown_slowly", 800}};
  options_.sweep_orphans = false;  // each manager would take the other's workers for orphans
  Manager& first = make();
  EXPECT_TRUE(resolve(first, "doc:k").ok());
  int old_pid = first.entry("doc:k")["pid"];
  auto old_manager = std::move(manager_);
  data_["doc:k"] = nlohmann::json::object();
  Manager& second = make();
  EXPECT_TRUE(old_manager->stop("doc:k"));
  auto r = resolve(second, "doc:k");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  int new_pid = second.entry("doc:k")["pid"];
  ASSERT_TRUE(run_until([&] { return old_manager->live_workers() == 0; }));
  double old_exit = event_time(old_pid, "exiting");
  double new_started = event_time(new_pid, "started");
  EXPECT_GT(old_exit, 0);
  EXPECT_GT(new_started, old_exit);
  EXPECT_EQ(::access(r.socket_path.c_str(), F_OK), 0);  // the old exit left the new socket alone
  old_manager.reset();
}

TEST_F(ManagerTest, CrashWhileStartsAreQueuedRejectsEveryWaiter) {
  data_["doc:x"] = {{"mode", "crash_before_ready"}, {"crash_after", 300}};
  Manager& m = make();
  std::vector<Resolution> answers;
  for (int i = 0; i < 3; ++i)
    m.resolve("doc:x", [&](const Resolution& r) { answers.push_back(r); });
  ASSERT_TRUE(run_until([&] { return answers.size() == 3; }));
  for (auto& a : answers) {
    EXPECT_EQ(a.status, 503);
    EXPECT_EQ(a.error["code"], "worker_exited");
  }
  EXPECT_EQ(forks_, 1);
  EXPECT_EQ(status(m, "doc:x"), "failed");
  // Nothing forks again for later resolves, until retry.
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
  EXPECT_EQ(resolve(m, "doc:x").error["code"], "worker_exited");
  run_for(200);
  EXPECT_EQ(forks_, 1);
  data_["doc:x"] = {{"mode", "normal"}};
  EXPECT_TRUE(m.retry("doc:x"));
  EXPECT_TRUE(resolve(m, "doc:x").ok());
  EXPECT_EQ(forks_, 2);
}

TEST_F(ManagerTest, CloseCancelsStartsAndReportsNoFailure) {
  data_["doc:slow"] = {{"slow_ready", 5'000}};
  data_["doc:stubborn"] = {{"mode", "ignore_shutdown"}};
  data_["doc:q"] = {{"exit_on_shutdown_slowly", 400}};
  kind_.stop_grace_ms = 300;
  Manager& m = make();
  EXPECT_TRUE(resolve(m, "doc:run").ok());
  EXPECT_TRUE(resolve(m, "doc:stubborn").ok());
  EXPECT_TRUE(resolve(m, "doc:q").ok());
  // doc:q stops slowly with a start queued behind its exit; doc:slow is between fork and ready.
  EXPECT_TRUE(m.stop("doc:q"));
  std::optional<Resolution> queued;
  m.resolve("doc:q", [&](const Resolution& res) { queued = res; });
  std::optional<Resolution> r;
  m.resolve("doc:slow", [&](const Resolution& res) { r = res; });
  bool done = false;
  m.close([&] { done = true; });
  ASSERT_TRUE(run_until([&] { return done; }));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->error["code"], "closing");
  ASSERT_TRUE(queued.has_value());
  EXPECT_EQ(queued->error["code"], "closing");
  EXPECT_EQ(m.live_workers(), 0u);
  EXPECT_TRUE(m.state().empty()) << m.state().dump();
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
  EXPECT_EQ(resolve(m, "doc:new").error["code"], "closing");
  EXPECT_EQ(forks_, 4);  // the queued start of doc:q never forked
}

TEST_F(ManagerTest, SuspendAndResume) {
  Manager& m = make();
  EXPECT_FALSE(m.suspend("nope:1"));
  EXPECT_TRUE(m.suspend("doc:z"));
  auto r = resolve(m, "doc:z");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error["code"], "suspended");
  EXPECT_EQ(status(m, "doc:z"), "suspended");
  EXPECT_EQ(forks_, 0);
  EXPECT_TRUE(m.resume("doc:z"));
  EXPECT_TRUE(m.entry("doc:z").is_null());
  EXPECT_TRUE(resolve(m, "doc:z").ok());
  EXPECT_FALSE(m.resume("doc:z"));
  EXPECT_FALSE(m.retry("doc:z"));
  EXPECT_EQ(resolve(m, "other:1").status, 404);
}

TEST_F(ManagerTest, AddressForRoutes) {
  kind_.routes = {"/doc/{id}/*", "/pair/{a}/{b}"};
  Manager& m = make();
  EXPECT_EQ(m.address_for("/doc/42/x/y"), "doc:42");
  EXPECT_EQ(m.address_for("/doc/42"), "doc:42");
  EXPECT_EQ(m.address_for("/doc/42/?q=1"), "doc:42");
  EXPECT_EQ(m.address_for("/doc/a%20b/"), "doc:a b");
  EXPECT_EQ(m.address_for("/pair/x/y"), "doc:x:y");
  EXPECT_EQ(m.address_for("/pair/x/y/z"), std::nullopt);
  EXPECT_EQ(m.address_for("/doc/%2F/x"), std::nullopt);
  EXPECT_EQ(m.address_for("/doc//x"), std::nullopt);
  EXPECT_EQ(m.address_for("/other/1"), std::nullopt);
  EXPECT_EQ(encode_address("doc:a b/c"), "doc%3Aa%20b%2Fc");
  KindConfig bad = kind_;
  bad.routes = {"/doc/*/x"};
  ManagerOptions o{state_, {bad}};
  EXPECT_FALSE(Manager::create(loop_, *log_, std::move(o), nullptr).ok());
}

TEST_F(ManagerTest, AThousandAddressesLeaveNothingBehind) {
  options_.max_starting = 50;  // each batch starts at once, as before the bounds
  Manager& m = make();
  EXPECT_TRUE(resolve(m, "doc:warmup").ok());  // opens the kind's log file
  EXPECT_TRUE(m.stop("doc:warmup"));
  ASSERT_TRUE(gone(m, "doc:warmup"));
  size_t fds = open_fds();
  constexpr int kAddresses = 1'000, kBatch = 50;
  for (int base = 0; base < kAddresses; base += kBatch) {
    int answered = 0, ok = 0;
    for (int i = base; i < base + kBatch; ++i) {
      m.resolve("doc:n" + std::to_string(i), [&](const Resolution& r) {
        ++answered;
        ok += r.ok();
      });
    }
    ASSERT_TRUE(run_until([&] { return answered == kBatch; }, 60'000));
    EXPECT_EQ(ok, kBatch);
    for (int i = base; i < base + kBatch; ++i) m.stop("doc:n" + std::to_string(i));
    ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }, 60'000));
  }
  EXPECT_TRUE(m.state().empty());
  EXPECT_EQ(forks_, kAddresses + 1);
  run_for(50);  // deferred destruction of the last workers
  EXPECT_EQ(open_fds(), fds);
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);  // no child left, not even a zombie
  EXPECT_EQ(errno, ECHILD);
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
}

// --- bounds (issue 11 #5) ----------------------------------------------------------------------

TEST_F(ManagerTest, DefaultBoundsComeFromTheMachine) {
  EXPECT_GE(default_max_starting(), 2u);
  EXPECT_EQ(default_max_starting() % 2, 0u);
  auto b = default_max_workers();
  EXPECT_GE(b.value, 1u);
  EXPECT_LE(b.value, 1024u);
  EXPECT_FALSE(b.basis.empty());
  Manager& m = make();
  EXPECT_EQ(m.max_starting(), default_max_starting());
  EXPECT_EQ(m.max_workers(), b.value);
  EXPECT_NE(supervisor_log().find("workers_bounds max_starting="), std::string::npos);
}

TEST_F(ManagerTest, StartsOverMaxStartingQueueInOrderAndShowAsQueued) {
  options_.max_starting = 2;
  for (const char* a : {"doc:a", "doc:b", "doc:c", "doc:d", "doc:e"})
    data_[a] = {{"slow_ready", 300}};
  Manager& m = make();
  std::vector<std::string> answered;
  for (const char* a : {"doc:a", "doc:b", "doc:c", "doc:d", "doc:e"})
    m.resolve(a, [&answered, a](const Resolution& r) {
      EXPECT_TRUE(r.ok()) << a << " " << r.error.dump();
      answered.push_back(a);
    });
  // Two forked, three queued, visible as such; nothing more forks while two start.
  EXPECT_EQ(forks_, 2);
  EXPECT_EQ(m.starting_workers(), 2u);
  EXPECT_EQ(m.queued_starts(), 3u);
  EXPECT_EQ(status(m, "doc:a"), "starting");
  EXPECT_EQ(status(m, "doc:c"), "queued");
  EXPECT_TRUE(m.entry("doc:e")["queuedAt"].is_string());
  size_t most_starting = 0;
  ASSERT_TRUE(run_until([&] {
    most_starting = std::max(most_starting, m.starting_workers());
    return answered.size() == 5;
  }));
  EXPECT_EQ(most_starting, 2u);
  EXPECT_EQ(launched_, (std::vector<std::string>{"doc:a", "doc:b", "doc:c", "doc:d", "doc:e"}));
  for (auto& [a, e] : changes_) {  // the two that started at once were never queued
    if (a == "doc:a" || a == "doc:b") {
      EXPECT_NE(e.value("status", ""), "queued") << a;
    }
  }
  EXPECT_EQ(m.queued_starts(), 0u);
  EXPECT_EQ(m.live_workers(), 5u);
}

TEST_F(ManagerTest, ACancelledQueuedStartLeavesNoTraceAndCloseCancelsQueuedStartsFirst) {
  options_.max_starting = 1;
  kind_.stop_grace_ms = 300;
  data_["doc:slow"] = {{"slow_ready", 5'000}};
  Manager& m = make();
  std::optional<Resolution> slow, stopped, closed;
  m.resolve("doc:slow", [&](const Resolution& r) { slow = r; });
  m.resolve("doc:s", [&](const Resolution& r) { stopped = r; });
  m.resolve("doc:c", [&](const Resolution& r) { closed = r; });
  EXPECT_EQ(status(m, "doc:s"), "queued");
  // A stop cancels the queued start: its waiter is told, no entry is left, nothing forks.
  EXPECT_TRUE(m.stop("doc:s"));
  EXPECT_TRUE(m.entry("doc:s").is_null());
  EXPECT_FALSE(m.state().contains("doc:s"));
  ASSERT_TRUE(run_until([&] { return stopped.has_value(); }));
  EXPECT_EQ(stopped->error["code"], "stopped");
  EXPECT_EQ(m.queued_starts(), 1u);
  // close: the queued start is cancelled before anything else, never forks.
  bool done = false;
  m.close([&] { done = true; });
  EXPECT_EQ(m.queued_starts(), 0u);
  ASSERT_TRUE(run_until([&] { return done; }));
  ASSERT_TRUE(closed.has_value() && slow.has_value());
  EXPECT_EQ(closed->error["code"], "closing");
  EXPECT_EQ(launched_, (std::vector<std::string>{"doc:slow"}));
  EXPECT_TRUE(m.state().empty()) << m.state().dump();
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
}

TEST_F(ManagerTest, MaxWorkersStopsTheLongestIdleWorkerAndTheStartWaitsForItsExit) {
  options_.max_workers = 3;
  options_.evict_grace_ms = 0;
  Manager& m = make();
  // doc:b is busy: no candidate, although it has been up longer than doc:c.
  for (const char* a : {"doc:a", "doc:b", "doc:c"}) {
    data_[a] = {{"exit_on_shutdown_slowly", 300}, {"idle", std::string(a) != "doc:b"}};
    ASSERT_TRUE(resolve(m, a).ok()) << a;
  }
  int pid_a = m.entry("doc:a")["pid"];
  // doc:a is the longest idle; a new address stops it and waits for its exit (300 ms).
  std::optional<Resolution> d;
  size_t most_live = 0;
  m.resolve("doc:d", [&](const Resolution& r) { d = r; });
  EXPECT_EQ(status(m, "doc:a"), "stopping");
  EXPECT_EQ(status(m, "doc:d"), "queued");
  EXPECT_EQ(status(m, "doc:b"), "running");
  EXPECT_EQ(status(m, "doc:c"), "running");
  ASSERT_TRUE(run_until([&] {
    most_live = std::max(most_live, m.live_workers());
    return d.has_value();
  }));
  EXPECT_TRUE(d->ok()) << d->error.dump();
  EXPECT_EQ(most_live, 3u);
  EXPECT_TRUE(m.entry("doc:a").is_null());
  EXPECT_NE(::kill(pid_a, 0), 0);
  EXPECT_GT(event_time(m.entry("doc:d")["pid"], "started"), event_time(pid_a, "exiting"));
  std::string log = supervisor_log();
  EXPECT_NE(log.find("worker_evicted address=\"doc:a\""), std::string::npos) << log;
  EXPECT_NE(log.find("reason=evicted"), std::string::npos) << log;
  EXPECT_EQ(log.find("worker_failed"), std::string::npos);
  // The evicted address comes back on its next request, making room the same way (doc:c now).
  EXPECT_TRUE(resolve(m, "doc:a").ok());
  EXPECT_EQ(m.live_workers(), 3u);
  EXPECT_TRUE(m.entry("doc:c").is_null());
  EXPECT_EQ(status(m, "doc:b"), "running");
}

TEST_F(ManagerTest, AFullKindStopsItsOwnLongestIdleWorkerNotAnotherKinds) {
  KindConfig note = kind_;
  note.name = "note";
  note.routes = {"/note/{id}/*"};
  options_.kinds = {note};
  options_.evict_grace_ms = 0;
  kind_.max_workers = 2;
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "note:x").ok());  // the longest idle of all, but of another kind
  ASSERT_TRUE(resolve(m, "doc:a").ok());
  ASSERT_TRUE(resolve(m, "doc:b").ok());
  ASSERT_TRUE(resolve(m, "doc:c").ok());
  EXPECT_EQ(status(m, "note:x"), "running");
  EXPECT_TRUE(run_until([&] { return m.entry("doc:a").is_null(); }));
  EXPECT_EQ(status(m, "doc:b"), "running");
  EXPECT_EQ(m.live_workers(), 3u);
  EXPECT_NE(supervisor_log().find("bound=kind"), std::string::npos);
}

TEST_F(ManagerTest, NoIdleWorkerToStopGets503WithRetryAfterAndLeavesNoTrace) {
  options_.max_workers = 2;
  options_.evict_grace_ms = 0;
  data_["doc:busy1"] = {{"idle", false}};
  data_["doc:busy2"] = {{"idle", false}};
  Manager& m = make();
  ASSERT_TRUE(resolve(m, "doc:busy1").ok());
  ASSERT_TRUE(resolve(m, "doc:busy2").ok());
  auto r = resolve(m, "doc:new");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error, (nlohmann::json{{"message", "Too many workers."}, {"code", "worker_limit"}}));
  EXPECT_GT(r.retry_after_s, 0u);
  EXPECT_TRUE(m.entry("doc:new").is_null());
  for (auto& [a, e] : changes_) EXPECT_NE(a, "doc:new");
  EXPECT_EQ(forks_, 2);
  EXPECT_EQ(m.live_workers(), 2u);
  std::string log = supervisor_log();
  EXPECT_NE(log.find("worker_limit address=\"doc:new\" live=2 max_workers=2"), std::string::npos)
      << log;
  // A fresh worker (nothing served yet since `ready`) is not stopped within the grace either.
  EXPECT_TRUE(m.stop("doc:busy2"));
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 1; }));
  manager_.reset();
  options_.evict_grace_ms = 60'000;
  Manager& m2 = make();
  ASSERT_TRUE(resolve(m2, "doc:idle1").ok());
  ASSERT_TRUE(resolve(m2, "doc:idle2").ok());
  EXPECT_EQ(resolve(m2, "doc:new").error["code"], "worker_limit");
}

TEST_F(ManagerTest, AStartQueuedLongerThanStartTimeoutIsRefused) {
  options_.max_starting = 1;
  kind_.start_timeout_ms = 300;
  data_["doc:slow"] = {{"slow_ready", 5'000}};  // `started` in time, `ready` much later
  Manager& m = make(/*idle_check_ms=*/50);
  m.resolve("doc:slow", [](const Resolution&) {});
  auto r = resolve(m, "doc:late");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error["code"], "start_limit");
  EXPECT_GT(r.retry_after_s, 0u);
  EXPECT_TRUE(m.entry("doc:late").is_null());
  EXPECT_EQ(launched_, (std::vector<std::string>{"doc:slow"}));
  EXPECT_NE(supervisor_log().find("no start finished, for start_timeout"), std::string::npos);
}

TEST_F(ManagerTest, ABurstOfAddressesNeverExceedsTheBounds) {
  options_.max_starting = 3;
  options_.max_workers = 5;
  options_.evict_grace_ms = 0;
  Manager& m = make();
  constexpr int kAddresses = 40;
  int answered = 0, ok = 0, limited = 0;
  size_t most_live = 0, most_starting = 0;
  for (int i = 0; i < kAddresses; ++i) {
    m.resolve("doc:b" + std::to_string(i), [&](const Resolution& r) {
      ++answered;
      ok += r.ok();
      limited += r.error.is_object() && r.error.value("code", "") == "worker_limit";
    });
  }
  ASSERT_TRUE(run_until(
      [&] {
        most_live = std::max(most_live, m.live_workers());
        most_starting = std::max(most_starting, m.starting_workers());
        return answered == kAddresses;
      },
      60'000));
  EXPECT_EQ(ok + limited, kAddresses);
  EXPECT_GE(ok, 5);
  EXPECT_LE(most_live, 5u);
  EXPECT_LE(most_starting, 3u);
  EXPECT_EQ(m.queued_starts(), 0u);
  EXPECT_EQ(supervisor_log().find("worker_failed"), std::string::npos);
}

}  // namespace
}  // namespace corral::workers
