// The worker manager against real children, as integration: tests/workers/fake_worker.py (Python
// standard library) speaks docs/worker-protocol.md and misbehaves as its start data says. The
// lifecycle rules themselves are tested on the fake launcher, without a fork
// (manager_fake_test.cc); what stays here needs real processes, sockets or locks. The loop runs
// with run_once, bounded by a deadline per wait; no sleeps. The fixture is in
// manager_test_support.h; the rollout step's tests are in manager_rollout_test.cc.
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

TEST_F(ManagerTest, AHundredRealWorkersLeaveNothingBehind) {
  options_.max_starting = 50;  // each batch starts at once, as before the bounds
  Manager& m = make();
  EXPECT_TRUE(resolve(m, "doc:warmup").ok());  // opens the kind's log file
  EXPECT_TRUE(m.stop("doc:warmup"));
  ASSERT_TRUE(gone(m, "doc:warmup"));
  size_t fds = open_fds();
  constexpr int kAddresses = 100, kBatch = 50;
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
