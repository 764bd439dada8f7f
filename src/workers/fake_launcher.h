// FakeLauncher: a workers::Launcher for the manager's unit tests (manager_fake_test.cc), the twin
// of fanout/fake_launcher.h. Nothing forks: a "worker" is a fake pid with real descriptors, so the
// manager's loop sees them as it sees a child's. The test holds the worker's ends: its control link
// (a SOCK_SEQPACKET pair: the test reads what the manager sent and sends `started`, `ready`, ...),
// its stdout and stderr (pipes the test may write to), and the eventfd handed out as its pidfd,
// which the test's exit() makes readable as a real exit makes a pidfd readable. Signals are
// recorded; a SIGKILL ends the fake at once (as it would a real process), any other signal only
// when the test says so (exit_on_term).
//
// It checks what a real system would punish: a signal to a reaped pid (pid reuse), a reap of a
// worker twice. The test owns the FakeLauncher; the Manager owns the forwarding Launcher that
// borrow() hands out, so the records outlive the manager. Test-only; single-threaded.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "workers/launcher.h"

namespace corral::workers {

// One launched fake worker, as the test sees it.
struct FakeWorker {
  pid_t pid = 0;
  std::string address;  // LaunchSpec::address (wire form; empty: a spare)
  std::string spare;    // LaunchSpec::spare
  std::vector<std::string> command;
  Limits limits;
  core::UniqueFd control;      // the worker's end of its control link
  core::UniqueFd out, err;     // the write ends of its stdout and stderr
  core::UniqueFd exit_signal;  // the eventfd handed out as its pidfd (a duplicate, until reaped)
  std::optional<WorkerExit> exit;
  bool reaped = false;
  bool exiting = false;  // liveness() says `exiting` (killed, its exit not reported yet)
  bool killed_and_waited = false;
  std::vector<int> signals;              // as sent, in order
  std::vector<nlohmann::json> received;  // every message read from the manager, in order

  bool alive() const { return !exit; }
  bool got(int signo) const {
    for (int s : signals)
      if (s == signo) return true;
    return false;
  }
};

class FakeLauncher {
 public:
  FakeLauncher() = default;
  FakeLauncher(const FakeLauncher&) = delete;
  FakeLauncher& operator=(const FakeLauncher&) = delete;

  // The Launcher to give the Manager: forwards to this one, which must outlive it.
  std::unique_ptr<Launcher> borrow() { return std::make_unique<Forward>(*this); }

  // The next `n` launches fail (as a fork or an exec setup failing).
  int fail_launches = 0;
  // SIGTERM ends a fake worker with exit 0 (a worker that honours it), else it is only recorded.
  bool exit_on_term = false;
  int sweeps = 0;                                    // sweep_orphans calls
  std::vector<std::unique_ptr<FakeWorker>> workers;  // every launch, in order

  // What the worker does.
  static void send(FakeWorker& w, const nlohmann::json& msg) {
    ASSERT_TRUE(w.control) << "pid " << w.pid << ": its control link is closed";
    std::string text = msg.dump();
    ASSERT_EQ(::send(w.control.get(), text.data(), text.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(text.size()));
  }
  // The messages the manager sent since the last call (also appended to w.received).
  static std::vector<nlohmann::json> read(FakeWorker& w) {
    std::vector<nlohmann::json> out;
    while (w.control) {
      char buf[64 * 1024];
      ssize_t n = ::recv(w.control.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      out.push_back(nlohmann::json::parse(std::string_view(buf, static_cast<size_t>(n))));
      w.received.push_back(out.back());
    }
    return out;
  }
  // The types of every message read so far (reading what is pending first).
  static std::vector<std::string> types(FakeWorker& w) {
    read(w);
    std::vector<std::string> out;
    for (const auto& m : w.received) out.push_back(m.value("type", ""));
    return out;
  }
  // The last message of `type` read so far (reading what is pending first); null if none.
  static nlohmann::json last(FakeWorker& w, std::string_view type) {
    read(w);
    for (auto it = w.received.rbegin(); it != w.received.rend(); ++it)
      if ((*it)["type"] == type) return *it;
    return nullptr;
  }
  static void write_stderr(FakeWorker& w, std::string_view text) {
    ASSERT_EQ(::write(w.err.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  // Its control link closes (the worker closed fd 3), the process lives on.
  static void close_link(FakeWorker& w) { w.control.reset(); }
  // It ends: its descriptors close and its pidfd reports the exit.
  static void end(FakeWorker& w, WorkerExit how) {
    ASSERT_FALSE(w.exit) << "pid " << w.pid << " ended twice";
    w.exit = how;
    w.control.reset();
    w.out.reset();
    w.err.reset();
    ASSERT_TRUE(w.exit_signal);
    (void)eventfd_write(w.exit_signal.get(), 1);
  }
  static void exit_with(FakeWorker& w, int code) { end(w, {code, 0, {}}); }
  static void crash(FakeWorker& w, int signo = SIGSEGV) { end(w, {-1, signo, {}}); }

  FakeWorker* find(pid_t pid) {
    for (auto& w : workers)
      if (w->pid == pid) return w.get();
    return nullptr;
  }
  // The launches for `address` (raw; spares have none), in order.
  std::vector<FakeWorker*> of(std::string_view address) {
    std::vector<FakeWorker*> out;
    for (auto& w : workers)
      if (w->address == address) out.push_back(w.get());
    return out;
  }
  FakeWorker& last() { return *workers.back(); }
  size_t live() const {
    size_t n = 0;
    for (const auto& w : workers) n += !w->reaped;
    return n;
  }

 private:
  class Forward final : public Launcher {
   public:
    explicit Forward(FakeLauncher& f) : f_(f) {}
    core::Result<Launched> launch(const LaunchSpec& spec) override { return f_.launch(spec); }
    void signal(pid_t pid, int, int sig) override { f_.signal(pid, sig); }
    std::optional<WorkerExit> reap(pid_t pid, int) override { return f_.reap(pid); }
    Liveness liveness(pid_t pid, int) override {
      FakeWorker* w = f_.find(pid);
      if (!w || w->exit) return Liveness::exited;
      return w->exiting ? Liveness::exiting : Liveness::alive;
    }
    void kill_and_wait(pid_t pid, int) override {
      FakeWorker* w = f_.find(pid);
      ASSERT_NE(w, nullptr);
      EXPECT_FALSE(w->reaped) << "pid " << pid << " killed after its reap";
      w->signals.push_back(SIGKILL);
      if (!w->exit) FakeLauncher::end(*w, {-1, SIGKILL, {}});
      w->reaped = true;
      w->killed_and_waited = true;
    }
    bool become_subreaper() override { return true; }
    SweepResult sweep_orphans(pid_t, const std::function<bool(pid_t)>&, bool) override {
      ++f_.sweeps;
      return {};
    }

   private:
    FakeLauncher& f_;
  };

  core::Result<Launched> launch(const LaunchSpec& spec) {
    if (fail_launches > 0) {
      --fail_launches;
      return core::Error{EAGAIN, "fork: Resource temporarily unavailable"};
    }
    if (spec.command.empty() && !spec.in_process)
      return core::Error{EINVAL, "the kind has no command"};
    EXPECT_GE(spec.listen_fd, 0);
    auto w = std::make_unique<FakeWorker>();
    w->pid = next_pid_++;
    w->address = spec.address;
    w->spare = spec.spare;
    w->command = spec.command;
    w->limits = spec.limits;
    Launched l;
    l.pid = w->pid;
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    l.control.reset(sv[0]);
    w->control.reset(sv[1]);
    int p[2];
    EXPECT_EQ(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    l.out.reset(p[0]);
    w->out.reset(p[1]);
    EXPECT_EQ(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    l.err.reset(p[0]);
    w->err.reset(p[1]);
    l.pidfd.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    w->exit_signal.reset(fcntl(l.pidfd.get(), F_DUPFD_CLOEXEC, 0));
    workers.push_back(std::move(w));
    return l;
  }
  void signal(pid_t pid, int sig) {
    FakeWorker* w = find(pid);
    ASSERT_NE(w, nullptr) << "signal " << sig << " to pid " << pid << ", never launched";
    // After its reap the pid may belong to any other process of the machine.
    EXPECT_FALSE(w->reaped) << "signal " << sig << " to pid " << pid << ", reaped already";
    w->signals.push_back(sig);
    if (w->exit) return;
    if (sig == SIGKILL) end(*w, {-1, SIGKILL, {}});
    if (sig == SIGTERM && exit_on_term) end(*w, {0, 0, {}});
  }
  std::optional<WorkerExit> reap(pid_t pid) {
    FakeWorker* w = find(pid);
    if (!w) {
      ADD_FAILURE() << "reap of pid " << pid << ", never launched";
      return std::nullopt;
    }
    if (!w->exit) return std::nullopt;
    EXPECT_FALSE(w->reaped) << "pid " << pid << " reaped twice";
    eventfd_t v;
    (void)eventfd_read(w->exit_signal.get(), &v);
    w->exit_signal.reset();  // as a reaped process holds nothing any more
    w->reaped = true;
    return w->exit;
  }

  pid_t next_pid_ = 1000;
};

}  // namespace corral::workers
