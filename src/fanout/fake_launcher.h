// FakeLauncher: a fanout::Launcher for tests (supervisor_test.cc). Nothing forks: a "process" is
// a fake pid with the descriptors the supervisor handed it. The test says when it is ready (a byte
// on its ready pipe, as ChildContext::notify_ready writes) and how it ends (an eventfd handed out
// as its pidfd, which the supervisor watches like one); each step of a spawn can be made to fail.
// It checks what a real system would punish: a signal to a reaped pid (pid reuse), two processes
// of a slot with one generation index alive at once. Test-only; lives as long as the test, longer
// than the Supervisor it is given.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "fanout/launcher.h"

namespace corral::fanout {

// One launched fake process, as the test sees it.
struct FakeProcess {
  pid_t pid = 0;
  int slot = 0;
  int cpu = -1;
  uint64_t generation = 0;
  std::vector<int> listen_fds;
  core::UniqueFd ready;        // the child's end of its ready pipe
  core::UniqueFd link;         // the child's end of its link
  core::UniqueFd exit_signal;  // the eventfd handed out as its pidfd (a duplicate)
  std::optional<ProcessExit> exit;
  bool reaped = false;
  bool killed_without_pidfd = false;
  std::vector<int> signals;  // as sent, in order
};

class FakeLauncher final : public Launcher {
 public:
  enum Step { kReadyPipe, kLink, kListen, kLaunch, kPidfd, kSteps };

  // The `times` calls of `step` after the next `after` ones fail.
  void fail(Step step, int times, int after = 0) {
    skip_[step] = after;
    failures_[step] = times;
  }
  int calls(Step step) const { return calls_[step]; }

  core::Result<FdPair> make_ready_pipe() override {
    if (failing(kReadyPipe)) return core::Error{EMFILE, "pipe2: Too many open files"};
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
    return FdPair{core::UniqueFd(fds[0]), core::UniqueFd(fds[1])};
  }
  core::Result<FdPair> make_link() override {
    if (failing(kLink)) return core::Error{EMFILE, "socketpair: Too many open files"};
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds), 0);
    return FdPair{core::UniqueFd(fds[0]), core::UniqueFd(fds[1])};
  }
  core::Result<core::UniqueFd> listen(const core::SocketAddress&) override {
    if (failing(kListen)) return core::Error{EADDRINUSE, "bind: Address already in use"};
    return stand_in_socket();
  }
  core::Result<pid_t> launch(const ChildContext& ctx, const ChildMain&) override {
    if (failing(kLaunch)) return core::Error{EAGAIN, "fork: Resource temporarily unavailable"};
    EXPECT_GE(ctx.ready_fd, 0);
    EXPECT_GE(ctx.link_fd, 0);
    // Processes of a slot that run at once never share a generation index (their QUIC CIDs and
    // forwarding pair): one not reaped yet still holds it.
    for (const auto& p : processes) {
      if (!p->reaped && p->slot == ctx.slot) {
        EXPECT_NE(generation_index(p->generation), generation_index(ctx.generation))
            << "slot " << ctx.slot << ": generation " << ctx.generation << " next to "
            << p->generation;
      }
    }
    auto p = std::make_unique<FakeProcess>();
    p->pid = next_pid_++;
    p->slot = ctx.slot;
    p->cpu = ctx.cpu;
    p->generation = ctx.generation;
    p->listen_fds = ctx.listen_fds;
    p->ready.reset(fcntl(ctx.ready_fd, F_DUPFD_CLOEXEC, 0));
    p->link.reset(fcntl(ctx.link_fd, F_DUPFD_CLOEXEC, 0));
    processes.push_back(std::move(p));
    return processes.back()->pid;
  }
  core::Result<core::UniqueFd> open_pidfd(pid_t pid) override {
    if (failing(kPidfd)) return core::Error{EMFILE, "pidfd_open: Too many open files"};
    FakeProcess* p = find(pid);
    EXPECT_NE(p, nullptr);
    core::UniqueFd fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    p->exit_signal.reset(fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    by_pidfd_[fd.get()] = p;  // a number reused by a later pidfd is that one's
    if (exit_at_start) end(*p, *exit_at_start);
    return fd;
  }
  std::optional<ProcessExit> reap(int pidfd) override {
    auto it = by_pidfd_.find(pidfd);
    if (it == by_pidfd_.end()) {
      ADD_FAILURE() << "reap of fd " << pidfd << ", not a pidfd handed out";
      return std::nullopt;
    }
    FakeProcess* p = it->second;
    if (!p->exit) return std::nullopt;
    EXPECT_FALSE(p->reaped) << "pid " << p->pid << " reaped twice";
    eventfd_t v;
    (void)eventfd_read(p->exit_signal.get(), &v);
    p->reaped = true;
    return p->exit;
  }
  void kill_and_reap(pid_t pid) override {
    FakeProcess* p = find(pid);
    ASSERT_NE(p, nullptr);
    p->signals.push_back(SIGKILL);
    p->exit = ProcessExit{-1, SIGKILL};
    p->reaped = true;
    p->killed_without_pidfd = true;
  }
  void signal(pid_t pid, int signo) override {
    FakeProcess* p = find(pid);
    ASSERT_NE(p, nullptr) << "signal " << signo << " to pid " << pid << ", never launched";
    // After its reap the pid may belong to any other process of the machine.
    EXPECT_FALSE(p->reaped) << "signal " << signo << " to pid " << pid << ", reaped already";
    p->signals.push_back(signo);
  }

  // What the child would do.
  static void ready(FakeProcess& p) {
    ASSERT_TRUE(p.ready);
    ASSERT_EQ(::write(p.ready.get(), "r", 1), 1);
    p.ready.reset();
  }
  static void end(FakeProcess& p, ProcessExit how) {
    ASSERT_FALSE(p.exit) << "pid " << p.pid << " ended twice";
    p.exit = how;
    p.ready.reset();
    p.link.reset();
    ASSERT_TRUE(p.exit_signal);
    (void)eventfd_write(p.exit_signal.get(), 1);
  }
  static void crash(FakeProcess& p, int signo = SIGKILL) { end(p, {-1, signo}); }
  static void exit_with(FakeProcess& p, int code) { end(p, {code, 0}); }

  // A descriptor standing in for a listening socket (the supervisor only holds it and passes
  // its number to the child).
  static core::UniqueFd stand_in_socket() { return core::UniqueFd(eventfd(0, EFD_CLOEXEC)); }

  FakeProcess* find(pid_t pid) {
    for (auto& p : processes)
      if (p->pid == pid) return p.get();
    return nullptr;
  }
  std::vector<FakeProcess*> of_slot(int slot) {
    std::vector<FakeProcess*> out;
    for (auto& p : processes)
      if (p->slot == slot) out.push_back(p.get());
    return out;
  }
  std::vector<std::unique_ptr<FakeProcess>> processes;  // every launch, in order
  // Every process ends so as soon as it is started (for a loop the test does not drive).
  std::optional<ProcessExit> exit_at_start;

 private:
  bool failing(Step step) {
    ++calls_[step];
    if (skip_[step] > 0) {
      --skip_[step];
      return false;
    }
    if (failures_[step] == 0) return false;
    --failures_[step];
    return true;
  }
  pid_t next_pid_ = 1000;
  int calls_[kSteps] = {};
  int skip_[kSteps] = {};
  int failures_[kSteps] = {};
  std::map<int, FakeProcess*> by_pidfd_;
};

}  // namespace corral::fanout
