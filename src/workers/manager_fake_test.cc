// The worker manager's lifecycle rules (docs/worker-protocol.md, docs/workers.md) on a fake clock
// and a fake launcher (fake_launcher.h): nothing forks and nothing sleeps. The test is the worker:
// it reads what the manager sends on the control link, answers `started`, `ready`, `idle`,
// `reloaded`..., and says when the worker exits and how. Time moves only when a test advances it.
// The few tests against real children are in manager_test.cc and the files beside it.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/socket.h"
#include "workers/fake_launcher.h"
#include "workers/manager.h"

namespace corral::workers {
namespace {

using F = FakeLauncher;

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n - 1;  // the iterator's own
}

class FakeManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral-workers-fake-XXXXXX";
    state_ = mkdtemp(tmpl);
    kind_.name = "doc";
    kind_.command = {"fake-worker"};
    kind_.routes = {"/doc/{id}/*"};
    kind_.start_timeout_ms = 1'000;
    kind_.stop_grace_ms = 2'000;
    kind_.idle_ms = 10'000;
    options_.sweep_orphans = false;
  }
  void TearDown() override {
    manager_.reset();
    std::filesystem::remove_all(state_);
  }

  Manager& make() {
    ManagerOptions o = options_;
    o.state_dir = state_;
    o.kinds.insert(o.kinds.begin(), kind_);
    if (o.max_starting == 0) o.max_starting = 8;
    if (o.max_workers == 0) o.max_workers = 64;
    auto m = Manager::create(loop_, log_, std::move(o), fake_.borrow());
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().reason);
    manager_ = std::move(m.value());
    manager_->on_change = [this](const std::string& a, const nlohmann::json& e) {
      changes_.push_back({a, e});
    };
    run();
    return *manager_;
  }

  // Lets the loop handle what is pending now (an exit, a message, what their callbacks deferred),
  // then advances the fake clock by `ms`, a millisecond at a time past every timer on the way,
  // and handles what came due.
  void run(uint64_t ms = 0) {
    for (int i = 0; i < 4; ++i) loop_.run_once(0);
    for (uint64_t left = ms; left > 0;) {
      uint64_t step = std::min<uint64_t>(left, 10);
      now_ms_ += step;
      left -= step;
      for (int i = 0; i < 4; ++i) loop_.run_once(0);
    }
  }

  // resolve() with its answer recorded in `out`.
  void resolve(const std::string& address, std::optional<Resolution>& out) {
    manager_->resolve(address, [&out](const Resolution& r) { out = r; });
    run();
  }
  std::string status(const std::string& address) {
    auto e = manager_->entry(address);
    return e.is_null() ? "" : e["status"].get<std::string>();
  }
  std::string log_text() {
    std::string out(static_cast<size_t>(lseek(log_fd_.get(), 0, SEEK_END)), '\0');
    EXPECT_EQ(pread(log_fd_.get(), out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
    return out;
  }
  bool logged(std::string_view text) { return log_text().find(text) != std::string::npos; }

  // The worker's side of a start: `started`, then `ready` with `ready_fields`.
  void start_up(FakeWorker& w, nlohmann::json ready_fields = nlohmann::json::object()) {
    F::send(w, {{"type", "started"}});
    nlohmann::json ready = {{"type", "ready"}, {"idle", true}};
    ready.update(ready_fields);
    F::send(w, ready);
    run();
  }
  // A ready worker for `address` (launched for it, `start` read).
  FakeWorker& running(const std::string& address,
                      nlohmann::json ready_fields = nlohmann::json::object()) {
    std::optional<Resolution> r;
    resolve(address, r);
    FakeWorker& w = fake_.last();
    EXPECT_EQ(w.address, address);
    start_up(w, std::move(ready_fields));
    EXPECT_TRUE(r && r->ok()) << address;
    return w;
  }
  // The worker answers `shutdown` by exiting 0.
  void shut_down(FakeWorker& w) {
    EXPECT_EQ(F::last(w, "shutdown")["type"], "shutdown") << w.pid;
    F::exit_with(w, 0);
    run();
  }

  uint64_t now_ms_ = 7'000'000;
  core::EventLoop loop_{[this] { return now_ms_; }};
  core::UniqueFd log_fd_{memfd_create("manager_fake_test_log", MFD_CLOEXEC)};
  core::Logger log_{log_fd_.get(), core::LogLevel::kDebug};
  std::string state_;
  KindConfig kind_;
  ManagerOptions options_;
  FakeLauncher fake_;
  std::unique_ptr<Manager> manager_;  // last: destroyed before the launcher's records
  std::vector<std::pair<std::string, nlohmann::json>> changes_;
};

// --- Start on demand ---

TEST_F(FakeManagerTest, TheFirstResolveLaunchesAndIsAnsweredAtReady) {
  kind_.start_hook = [](std::string_view address) {
    return nlohmann::json{{"for", std::string(address)}};
  };
  Manager& m = make();
  EXPECT_TRUE(fake_.workers.empty());
  std::optional<Resolution> r;
  resolve("doc:1", r);
  ASSERT_EQ(fake_.workers.size(), 1u);
  FakeWorker& w = fake_.last();
  EXPECT_EQ(w.address, "doc:1");
  EXPECT_EQ(w.command, kind_.command);
  auto start = F::last(w, "start");
  EXPECT_EQ(start["address"], "doc:1");
  EXPECT_EQ(start["start"]["for"], "doc:1");
  EXPECT_EQ(start["lock"], state_ + "/locks/" + lock_file_name("doc:1"));
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(status("doc:1"), "starting");
  F::send(w, {{"type", "started"}});
  run();
  EXPECT_FALSE(r.has_value());  // answered at `ready`, not before
  F::send(w, {{"type", "ready"}, {"idle", true}});
  run();
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->ok()) << r->error.dump();
  EXPECT_EQ(r->socket_path, state_ + "/sockets/doc%3A1");
  EXPECT_EQ(r->pid, w.pid);
  EXPECT_TRUE(r->cold);
  struct stat st;
  EXPECT_EQ(::stat(r->socket_path.c_str(), &st), 0);  // its listening socket
  EXPECT_EQ(status("doc:1"), "running");
  // A second resolve is answered at once by the same worker: one live worker per address.
  std::optional<Resolution> again;
  resolve("doc:1", again);
  ASSERT_TRUE(again && again->ok());
  EXPECT_FALSE(again->cold);
  EXPECT_EQ(fake_.workers.size(), 1u);
  // An unknown kind is a 404 and launches nothing.
  std::optional<Resolution> unknown;
  resolve("nope:1", unknown);
  ASSERT_TRUE(unknown.has_value());
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(fake_.workers.size(), 1u);
  (void)m;
}

TEST_F(FakeManagerTest, ResolvesDuringAStartWaitForTheSameWorker) {
  make();
  std::optional<Resolution> a, b, c;
  resolve("doc:1", a);
  resolve("doc:1", b);
  resolve("doc:1", c);
  ASSERT_EQ(fake_.workers.size(), 1u);
  start_up(fake_.last());
  for (auto* r : {&a, &b, &c}) {
    ASSERT_TRUE(r->has_value());
    EXPECT_TRUE((*r)->ok());
  }
}

TEST_F(FakeManagerTest, ALaunchFailureFailsTheStart) {
  make();
  fake_.fail_launches = 1;
  std::optional<Resolution> r;
  resolve("doc:1", r);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->error["code"], "start_failed");
  EXPECT_EQ(status("doc:1"), "failed");
  EXPECT_TRUE(logged("fork: Resource temporarily unavailable"));
  EXPECT_NE(::access((state_ + "/sockets/doc%3A1").c_str(), F_OK), 0);  // no socket left
}

TEST_F(FakeManagerTest, AStartHookThatThrowsFailsWithoutALaunchAndKeepsItsMessagePrivate) {
  kind_.start_hook = [](std::string_view) -> nlohmann::json {
    throw std::runtime_error("SECRET-HOOK");
  };
  Manager& m = make();
  std::optional<Resolution> r;
  resolve("doc:h", r);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->error["code"], "start_failed");
  EXPECT_TRUE(fake_.workers.empty());
  EXPECT_EQ(m.state().dump().find("SECRET"), std::string::npos);
  EXPECT_TRUE(logged("SECRET-HOOK"));
}

// --- Timeouts ---

TEST_F(FakeManagerTest, NoStartedWithinTheStartTimeoutFailsAndKills) {
  kind_.start_timeout_ms = 300;
  Manager& m = make();
  std::optional<Resolution> r;
  resolve("doc:t", r);
  FakeWorker& w = fake_.last();
  run(290);
  EXPECT_FALSE(r.has_value());
  run(20);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->error["code"], "start_timeout");
  EXPECT_TRUE(w.got(SIGKILL));  // no grace: it never took its lock
  run();
  EXPECT_TRUE(w.reaped);
  EXPECT_EQ(m.live_workers(), 0u);
  EXPECT_EQ(status("doc:t"), "failed");
  EXPECT_TRUE(logged("no `started` within 300 ms of the fork"));
}

TEST_F(FakeManagerTest, StartedStopsTheStartTimerAndTheReadyTimerBoundsTheSetup) {
  kind_.start_timeout_ms = 300;
  kind_.ready_timeout_ms = 2'000;
  make();
  std::optional<Resolution> r;
  resolve("doc:slow", r);
  FakeWorker& w = fake_.last();
  F::send(w, {{"type", "started"}});
  run(1'000);  // past the start timer: `started` came before the slow setup
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(status("doc:slow"), "starting");
  EXPECT_FALSE(w.got(SIGKILL));
  F::send(w, {{"type", "ready"}, {"idle", true}});
  run();
  ASSERT_TRUE(r && r->ok());
  EXPECT_EQ(status("doc:slow"), "running");
}

// A worker that takes its lock and never says `ready`: the ready timer fails the address (its
// waiters get the 503 at once), kills it, and its start place goes to the next start.
TEST_F(FakeManagerTest, TheReadyTimerFailsKillsAndFreesTheStartPlace) {
  kind_.start_timeout_ms = 10'000;
  kind_.ready_timeout_ms = 300;
  options_.max_starting = 1;
  Manager& m = make();
  std::optional<Resolution> stuck, stuck2, other;
  resolve("doc:stuck", stuck);
  resolve("doc:stuck", stuck2);
  resolve("doc:other", other);
  FakeWorker& w = fake_.last();
  F::send(w, {{"type", "started"}});
  run(290);
  EXPECT_FALSE(stuck.has_value());
  EXPECT_EQ(status("doc:other"), "queued");  // the one start place is held
  run(20);
  for (auto* r : {&stuck, &stuck2}) {
    ASSERT_TRUE(r->has_value());
    EXPECT_EQ((*r)->error["code"], "ready_timeout");
  }
  EXPECT_TRUE(w.got(SIGKILL));
  run();
  EXPECT_EQ(status("doc:stuck"), "failed");
  EXPECT_TRUE(logged("no `ready` within 300 ms of `started`"));
  ASSERT_EQ(fake_.workers.size(), 2u);
  start_up(fake_.last());
  ASSERT_TRUE(other && other->ok());
  EXPECT_EQ(m.live_workers(), 1u);
  std::optional<Resolution> again;
  resolve("doc:stuck", again);  // failed until retry
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->error["code"], "ready_timeout");
}

TEST_F(FakeManagerTest, TheReadyTimeoutDefaultsToThreeStartTimeouts) {
  kind_.start_timeout_ms = 200;
  make();
  std::optional<Resolution> r;
  resolve("doc:s", r);
  F::send(fake_.last(), {{"type", "started"}});
  run(590);
  EXPECT_FALSE(r.has_value());
  run(20);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->error["code"], "ready_timeout");
}

// --- Failure: sticky until retry ---

TEST_F(FakeManagerTest, ACrashAfterReadyStaysFailedUntilRetry) {
  Manager& m = make();
  FakeWorker& w = running("doc:c");
  F::write_stderr(w, "it went wrong\n");
  run();
  F::crash(w, SIGSEGV);
  run();
  EXPECT_EQ(status("doc:c"), "failed");
  EXPECT_EQ(m.entry("doc:c")["error"]["code"], "worker_exited");
  EXPECT_EQ(m.live_workers(), 0u);
  EXPECT_TRUE(logged("how=\"signal 11\""));
  EXPECT_NE(m.stderr_tail("doc:c").find("it went wrong"), std::string::npos);
  // Stays failed: resolve answers 503 at once, nothing launches, however long we wait.
  std::optional<Resolution> r;
  resolve("doc:c", r);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->error["code"], "worker_exited");
  run(60'000);
  EXPECT_EQ(fake_.workers.size(), 1u);
  EXPECT_EQ(status("doc:c"), "failed");
  // retry clears it; the next resolve launches again.
  EXPECT_TRUE(m.retry("doc:c"));
  EXPECT_FALSE(m.retry("doc:c"));
  EXPECT_TRUE(m.entry("doc:c").is_null());
  running("doc:c");
  EXPECT_EQ(fake_.workers.size(), 2u);
}

TEST_F(FakeManagerTest, AnExitBeforeStartedFailsTheStart) {
  make();
  std::optional<Resolution> r;
  resolve("doc:x", r);
  F::exit_with(fake_.last(), 127);  // an exec failure
  run();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->error["code"], "worker_exited");
  EXPECT_TRUE(logged("exited before `started`: exit 127"));
}

TEST_F(FakeManagerTest, FatalIsRedactedInStateAndWaitersButLoggedInFull) {
  Manager& m = make();
  std::optional<Resolution> r;
  resolve("doc:f", r);
  FakeWorker& w = fake_.last();
  F::send(w, {{"type", "started"}});
  F::send(w, {{"type", "fatal"},
              {"error",
               {{"message", "public message"},
                {"code", "E_TEST"},
                {"stack", "SECRET-42"},
                {"extra", "SECRET-43"}}}});
  run();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->error, (nlohmann::json{{"message", "public message"}, {"code", "E_TEST"}}));
  // The worker is stopped (`shutdown`); the address is failed, its entry redacted.
  shut_down(w);
  EXPECT_EQ(m.live_workers(), 0u);
  EXPECT_EQ(status("doc:f"), "failed");
  EXPECT_EQ(m.state().dump().find("SECRET"), std::string::npos);
  for (auto& [a, entry] : changes_) EXPECT_EQ(entry.dump().find("SECRET"), std::string::npos);
  EXPECT_TRUE(logged("SECRET-42"));
}

// --- The control link ---

TEST_F(FakeManagerTest, ALostLinkAfterReadyIsRecoveredOnceAWindow) {
  kind_.stop_grace_ms = 300;
  options_.link_recovery_window_ms = 60'000;
  Manager& m = make();
  FakeWorker& w = running("doc:l");
  F::close_link(w);  // the process lives on
  run(100);          // kLinkCheckMs later it still lives: a lost link
  EXPECT_TRUE(logged("worker_link_lost"));
  EXPECT_EQ(status("doc:l"), "stopping");
  EXPECT_TRUE(w.got(SIGTERM));  // no link for `shutdown`
  run(300);                     // the grace
  EXPECT_TRUE(w.got(SIGKILL));
  run();
  EXPECT_EQ(m.live_workers(), 0u);
  EXPECT_TRUE(m.entry("doc:l").is_null());  // no failure
  // A second lost link within the window fails the address.
  FakeWorker& w2 = running("doc:l");
  F::close_link(w2);
  run(100);
  EXPECT_EQ(status("doc:l"), "failed");
  EXPECT_EQ(m.entry("doc:l")["error"]["code"], "link_lost");
  run(300);
  EXPECT_EQ(m.live_workers(), 0u);
  // Past the window, a lost link is recovered from again.
  EXPECT_TRUE(m.retry("doc:l"));
  run(60'000);
  FakeWorker& w3 = running("doc:l");
  F::close_link(w3);
  run(100);
  EXPECT_EQ(status("doc:l"), "stopping");
}

TEST_F(FakeManagerTest, ALinkClosedByAnExitingWorkerIsNoLostLink) {
  Manager& m = make();
  FakeWorker& w = running("doc:e");
  F::close_link(w);
  w.exiting = true;  // its exit is on its way
  run(500);
  EXPECT_FALSE(logged("worker_link_lost"));
  EXPECT_EQ(status("doc:e"), "running");
  F::crash(w, SIGKILL);
  run();
  EXPECT_EQ(m.entry("doc:e")["error"]["code"], "worker_exited");  // a crash, not a lost link
}

TEST_F(FakeManagerTest, ALostLinkBeforeReadyFailsTheAddress) {
  kind_.stop_grace_ms = 300;
  make();
  std::optional<Resolution> r;
  resolve("doc:lb", r);
  FakeWorker& w = fake_.last();
  F::send(w, {{"type", "started"}});
  run();
  F::close_link(w);
  run(100);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->error["code"], "link_lost");
  EXPECT_EQ(status("doc:lb"), "failed");
  run(300);  // it ignores SIGTERM: the SIGKILL after the grace ends it
  EXPECT_TRUE(w.reaped);
  EXPECT_TRUE(logged("pid=" + std::to_string(w.pid) + " how=\"signal 9\""));
}

// --- Idle ---

TEST_F(FakeManagerTest, AnIdleWorkerIsStoppedAfterIdleTimeAndStartsAgainOnDemand) {
  kind_.idle_ms = 3'000;
  options_.idle_check_ms = 100;
  Manager& m = make();
  FakeWorker& w = running("doc:i");
  run(2'800);
  EXPECT_EQ(F::last(w, "shutdown"), nullptr);
  run(300);
  EXPECT_EQ(status("doc:i"), "stopping");
  shut_down(w);
  EXPECT_TRUE(m.entry("doc:i").is_null());
  EXPECT_FALSE(logged("worker_failed"));
  EXPECT_TRUE(logged("reason=idle"));
  running("doc:i");
  EXPECT_EQ(fake_.workers.size(), 2u);
}

TEST_F(FakeManagerTest, ABusyWorkerIsKeptUntilItReportsIdle) {
  kind_.idle_ms = 1'000;
  options_.idle_check_ms = 100;
  make();
  FakeWorker& w = running("doc:b", {{"idle", false}});
  run(5'000);
  EXPECT_EQ(status("doc:b"), "running");
  F::send(w, {{"type", "idle"}, {"idle", true}});
  run(900);
  EXPECT_EQ(status("doc:b"), "running");
  run(200);
  EXPECT_EQ(status("doc:b"), "stopping");
}

TEST_F(FakeManagerTest, AConnectionWaitingToBeAcceptedKeepsAnIdleWorker) {
  kind_.idle_ms = 1'000;
  options_.idle_check_ms = 100;
  make();
  running("doc:q");
  auto fd = core::connect_unix(state_ + "/sockets/doc%3Aq");  // nobody accepts it
  ASSERT_TRUE(fd.ok());
  run(3'000);
  EXPECT_EQ(status("doc:q"), "running");
  fd->reset();
}

// --- Stop ---

TEST_F(FakeManagerTest, AStopSendsShutdownRemovesTheSocketAndKillsAfterTheGrace) {
  kind_.stop_grace_ms = 500;
  Manager& m = make();
  FakeWorker& w = running("doc:s");
  std::string path = state_ + "/sockets/doc%3As";
  EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  EXPECT_TRUE(m.stop("doc:s"));
  run();
  EXPECT_EQ(F::last(w, "shutdown")["type"], "shutdown");
  EXPECT_NE(::access(path.c_str(), F_OK), 0);  // a connect now fails before sending anything
  EXPECT_EQ(status("doc:s"), "stopping");
  run(490);
  EXPECT_FALSE(w.got(SIGKILL));
  run(20);
  EXPECT_TRUE(w.got(SIGKILL));
  run();
  EXPECT_TRUE(m.entry("doc:s").is_null());
  EXPECT_FALSE(m.stop("doc:s"));
  // The states seen: starting, running, stopping, then no entry.
  std::vector<std::string> seen;
  for (auto& [a, entry] : changes_)
    seen.push_back(entry.is_null() ? "-" : entry["status"].get<std::string>());
  EXPECT_EQ(seen, (std::vector<std::string>{"starting", "running", "stopping", "-"}));
}

TEST_F(FakeManagerTest, AStopDuringAStartWaitsForStartedThenStopsWithoutAFailure) {
  Manager& m = make();
  std::optional<Resolution> r;
  resolve("doc:d", r);
  FakeWorker& w = fake_.last();
  EXPECT_TRUE(m.stop("doc:d"));
  run();
  EXPECT_EQ(F::last(w, "shutdown"), nullptr);  // not before `started`: it may not hold its lock
  F::send(w, {{"type", "started"}});
  run();
  EXPECT_EQ(F::last(w, "shutdown")["type"], "shutdown");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->error["code"], "stopped");
  shut_down(w);
  EXPECT_TRUE(m.entry("doc:d").is_null());
  EXPECT_FALSE(logged("worker_failed"));
}

TEST_F(FakeManagerTest, ACrashWhileStoppingIsNoFailureAndTheQueuedStartRuns) {
  Manager& m = make();
  FakeWorker& w = running("doc:q");
  EXPECT_TRUE(m.stop("doc:q"));
  run();
  std::optional<Resolution> r;
  resolve("doc:q", r);  // waits for the exit
  EXPECT_EQ(fake_.workers.size(), 1u);
  F::crash(w, SIGSEGV);
  run();
  EXPECT_NE(status("doc:q"), "failed");
  ASSERT_EQ(fake_.workers.size(), 2u);
  start_up(fake_.last());
  ASSERT_TRUE(r && r->ok());
}

// One live worker per address: a start for an address whose worker stops waits for its exit.
TEST_F(FakeManagerTest, AStartDuringAStopWaitsForTheOldWorkersExit) {
  Manager& m = make();
  FakeWorker& old = running("doc:1");
  EXPECT_TRUE(m.stop("doc:1"));
  run();
  std::optional<Resolution> r;
  resolve("doc:1", r);
  run(1'000);
  EXPECT_EQ(fake_.workers.size(), 1u);
  EXPECT_FALSE(r.has_value());
  shut_down(old);
  ASSERT_EQ(fake_.workers.size(), 2u);
  FakeWorker& next = fake_.last();
  EXPECT_TRUE(old.reaped);  // reaped before the next one was launched
  start_up(next);
  ASSERT_TRUE(r && r->ok());
  EXPECT_EQ(r->pid, next.pid);
}

TEST_F(FakeManagerTest, SuspendAnswers503UntilResume) {
  Manager& m = make();
  EXPECT_TRUE(m.suspend("doc:p"));
  std::optional<Resolution> r;
  resolve("doc:p", r);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->error["code"], "suspended");
  EXPECT_TRUE(fake_.workers.empty());
  EXPECT_TRUE(m.resume("doc:p"));
  running("doc:p");
}

TEST_F(FakeManagerTest, CloseCancelsStartsStopsWorkersAndIsDoneAtTheLastExit) {
  Manager& m = make();
  FakeWorker& a = running("doc:a");
  std::optional<Resolution> b;
  resolve("doc:b", b);
  FakeWorker& bw = fake_.last();
  bool done = false;
  m.close([&] { done = true; });
  run();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->error["code"], "closing");
  EXPECT_EQ(F::last(a, "shutdown")["type"], "shutdown");
  std::optional<Resolution> c;
  resolve("doc:c", c);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->error["code"], "closing");
  EXPECT_EQ(fake_.workers.size(), 2u);
  shut_down(a);
  EXPECT_FALSE(done);
  F::send(bw, {{"type", "started"}});  // the stop of a start waits for `started`
  run();
  shut_down(bw);
  EXPECT_TRUE(done);
  EXPECT_FALSE(logged("worker_failed"));
}

TEST_F(FakeManagerTest, TheDestructorKillsAndReapsWhatIsLeft) {
  make();
  FakeWorker& a = running("doc:a");
  manager_.reset();
  EXPECT_TRUE(a.killed_and_waited);
  EXPECT_TRUE(a.reaped);
}

// --- The bounds ---

TEST_F(FakeManagerTest, StartsOverMaxStartingQueueInOrder) {
  options_.max_starting = 2;
  Manager& m = make();
  std::vector<std::optional<Resolution>> r(5);
  for (size_t i = 0; i < r.size(); ++i) resolve("doc:" + std::to_string(i), r[i]);
  ASSERT_EQ(fake_.workers.size(), 2u);
  EXPECT_EQ(status("doc:2"), "queued");
  EXPECT_EQ(m.entry("doc:4")["status"], "queued");
  for (size_t i = 0; i < r.size(); ++i) {
    ASSERT_GT(fake_.workers.size(), i);
    start_up(*fake_.workers[i]);
  }
  std::vector<std::string> order;
  for (auto& w : fake_.workers) order.push_back(w->address);
  EXPECT_EQ(order, (std::vector<std::string>{"doc:0", "doc:1", "doc:2", "doc:3", "doc:4"}));
  for (auto& res : r) EXPECT_TRUE(res && res->ok());
}

TEST_F(FakeManagerTest, AQueuedStartCancelledByAStopLeavesNoTrace) {
  options_.max_starting = 1;
  Manager& m = make();
  std::optional<Resolution> a, b;
  resolve("doc:a", a);
  resolve("doc:b", b);
  EXPECT_EQ(status("doc:b"), "queued");
  EXPECT_TRUE(m.stop("doc:b"));
  run();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->error["code"], "stopped");
  EXPECT_TRUE(m.entry("doc:b").is_null());
  start_up(fake_.last());
  EXPECT_EQ(fake_.workers.size(), 1u);
}

TEST_F(FakeManagerTest, MaxWorkersStopsTheLongestIdleWorkerAndTheStartWaitsForItsExit) {
  options_.max_workers = 2;
  options_.evict_grace_ms = 1'000;
  Manager& m = make();
  FakeWorker& a = running("doc:a");
  run(100);
  FakeWorker& b = running("doc:b");
  run(2'000);
  std::optional<Resolution> c;
  resolve("doc:c", c);
  EXPECT_EQ(status("doc:c"), "queued");
  EXPECT_EQ(F::last(a, "shutdown")["type"], "shutdown");  // the longest idle
  EXPECT_EQ(F::last(b, "shutdown"), nullptr);
  EXPECT_TRUE(logged("worker_evicted"));
  EXPECT_EQ(fake_.workers.size(), 2u);
  shut_down(a);
  ASSERT_EQ(fake_.workers.size(), 3u);
  start_up(fake_.last());
  ASSERT_TRUE(c && c->ok());
  EXPECT_LE(m.live_workers(), 2u);
}

TEST_F(FakeManagerTest, NoIdleWorkerToStopIs503WithRetryAfterAndLeavesNoTrace) {
  options_.max_workers = 1;
  Manager& m = make();
  running("doc:a", {{"idle", false}});
  std::optional<Resolution> b;
  resolve("doc:b", b);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->status, 503);
  EXPECT_EQ(b->error["code"], "worker_limit");
  EXPECT_GT(b->retry_after_s, 0u);
  EXPECT_TRUE(m.entry("doc:b").is_null());
  EXPECT_EQ(fake_.workers.size(), 1u);
}

TEST_F(FakeManagerTest, AStartQueuedLongerThanTheStartTimeoutWithoutProgressIsRefused) {
  kind_.start_timeout_ms = 10'000;
  kind_.ready_timeout_ms = 60'000;
  options_.max_starting = 1;
  options_.idle_check_ms = 100;
  make();
  std::optional<Resolution> a, b;
  resolve("doc:a", a);
  F::send(fake_.last(), {{"type", "started"}});  // then a long setup
  resolve("doc:b", b);
  run(9'000);
  EXPECT_FALSE(b.has_value());
  run(1'500);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->error["code"], "start_limit");
  EXPECT_FALSE(a.has_value());
}

TEST_F(FakeManagerTest, ACrashBeforeReadyRejectsEveryWaiter) {
  make();
  std::vector<std::optional<Resolution>> r(3);
  for (auto& one : r) resolve("doc:x", one);
  ASSERT_EQ(fake_.workers.size(), 1u);
  F::send(fake_.last(), {{"type", "started"}});
  run();
  F::crash(fake_.last(), SIGABRT);
  run();
  for (auto& one : r) {
    ASSERT_TRUE(one.has_value());
    EXPECT_EQ(one->error["code"], "worker_exited");
  }
  EXPECT_EQ(fake_.workers.size(), 1u);
}

TEST_F(FakeManagerTest, AStopBetweenStartedAndReadyRecordsNoFailureAndAResolveStartsAgain) {
  Manager& m = make();
  std::optional<Resolution> r;
  resolve("doc:sr", r);
  FakeWorker& w = fake_.last();
  F::send(w, {{"type", "started"}});
  run();
  EXPECT_EQ(status("doc:sr"), "starting");
  EXPECT_TRUE(m.stop("doc:sr"));
  run();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->error["code"], "stopped");
  std::optional<Resolution> again;
  resolve("doc:sr", again);  // waits for the exit
  EXPECT_EQ(fake_.workers.size(), 1u);
  shut_down(w);
  ASSERT_EQ(fake_.workers.size(), 2u);
  start_up(fake_.last());
  ASSERT_TRUE(again && again->ok());
  EXPECT_EQ(status("doc:sr"), "running");
  EXPECT_FALSE(logged("worker_failed"));
}

// A thousand addresses started and stopped leave no entry, no descriptor and no socket file.
TEST_F(FakeManagerTest, AThousandAddressesLeaveNothingBehind) {
  options_.max_starting = 50;
  Manager& m = make();
  running("doc:warmup");  // opens the kind's log file
  EXPECT_TRUE(m.stop("doc:warmup"));
  run();
  shut_down(fake_.last());
  run();
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
    run();
    ASSERT_EQ(fake_.workers.size(), static_cast<size_t>(base + kBatch + 1));
    for (int i = base; i < base + kBatch; ++i) start_up(*fake_.workers[static_cast<size_t>(i + 1)]);
    EXPECT_EQ(answered, kBatch);
    EXPECT_EQ(ok, kBatch);
    for (int i = base; i < base + kBatch; ++i) m.stop("doc:n" + std::to_string(i));
    run();
    for (int i = base; i < base + kBatch; ++i)
      F::exit_with(*fake_.workers[static_cast<size_t>(i + 1)], 0);
    run();
    ASSERT_EQ(m.live_workers(), 0u);
  }
  EXPECT_TRUE(m.state().empty());
  EXPECT_EQ(fake_.live(), 0u);
  EXPECT_EQ(open_fds(), fds);
  EXPECT_FALSE(logged("worker_failed"));
  size_t sockets = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(state_ + "/sockets"))
    ++sockets;
  EXPECT_EQ(sockets, 0u);
}

// --- Warm spares ---

TEST_F(FakeManagerTest, TheFirstRequestBindsASpareWhichIsReplaced) {
  kind_.spares = 1;
  Manager& m = make();
  run(10);
  ASSERT_EQ(fake_.workers.size(), 1u);
  FakeWorker& spare = fake_.last();
  EXPECT_EQ(spare.address, "");
  EXPECT_EQ(spare.spare, "spare/doc/1");
  F::send(spare, {{"type", "standby"}});
  run();
  std::optional<Resolution> r;
  resolve("doc:1", r);
  auto start = F::last(spare, "start");
  EXPECT_EQ(start["address"], "doc:1");  // the spare got the start: nothing launched for it
  start_up(spare);
  ASSERT_TRUE(r && r->ok());
  EXPECT_EQ(r->pid, spare.pid);
  EXPECT_TRUE(logged("worker_spare_bound"));
  run(1'000);  // the refill waits a little for the bound spare's `ready`, at most kSpareHoldMs
  ASSERT_EQ(fake_.workers.size(), 2u);
  EXPECT_EQ(fake_.last().address, "");  // the new spare
  EXPECT_EQ(m.live_workers(), 2u);
}

TEST_F(FakeManagerTest, ASpareThatExitsUnaskedIsReplacedAfterABackoff) {
  kind_.spares = 1;
  make();
  run(10);
  ASSERT_EQ(fake_.workers.size(), 1u);
  F::crash(fake_.last(), SIGSEGV);
  run();
  EXPECT_TRUE(logged("worker_spare_exited"));
  EXPECT_EQ(fake_.workers.size(), 1u);
  run(200);  // the backoff: 100 ms, then doubling
  EXPECT_EQ(fake_.workers.size(), 2u);
}

// --- Rollouts ---

class FakeRolloutTest : public FakeManagerTest {
 protected:
  void SetUp() override {
    FakeManagerTest::SetUp();
    kind_.code = set('a');
    kind_.reload_timeout_ms = 5'000;
  }
  CodeSet set(char v) {
    CodeSet s;
    s.version = std::string(64, v);
    s.dir = state_ + "/code/" + s.version;
    s.manifest = s.dir + ".json";
    s.files.push_back({"app.py", std::string(64, '0')});
    return s;
  }
  std::optional<RolloutReport> report_;
  void roll(char v) {
    ASSERT_TRUE(manager_->rollout("doc", set(v), [this](const RolloutReport& r) { report_ = r; }));
    run();
  }
};

TEST_F(FakeRolloutTest, InPlaceReloadsAWorkerThatCanAndSetsItsVersion) {
  Manager& m = make();
  FakeWorker& w = running("doc:1", {{"reload", true}});
  EXPECT_EQ(F::last(w, "start")["code"]["version"], std::string(64, 'a'));
  EXPECT_EQ(m.entry("doc:1")["version"], std::string(64, 'a'));
  roll('b');
  auto reload = F::last(w, "reload");
  ASSERT_FALSE(reload.is_null());
  EXPECT_EQ(reload["code"]["version"], std::string(64, 'b'));
  EXPECT_FALSE(report_.has_value());
  F::send(w, {{"type", "reloaded"},
              {"id", reload["id"]},
              {"version", std::string(64, 'b')},
              {"report", {{"ok", 1}}}});
  run();
  ASSERT_TRUE(report_.has_value());
  EXPECT_EQ(report_->failed, 0u);
  ASSERT_EQ(report_->workers.size(), 1u);
  EXPECT_EQ(report_->workers[0]["report"]["ok"], 1);
  EXPECT_EQ(m.entry("doc:1")["version"], std::string(64, 'b'));
  EXPECT_EQ(fake_.workers.size(), 1u);  // in place: no launch
}

TEST_F(FakeRolloutTest, AWorkerThatCannotReloadIsReplacedAndRequestsWaitForTheNewOne) {
  Manager& m = make();
  FakeWorker& old = running("doc:1");  // its `ready` said no `reload`
  roll('b');
  EXPECT_EQ(F::last(old, "reload"), nullptr);
  EXPECT_EQ(F::last(old, "shutdown")["type"], "shutdown");
  std::optional<Resolution> r;
  resolve("doc:1", r);  // waits for the replacement
  EXPECT_FALSE(r.has_value());
  shut_down(old);
  ASSERT_EQ(fake_.workers.size(), 2u);
  FakeWorker& next = fake_.last();
  EXPECT_EQ(F::last(next, "start")["code"]["version"], std::string(64, 'b'));
  start_up(next);
  ASSERT_TRUE(r && r->ok());
  EXPECT_EQ(r->pid, next.pid);
  ASSERT_TRUE(report_.has_value());
  EXPECT_EQ(report_->workers[0]["report"]["restarted"], true);
  EXPECT_EQ(m.entry("doc:1")["version"], std::string(64, 'b'));
}

TEST_F(FakeRolloutTest, AFailedReloadKeepsTheOldVersion) {
  Manager& m = make();
  FakeWorker& w = running("doc:1", {{"reload", true}});
  roll('b');
  auto reload = F::last(w, "reload");
  F::send(w, {{"type", "reloaded"},
              {"id", reload["id"]},
              {"version", std::string(64, 'b')},
              {"error", {{"message", "no", {"code", "reload_failed"}}}}});
  run();
  ASSERT_TRUE(report_.has_value());
  EXPECT_EQ(report_->failed, 1u);
  EXPECT_EQ(m.entry("doc:1")["version"], std::string(64, 'a'));
  EXPECT_EQ(status("doc:1"), "running");
}

TEST_F(FakeRolloutTest, NoReplyWithinTheReloadTimeoutIsAnError) {
  make();
  running("doc:1", {{"reload", true}});
  roll('b');
  run(4'990);
  EXPECT_FALSE(report_.has_value());
  run(20);
  ASSERT_TRUE(report_.has_value());
  EXPECT_EQ(report_->workers[0]["error"]["code"], "reload_timeout");
}

TEST_F(FakeRolloutTest, ACrashDuringTheRolloutIsAnErrorAndTheAddressFails) {
  Manager& m = make();
  FakeWorker& w = running("doc:1", {{"reload", true}});
  roll('b');
  F::crash(w, SIGSEGV);
  run();
  ASSERT_TRUE(report_.has_value());
  EXPECT_EQ(report_->failed, 1u);
  EXPECT_EQ(status("doc:1"), "failed");
  (void)m;
}

TEST_F(FakeRolloutTest, AWorkerStartingDuringAnInPlaceRolloutEndsOnTheNewVersion) {
  kind_.reload = KindConfig::Reload::in_place;
  Manager& m = make();
  std::optional<Resolution> r;
  resolve("doc:s", r);
  FakeWorker& w = fake_.last();
  EXPECT_EQ(F::last(w, "start")["code"]["version"], std::string(64, 'a'));
  roll('b');
  auto reload = F::last(w, "reload");  // sent at once: the worker applies it after its `ready`
  ASSERT_FALSE(reload.is_null());
  start_up(w);
  ASSERT_TRUE(r && r->ok());
  EXPECT_FALSE(report_.has_value());
  F::send(w, {{"type", "reloaded"}, {"id", reload["id"]}, {"version", std::string(64, 'b')}});
  run();
  ASSERT_TRUE(report_.has_value());
  EXPECT_EQ(report_->failed, 0u);
  EXPECT_EQ(m.entry("doc:s")["version"], std::string(64, 'b'));
  EXPECT_EQ(fake_.workers.size(), 1u);
}

// --- The heartbeat ---

TEST_F(FakeManagerTest, AWorkerThatStopsAnsweringPingsIsStoppedAsALostLink) {
  kind_.heartbeat_ms = 1'000;
  make();
  FakeWorker& w = running("doc:h", {{"ping", true}});
  run(1'000);
  auto ping = F::last(w, "ping");
  ASSERT_FALSE(ping.is_null());
  F::send(w, {{"type", "pong"}, {"id", ping["id"]}});
  run(1'000);
  auto ping2 = F::last(w, "ping");
  EXPECT_NE(ping2["id"], ping["id"]);
  run(2'000);  // no pong within 2 x heartbeat
  EXPECT_TRUE(logged("worker_unresponsive"));
  EXPECT_EQ(status("doc:h"), "stopping");
}

}  // namespace
}  // namespace corral::workers
