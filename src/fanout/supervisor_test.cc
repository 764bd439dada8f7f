// The supervisor in-process, on a fake clock and a fake launcher (fake_launcher.h): nothing forks
// and nothing sleeps. Time moves only when a test advances `now_ms`.
#include "fanout/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "core/event_loop.h"
#include "core/log.h"
#include "fanout/fake_launcher.h"

namespace corral::fanout {
namespace {

const std::vector<int> kNoSignals;

class SupervisorTest : public ::testing::Test {
 protected:
  SupervisorTest() : log_fd_(memfd_create("supervisor_test_log", MFD_CLOEXEC)) {}

  static SupervisorOptions options(int processes) {
    SupervisorOptions o;
    o.processes = processes;
    return o;  // stable 1 s, backoff 100 ms .. 30 s, stop timeout 20 s: the defaults
  }
  // A set with one address whose sockets are stand-ins (or, with `sockets` false, closed, so a
  // spawn must listen).
  static std::shared_ptr<ListenerSet> listener_set(int slots, bool sockets = true) {
    auto set = std::make_shared<ListenerSet>();
    set->addresses.push_back(core::parse_address("127.0.0.1:8080").value());
    set->slots.resize(static_cast<size_t>(slots));
    for (auto& slot : set->slots)
      slot.push_back(sockets ? FakeLauncher::stand_in_socket() : core::UniqueFd());
    return set;
  }
  void make(SupervisorOptions o) {
    sup = std::make_unique<Supervisor>(loop, log, fake, std::move(o));
    sup->on_finished = [this] { ++finished; };
  }
  void start(SupervisorOptions o, std::shared_ptr<ListenerSet> set = nullptr) {
    if (!set) set = listener_set(o.processes);
    listeners = set;
    make(std::move(o));
    auto r = sup->start(listeners, child_main);
    ASSERT_TRUE(r.ok()) << r.error().reason;
  }
  // Lets the loop handle what is pending now (an exit, a ready byte, what their callbacks
  // deferred), then advances the fake clock by `ms` and handles what came due. A respawn "at
  // once" is a timer due now, which the wheel fires on its next millisecond: run(1) after an exit.
  void run(uint64_t ms = 0) {
    for (int i = 0; i < 3; ++i) loop.run_once(0);
    if (ms == 0) return;
    now_ms += ms;
    for (int i = 0; i < 3; ++i) loop.run_once(0);
  }
  SlotState slot(int i) { return sup->state()[static_cast<size_t>(i)]; }
  FakeProcess& last() { return *fake.processes.back(); }
  FakeProcess& process(size_t i) { return *fake.processes.at(i); }
  std::string log_text() {
    std::string out(static_cast<size_t>(lseek(log_fd_.get(), 0, SEEK_END)), '\0');
    EXPECT_EQ(pread(log_fd_.get(), out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
    return out;
  }

  uint64_t now_ms = 5'000'000;
  int finished = 0;
  core::EventLoop loop{[this] { return now_ms; }};
  core::UniqueFd log_fd_;
  core::Logger log{log_fd_.get(), core::LogLevel::kInfo};
  FakeLauncher fake;
  ChildMain child_main = [](const ChildContext&) { return 0; };  // never run: nothing forks
  std::shared_ptr<ListenerSet> listeners;
  std::unique_ptr<Supervisor> sup;  // last: destroyed before the launcher and the loop
};

// --- respawn ------------------------------------------------------------------------------------

TEST_F(SupervisorTest, ACrashedProcessIsRespawnedIntoItsSlotWithItsSocketAndCpu) {
  auto o = options(2);
  o.pin = true;
  o.cpus = {3, 5};
  start(o);
  ASSERT_EQ(fake.processes.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    FakeProcess& p = process(static_cast<size_t>(i));
    EXPECT_EQ(p.slot, i);
    EXPECT_EQ(p.generation, 1u);
    EXPECT_EQ(p.cpu, i == 0 ? 3 : 5);
    EXPECT_EQ(p.listen_fds, std::vector<int>{listeners->slots[static_cast<size_t>(i)][0].get()});
    EXPECT_EQ(slot(i).status, "starting");
    FakeLauncher::ready(p);
  }
  run();
  EXPECT_EQ(slot(0).status, "running");
  EXPECT_EQ(slot(1).status, "running");

  run(5'000);  // a stable run: respawned at once
  FakeLauncher::crash(process(1), SIGKILL);
  run(1);
  ASSERT_EQ(fake.processes.size(), 3u);
  FakeProcess& again = last();
  EXPECT_EQ(again.slot, 1);
  EXPECT_EQ(again.cpu, 5);
  EXPECT_EQ(again.listen_fds, process(1).listen_fds);  // the same socket: its queue waited
  EXPECT_TRUE(listeners->slots[1][0]);
  SlotState s = slot(1);
  EXPECT_EQ(s.pid, again.pid);
  EXPECT_EQ(s.restarts, 1u);
  EXPECT_EQ(s.last_exit, "signal 9");
  EXPECT_EQ(s.backoff_ms, 0u);
  EXPECT_EQ(s.status, "starting");
  EXPECT_EQ(slot(0).pid, process(0).pid);  // the other slot is not touched
  EXPECT_EQ(slot(0).restarts, 0u);
  FakeLauncher::ready(again);
  run();
  EXPECT_EQ(slot(1).status, "running");

  // A non-zero exit is a crash too.
  run(5'000);
  FakeLauncher::exit_with(again, 3);
  run(1);
  ASSERT_EQ(fake.processes.size(), 4u);
  EXPECT_EQ(last().slot, 1);
  EXPECT_EQ(slot(1).last_exit, "exit 3");
  EXPECT_EQ(slot(1).restarts, 2u);
  EXPECT_EQ(finished, 0);
  EXPECT_EQ(process(0).signals, kNoSignals);
}

// Every process killed in one round: each slot is respawned, and the supervisor, which sees no
// process for a moment, does not take that for the end.
TEST_F(SupervisorTest, EveryProcessKilledAtOnceIsRespawned) {
  start(options(2));
  for (auto& p : fake.processes) FakeLauncher::ready(*p);
  run(5'000);
  FakeLauncher::crash(process(0));
  FakeLauncher::crash(process(1));
  run(1);
  ASSERT_EQ(fake.processes.size(), 4u);
  EXPECT_EQ(process(2).slot, 0);
  EXPECT_EQ(process(3).slot, 1);
  EXPECT_EQ(slot(0).pid, process(2).pid);
  EXPECT_EQ(slot(1).pid, process(3).pid);
  EXPECT_EQ(finished, 0);
}

TEST_F(SupervisorTest, ExitZeroAndBadConfigAreNotRespawned) {
  start(options(2));
  for (auto& p : fake.processes) FakeLauncher::ready(*p);
  run(5'000);
  FakeLauncher::exit_with(process(1), 0);
  run();
  run(60'000);  // past any backoff
  ASSERT_EQ(fake.processes.size(), 2u);
  SlotState s1 = slot(1);
  EXPECT_EQ(s1.pid, 0);
  EXPECT_EQ(s1.status, "exited");
  EXPECT_EQ(s1.last_exit, "exit 0");
  EXPECT_EQ(s1.restarts, 0u);
  // Out of the reuseport group: the kernel must not queue connections for nobody.
  EXPECT_FALSE(listeners->slots[1][0]);
  EXPECT_TRUE(listeners->slots[0][0]);
  EXPECT_EQ(finished, 0);  // slot 0 still serves

  FakeLauncher::exit_with(process(0), kExitBadConfig);
  run();
  run(60'000);
  ASSERT_EQ(fake.processes.size(), 2u);
  EXPECT_EQ(slot(0).status, "failed");
  EXPECT_EQ(slot(0).last_exit, "exit 78");
  EXPECT_EQ(finished, 1);  // nothing left to run
  EXPECT_EQ(sup->exit_status(), kExitBadConfig);
  EXPECT_NE(log_text().find("process_bad_config slot=0 exit=78"), std::string::npos);
}

TEST_F(SupervisorTest, EveryProcessExitingZeroFinishesWithStatusOne) {
  start(options(2));
  run(5'000);
  FakeLauncher::exit_with(process(0), 0);
  run();
  EXPECT_EQ(finished, 0);
  FakeLauncher::exit_with(process(1), 0);
  run();
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(sup->exit_status(), 1);
}

TEST_F(SupervisorTest, EveryProcessExitingBadConfigFinishesWithStatus78) {
  start(options(2));
  FakeLauncher::exit_with(process(0), kExitBadConfig);
  FakeLauncher::exit_with(process(1), kExitBadConfig);
  run();
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(fake.processes.size(), 2u);
  EXPECT_EQ(sup->exit_status(), kExitBadConfig);
}

// run_fanout with every process ending at once (its own loop, real time: no timer is involved).
// What it returns is corral serve's exit status.
TEST_F(SupervisorTest, RunFanoutReturnsWhyItsProcessesAllEnded) {
  // run_fanout blocks SIGTERM, SIGINT and SIGHUP for its signalfd: restore the mask after.
  sigset_t mask;
  sigprocmask(SIG_SETMASK, nullptr, &mask);
  alarm(60);  // a bug that kept it running fails the test instead of hanging it
  fake.exit_at_start = ProcessExit{kExitBadConfig, 0};
  EXPECT_EQ(run_fanout(log, fake, options(2), listener_set(2), child_main), kExitBadConfig);
  std::string text = log_text();
  EXPECT_NE(text.find("process_bad_config slot=0 exit=78"), std::string::npos) << text;
  EXPECT_NE(text.find("process_bad_config slot=1 exit=78"), std::string::npos) << text;
  EXPECT_NE(text.find("supervisor_failed"), std::string::npos) << text;
  EXPECT_NE(text.find("supervisor_stopped generation=1 exit=78"), std::string::npos) << text;

  fake.exit_at_start = ProcessExit{0, 0};
  EXPECT_EQ(run_fanout(log, fake, options(2), listener_set(2), child_main), 1);
  EXPECT_NE(log_text().find("supervisor_failed reason=\"every server process exited by itself\" "
                            "exit=1"),
            std::string::npos);

  fake.fail(FakeLauncher::kLaunch, 1);
  EXPECT_EQ(run_fanout(log, fake, options(2), listener_set(2), child_main), -1);
  EXPECT_NE(log_text().find("fanout_failed"), std::string::npos);
  alarm(0);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
}

// --- backoff ------------------------------------------------------------------------------------

TEST_F(SupervisorTest, ACrashLoopBacksOffFrom100msDoublingTo30sAndAStableRunResetsIt) {
  start(options(1));                         // the only server process: the supervisor must stay
  FakeLauncher::crash(process(0), SIGABRT);  // at once: within stable_ms
  run();
  const uint32_t expected[] = {100,   200,    400,    800,    1'600,  3'200,
                               6'400, 12'800, 25'600, 30'000, 30'000, 30'000};
  uint32_t restarts = 0;
  for (uint32_t b : expected) {
    ++restarts;
    SlotState s = slot(0);
    EXPECT_EQ(s.status, "backoff");
    EXPECT_EQ(s.backoff_ms, b);
    EXPECT_EQ(s.restarts, restarts);
    EXPECT_EQ(s.pid, 0);
    EXPECT_EQ(s.last_exit, "signal 6");
    size_t launched = fake.processes.size();
    run(b - 1);
    EXPECT_EQ(fake.processes.size(), launched) << "respawned before its " << b << " ms";
    run(1);
    ASSERT_EQ(fake.processes.size(), launched + 1) << "not respawned after " << b << " ms";
    EXPECT_EQ(slot(0).status, "starting");
    FakeLauncher::crash(last(), SIGABRT);
    run();
  }
  EXPECT_NE(log_text().find("warn process_backoff slot=0 backoff_ms=800 restarts=4"),
            std::string::npos);
  EXPECT_EQ(finished, 0);

  // 999 ms is not a stable run: the backoff still doubles (from its cap: stays 30 s).
  run(30'000);
  FakeLauncher::ready(last());
  run(999);
  FakeLauncher::crash(last());
  run();
  EXPECT_EQ(slot(0).backoff_ms, 30'000u);
  // A run of stable_ms (1 s) resets it: respawned at once, and the next quick crash waits 100 ms.
  run(30'000);
  run(1'000);
  FakeLauncher::crash(last());
  run(1);
  EXPECT_EQ(slot(0).backoff_ms, 0u);
  EXPECT_EQ(slot(0).pid, last().pid);
  EXPECT_EQ(slot(0).status, "starting");
  FakeLauncher::crash(last());
  run();
  EXPECT_EQ(slot(0).backoff_ms, 100u);
  EXPECT_EQ(slot(0).status, "backoff");
  EXPECT_EQ(finished, 0);
}

// --- every error path of a spawn ----------------------------------------------------------------

struct StepCase {
  FakeLauncher::Step step;
  const char* name;
  const char* event;  // what the supervisor logs
};
const StepCase kStepCases[] = {
    {FakeLauncher::kReadyPipe, "ReadyPipe", "spawn_failed"},
    {FakeLauncher::kLink, "LinkSocketpair", "spawn_failed"},
    {FakeLauncher::kListen, "Listen", "listen_failed"},
    {FakeLauncher::kLaunch, "Fork", "fork_failed"},
    {FakeLauncher::kPidfd, "Pidfd", "pidfd_open_failed"},
};

class SpawnFailureTest : public SupervisorTest, public ::testing::WithParamInterface<StepCase> {};

// A respawn that fails at `step` twice backs off (100 ms, then 200 ms) and the third attempt
// brings the slot back, with the only server process: the supervisor never takes the slot for a
// finished one meanwhile.
TEST_P(SpawnFailureTest, ARespawnThatFailsBacksOffAndTheSlotComesBack) {
  const StepCase& c = GetParam();
  start(options(1));
  FakeLauncher::ready(process(0));
  run(5'000);
  // A listen happens only for a slot without its socket (as after its process exited 0).
  if (c.step == FakeLauncher::kListen) listeners->slots[0][0].reset();
  fake.fail(c.step, 2);
  int calls = fake.calls(c.step);
  FakeLauncher::crash(process(0));
  run(1);
  EXPECT_EQ(fake.calls(c.step), calls + 1);  // at once (a stable run), and failed
  EXPECT_EQ(slot(0).status, "backoff");
  EXPECT_EQ(slot(0).backoff_ms, 100u);
  EXPECT_EQ(slot(0).pid, 0);
  EXPECT_EQ(sup->live_processes(), 0u);
  EXPECT_EQ(finished, 0);
  run(99);
  EXPECT_EQ(fake.calls(c.step), calls + 1);
  run(1);
  EXPECT_EQ(fake.calls(c.step), calls + 2);
  EXPECT_EQ(slot(0).backoff_ms, 200u);
  EXPECT_EQ(finished, 0);
  run(199);
  EXPECT_EQ(fake.calls(c.step), calls + 2);
  run(1);
  EXPECT_EQ(fake.calls(c.step), calls + 3);
  // Back: a process in slot 0 with the slot's (possibly fresh) socket.
  ASSERT_EQ(sup->live_processes(), 1u);
  FakeProcess& p = last();
  EXPECT_EQ(slot(0).pid, p.pid);
  EXPECT_EQ(p.slot, 0);
  ASSERT_TRUE(listeners->slots[0][0]);
  EXPECT_EQ(p.listen_fds, std::vector<int>{listeners->slots[0][0].get()});
  FakeLauncher::ready(p);
  run();
  EXPECT_EQ(slot(0).status, "running");
  EXPECT_EQ(slot(0).restarts, 1u);  // one crash; the failed attempts are not restarts
  // A process forked without a pidfd is not left behind.
  for (auto& q : fake.processes) {
    if (q.get() != &p && q->pid != process(0).pid) {
      EXPECT_TRUE(q->killed_without_pidfd);
      EXPECT_EQ(q->signals, std::vector<int>{SIGKILL});
    }
  }
  size_t expected_launches = c.step == FakeLauncher::kPidfd ? 4 : 2;
  EXPECT_EQ(fake.processes.size(), expected_launches);
  EXPECT_NE(log_text().find(std::string("error ") + c.event + " "), std::string::npos)
      << log_text();
  EXPECT_EQ(finished, 0);
}

// At start, a failure in slot 1 backs off like a respawn; one in slot 0 fails start() and
// nothing more is tried.
TEST_P(SpawnFailureTest, AtStartSlotOneBacksOffAndSlotZeroFailsTheStart) {
  const StepCase& c = GetParam();
  bool listen = c.step == FakeLauncher::kListen;
  fake.fail(c.step, 1, /*after=*/1);  // slot 0's call passes
  start(options(2), listener_set(2, /*sockets=*/!listen));
  EXPECT_EQ(slot(1).status, "backoff");
  EXPECT_EQ(slot(1).backoff_ms, 100u);
  EXPECT_EQ(sup->live_processes(), 1u);
  run(100);
  ASSERT_EQ(sup->live_processes(), 2u);
  EXPECT_EQ(last().slot, 1);
  EXPECT_EQ(slot(1).pid, last().pid);

  // A second supervisor whose first spawn fails.
  sup.reset();
  fake.processes.clear();
  fake.fail(c.step, 1);
  listeners = listener_set(2, !listen);
  make(options(2));
  auto r = sup->start(listeners, child_main);
  EXPECT_FALSE(r.ok());
  int calls = fake.calls(c.step);
  run(60'000);
  EXPECT_EQ(fake.calls(c.step), calls);
  EXPECT_EQ(sup->live_processes(), 0u);
  if (c.step != FakeLauncher::kPidfd) {
    EXPECT_TRUE(fake.processes.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Steps, SpawnFailureTest, ::testing::ValuesIn(kStepCases),
                         [](const auto& info) { return std::string(info.param.name); });

// --- terminate ----------------------------------------------------------------------------------

TEST_F(SupervisorTest, TerminateSendsSigtermOnceThenSigkillAtTheDeadline) {
  start(options(2));
  for (auto& p : fake.processes) FakeLauncher::ready(*p);
  run(5'000);
  sup->terminate();
  run();
  EXPECT_TRUE(sup->terminating());
  for (auto& p : fake.processes) EXPECT_EQ(p->signals, std::vector<int>{SIGTERM});
  // Not listening any more: refused, not queued for nobody.
  EXPECT_FALSE(listeners->slots[0][0]);
  EXPECT_FALSE(listeners->slots[1][0]);
  FakeLauncher::exit_with(process(0), 0);
  run();
  EXPECT_EQ(finished, 0);
  run(19'999);
  EXPECT_EQ(process(1).signals, std::vector<int>{SIGTERM});
  run(1);  // stop_timeout_ms
  EXPECT_EQ(process(1).signals, (std::vector<int>{SIGTERM, SIGKILL}));
  EXPECT_EQ(finished, 0);  // until the last reap
  FakeLauncher::crash(process(1), SIGKILL);
  run();
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(sup->live_processes(), 0u);
  EXPECT_EQ(fake.processes.size(), 2u);  // nothing respawned
  EXPECT_EQ(sup->exit_status(), 0);
  run(60'000);
  EXPECT_EQ(finished, 1);
}

TEST_F(SupervisorTest, ASecondTerminateKillsAtOnce) {
  start(options(2));
  for (auto& p : fake.processes) FakeLauncher::ready(*p);
  run(5'000);
  sup->terminate();
  sup->terminate();
  for (auto& p : fake.processes) EXPECT_EQ(p->signals, (std::vector<int>{SIGTERM, SIGKILL}));
  sup->terminate();  // nothing more
  for (auto& p : fake.processes) EXPECT_EQ(p->signals, (std::vector<int>{SIGTERM, SIGKILL}));
  EXPECT_NE(log_text().find("terminate_forced"), std::string::npos);
  FakeLauncher::crash(process(0), SIGKILL);
  run();
  EXPECT_EQ(finished, 0);
  FakeLauncher::crash(process(1), SIGKILL);
  run();
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(fake.processes.size(), 2u);
}

TEST_F(SupervisorTest, TerminateCancelsRespawnsAndFinishesAfterTheLastReap) {
  start(options(2));
  FakeLauncher::ready(process(0));
  FakeLauncher::crash(process(1));  // slot 1 backs off
  run();
  ASSERT_EQ(slot(1).status, "backoff");
  sup->terminate();
  run();
  EXPECT_EQ(process(0).signals, std::vector<int>{SIGTERM});
  EXPECT_EQ(finished, 0);
  FakeLauncher::crash(process(0), SIGSEGV);  // a crash while terminating: not respawned
  run();
  EXPECT_EQ(finished, 1);
  run(60'000);
  EXPECT_EQ(fake.processes.size(), 2u);
}

// --- reload -------------------------------------------------------------------------------------

TEST_F(SupervisorTest, ReloadDrainsEachOldProcessOnlyOnceItsSuccessorIsReady) {
  start(options(2));
  for (auto& p : fake.processes) FakeLauncher::ready(*p);
  run(5'000);
  FakeProcess &old0 = process(0), &old1 = process(1);
  sup->reload(listeners, child_main);
  run();
  ASSERT_EQ(fake.processes.size(), 4u);
  FakeProcess &new0 = process(2), &new1 = process(3);
  EXPECT_EQ((std::pair{new0.slot, new0.generation}), (std::pair{0, uint64_t{2}}));
  EXPECT_EQ((std::pair{new1.slot, new1.generation}), (std::pair{1, uint64_t{2}}));
  EXPECT_EQ(new0.listen_fds, old0.listen_fds);  // the sockets are shared: nothing refused
  // Until they are ready, the old ones serve.
  EXPECT_EQ(old0.signals, kNoSignals);
  EXPECT_EQ(old1.signals, kNoSignals);
  EXPECT_EQ(slot(0).pid, old0.pid);
  EXPECT_EQ(slot(0).generation, 1u);
  run(10'000);
  EXPECT_EQ(old0.signals, kNoSignals);

  FakeLauncher::ready(new0);
  run();
  EXPECT_EQ(old0.signals, std::vector<int>{kDrainSignal});
  EXPECT_EQ(old1.signals, kNoSignals);  // its successor is not ready yet
  EXPECT_EQ(slot(0).pid, new0.pid);
  EXPECT_EQ(slot(0).generation, 2u);
  EXPECT_EQ(slot(0).status, "running");
  EXPECT_EQ(slot(1).pid, old1.pid);
  auto draining = sup->draining();
  ASSERT_EQ(draining.size(), 1u);
  EXPECT_EQ(draining[0].pid, old0.pid);
  EXPECT_EQ(draining[0].status, "draining");

  FakeLauncher::ready(new1);
  run();
  EXPECT_EQ(old1.signals, std::vector<int>{kDrainSignal});
  EXPECT_EQ(sup->draining().size(), 2u);
  // Drained, they exit 0: gone, not respawned, and the slots keep their new processes.
  FakeLauncher::exit_with(old0, 0);
  FakeLauncher::exit_with(old1, 0);
  run();
  run(60'000);
  EXPECT_EQ(fake.processes.size(), 4u);
  EXPECT_TRUE(sup->draining().empty());
  EXPECT_EQ(slot(0).pid, new0.pid);
  EXPECT_EQ(slot(1).pid, new1.pid);
  EXPECT_EQ(slot(0).status, "running");
  EXPECT_EQ(slot(0).restarts, 0u);
  EXPECT_TRUE(listeners->slots[0][0]);
  EXPECT_EQ(finished, 0);
  EXPECT_EQ(sup->generation(), 2u);
}

TEST_F(SupervisorTest, OnServingOnceEveryProcessOfTheGenerationIsReady) {
  std::vector<uint64_t> serving;
  make(options(2));
  sup->on_serving = [&](uint64_t g) { serving.push_back(g); };
  listeners = listener_set(2);
  ASSERT_TRUE(sup->start(listeners, child_main).ok());
  FakeLauncher::ready(process(0));
  run();
  EXPECT_TRUE(serving.empty());  // slot 1 is not accepting yet
  EXPECT_FALSE(sup->serving());
  FakeLauncher::ready(process(1));
  run();
  EXPECT_EQ(serving, std::vector<uint64_t>{1});
  // A respawn after a crash is the same generation: nothing more.
  run(5'000);
  FakeLauncher::crash(process(1), SIGKILL);
  run(1);
  FakeLauncher::ready(last());
  run();
  EXPECT_EQ(serving, std::vector<uint64_t>{1});
  // A reload: once both of its processes are ready.
  sup->reload(listeners, child_main);
  run();
  FakeLauncher::ready(process(3));
  run();
  EXPECT_EQ(serving, std::vector<uint64_t>{1});
  FakeLauncher::ready(process(4));
  run();
  EXPECT_EQ(serving, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(sup->serving());
}

TEST_F(SupervisorTest, AGenerationThatFailsToStartLeavesTheOldOneServing) {
  start(options(2));
  for (auto& p : fake.processes) FakeLauncher::ready(*p);
  run(5'000);
  FakeProcess &old0 = process(0), &old1 = process(1);
  sup->reload(listeners, child_main);
  run();
  ASSERT_EQ(fake.processes.size(), 4u);
  FakeLauncher::exit_with(process(2), 1);               // dies before it is ready
  FakeLauncher::exit_with(process(3), kExitBadConfig);  // finds the new configuration unusable
  run();
  run(60'000);
  EXPECT_EQ(fake.processes.size(), 4u);  // the old ones serve: no respawn of the new ones
  EXPECT_EQ(old0.signals, kNoSignals);
  EXPECT_EQ(old1.signals, kNoSignals);
  EXPECT_EQ(slot(0).pid, old0.pid);
  EXPECT_EQ(slot(1).pid, old1.pid);
  EXPECT_EQ(slot(0).status, "running");
  EXPECT_EQ(slot(1).status, "running");
  EXPECT_TRUE(listeners->slots[0][0]);
  EXPECT_TRUE(listeners->slots[1][0]);
  EXPECT_EQ(finished, 0);
  // The old one's crash later is respawned into the current generation.
  FakeLauncher::crash(old0);
  run(1);
  ASSERT_EQ(fake.processes.size(), 5u);
  EXPECT_EQ(last().slot, 0);
  EXPECT_EQ(last().generation, 2u);
}

TEST_F(SupervisorTest, AReloadWhoseSpawnFailsRetriesWhileTheOldOneServes) {
  start(options(1));
  FakeLauncher::ready(process(0));
  run(5'000);
  fake.fail(FakeLauncher::kLaunch, 1);
  sup->reload(listeners, child_main);
  run();
  EXPECT_EQ(fake.processes.size(), 1u);
  EXPECT_EQ(slot(0).pid, process(0).pid);
  EXPECT_EQ(slot(0).backoff_ms, 100u);
  run(100);
  ASSERT_EQ(fake.processes.size(), 2u);
  EXPECT_EQ(last().generation, 2u);
  EXPECT_EQ(process(0).signals, kNoSignals);
  FakeLauncher::ready(last());
  run();
  EXPECT_EQ(process(0).signals, std::vector<int>{kDrainSignal});
  EXPECT_EQ(slot(0).pid, last().pid);
}

TEST_F(SupervisorTest, AReloadListensAgainForASlotWhoseProcessExitedZero) {
  start(options(2));
  for (auto& p : fake.processes) FakeLauncher::ready(*p);
  run(5'000);
  FakeLauncher::exit_with(process(1), 0);
  run();
  ASSERT_FALSE(listeners->slots[1][0]);
  int listens = fake.calls(FakeLauncher::kListen);
  sup->reload(listeners, child_main);
  run();
  EXPECT_EQ(fake.calls(FakeLauncher::kListen), listens + 1);
  ASSERT_TRUE(listeners->slots[1][0]);
  ASSERT_EQ(fake.processes.size(), 4u);
  EXPECT_EQ(last().slot, 1);
  EXPECT_EQ(last().listen_fds, std::vector<int>{listeners->slots[1][0].get()});
  EXPECT_EQ(slot(1).pid, last().pid);  // no old one: it takes the slot at once
  EXPECT_EQ(slot(1).status, "starting");
}

// Past max_draining, the oldest draining process is closed: SIGTERM, and SIGKILL after
// stop_timeout_ms.
TEST_F(SupervisorTest, AtMostMaxDrainingGenerationsPerSlot) {
  auto o = options(1);
  o.max_draining = 1;
  start(o);
  FakeLauncher::ready(process(0));
  run();
  sup->reload(listeners, child_main);
  run();
  FakeLauncher::ready(process(1));
  run();
  EXPECT_EQ(process(0).signals, std::vector<int>{kDrainSignal});
  sup->reload(listeners, child_main);
  run();
  ASSERT_EQ(fake.processes.size(), 3u);
  FakeLauncher::ready(process(2));
  run();
  EXPECT_EQ(process(1).signals, std::vector<int>{kDrainSignal});
  EXPECT_EQ(process(0).signals, (std::vector<int>{kDrainSignal, SIGTERM}));
  auto draining = sup->draining();
  ASSERT_EQ(draining.size(), 2u);
  EXPECT_EQ((std::pair{draining[0].generation, draining[0].status}),
            (std::pair{uint64_t{1}, std::string("closing")}));
  EXPECT_EQ((std::pair{draining[1].generation, draining[1].status}),
            (std::pair{uint64_t{2}, std::string("draining")}));
  run(19'999);
  EXPECT_EQ(process(0).signals, (std::vector<int>{kDrainSignal, SIGTERM}));
  run(1);
  EXPECT_EQ(process(0).signals, (std::vector<int>{kDrainSignal, SIGTERM, SIGKILL}));
  FakeLauncher::crash(process(0), SIGKILL);
  run();
  EXPECT_EQ(fake.processes.size(), 3u);
  EXPECT_EQ(slot(0).pid, process(2).pid);
  EXPECT_EQ(process(1).signals, std::vector<int>{kDrainSignal});  // within the bound
}

TEST_F(SupervisorTest, MaxDrainingZeroClosesTheOldProcess) {
  auto o = options(1);
  o.max_draining = 0;
  start(o);
  FakeLauncher::ready(process(0));
  run();
  sup->reload(listeners, child_main);
  run();
  FakeLauncher::ready(process(1));
  run();
  EXPECT_EQ(process(0).signals, std::vector<int>{SIGTERM});
  run(20'000);
  EXPECT_EQ(process(0).signals, (std::vector<int>{SIGTERM, SIGKILL}));
}

// The SIGKILL timer of a closed process goes with its reap: its pid may be someone else's by the
// time it would fire (the fake fails a signal to a reaped pid).
TEST_F(SupervisorTest, AClosedProcessThatExitsInTimeIsNotKilledLater) {
  auto o = options(1);
  o.max_draining = 0;
  start(o);
  FakeLauncher::ready(process(0));
  run();
  sup->reload(listeners, child_main);
  run();
  FakeLauncher::ready(process(1));
  run(10'000);
  EXPECT_EQ(process(0).signals, std::vector<int>{SIGTERM});
  FakeLauncher::exit_with(process(0), 0);
  run(60'000);
  EXPECT_EQ(process(0).signals, std::vector<int>{SIGTERM});
  EXPECT_EQ(slot(0).pid, process(1).pid);
  EXPECT_EQ(fake.processes.size(), 2u);
}

// kGenerations (4) indexes: a fifth generation next to a first one that still drains would share
// its QUIC CIDs and forwarding pair. It waits for that one's exit (sent SIGTERM), the fourth
// serving meanwhile. The fake checks at every launch that no live process of the slot has the
// new one's index.
TEST_F(SupervisorTest, GenerationsRunningAtOnceNeverShareAnIndex) {
  start(options(1));  // max_draining: kGenerations - 1 = 3
  FakeLauncher::ready(process(0));
  run();
  for (uint64_t g = 2; g <= 4; ++g) {
    sup->reload(listeners, child_main);
    run();
    ASSERT_EQ(fake.processes.size(), g);
    EXPECT_EQ(last().generation, g);
    FakeLauncher::ready(last());
    run();
  }
  ASSERT_EQ(sup->draining().size(), 3u);  // generations 1, 2, 3 drain (never finishing)
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(process(i).signals, std::vector<int>{kDrainSignal});

  sup->reload(listeners, child_main);  // generation 5: index 1, held by generation 1
  run();
  EXPECT_EQ(fake.processes.size(), 4u);  // waits
  EXPECT_EQ(process(0).signals, (std::vector<int>{kDrainSignal, SIGTERM}));
  EXPECT_EQ(slot(0).pid, process(3).pid);  // generation 4 serves meanwhile
  EXPECT_EQ(finished, 0);
  run(1'000);
  EXPECT_EQ(fake.processes.size(), 4u);
  FakeLauncher::exit_with(process(0), 0);
  run();
  ASSERT_EQ(fake.processes.size(), 5u);
  EXPECT_EQ(last().generation, 5u);
  FakeLauncher::ready(last());
  run();
  EXPECT_EQ(process(3).signals, std::vector<int>{kDrainSignal});
  EXPECT_EQ(slot(0).pid, last().pid);
  EXPECT_EQ(slot(0).generation, 5u);
  // Generations 2, 3, 4 drain: within the bound, none closed.
  EXPECT_EQ(process(1).signals, std::vector<int>{kDrainSignal});
  EXPECT_EQ(process(2).signals, std::vector<int>{kDrainSignal});
}

// The holder of an index that does not leave is killed after stop_timeout_ms, and the waiting
// generation starts then.
TEST_F(SupervisorTest, AnIndexHolderThatOutstaysTheStopTimeoutIsKilled) {
  start(options(1));
  FakeLauncher::ready(process(0));
  run();
  for (int g = 2; g <= 5; ++g) {
    sup->reload(listeners, child_main);
    run();
    if (g < 5) {
      FakeLauncher::ready(last());
      run();
    }
  }
  EXPECT_EQ(fake.processes.size(), 4u);
  run(20'000);
  EXPECT_EQ(process(0).signals, (std::vector<int>{kDrainSignal, SIGTERM, SIGKILL}));
  FakeLauncher::crash(process(0), SIGKILL);
  run();
  ASSERT_EQ(fake.processes.size(), 5u);
  EXPECT_EQ(last().generation, 5u);
}

}  // namespace
}  // namespace corral::fanout
