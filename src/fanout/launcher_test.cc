// The real launcher with real processes: what the fake in fake_launcher.h stands for (the
// supervisor's own logic is tested on the fake, supervisor_test.cc).
#include "fanout/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "core/log.h"

namespace corral::fanout {
namespace {

// Waits (bounded) for a pidfd to say its process exited, then reaps it.
std::optional<ProcessExit> wait_exit(ForkLauncher& launcher, int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  if (poll(&p, 1, 10'000) != 1) return std::nullopt;
  return launcher.reap(pidfd);
}

class ForkLauncherTest : public ::testing::Test {
 protected:
  core::Logger log{2, core::LogLevel::kOff};
  ForkLauncher launcher{log};
};

// The child keeps exactly its context's descriptors (the ready fd inheritable), starts with no
// signal blocked but SIGUSR1 (held until its loop takes it, so a log reopen passed on early never
// ends it), says it is ready, and exits with main's value.
TEST_F(ForkLauncherTest, TheChildKeepsItsDescriptorsAndExitsWithMainsValue) {
  auto ready = launcher.make_ready_pipe();
  auto link = launcher.make_link();
  auto sock = launcher.listen(core::parse_address("127.0.0.1:0").value());
  ASSERT_TRUE(ready.ok() && link.ok() && sock.ok());
  core::UniqueFd stray(eventfd(0, 0));  // not the child's: closed in it
  ChildContext ctx;
  ctx.ready_fd = ready->theirs.get();
  ctx.link_fd = link->theirs.get();
  ctx.listen_fds = {sock->get()};
  int stray_fd = stray.get();
  ChildMain main = [stray_fd](const ChildContext& c) {
    int bad = 0;
    if (fcntl(stray_fd, F_GETFD) != -1 || errno != EBADF) bad |= 1;
    if (fcntl(c.listen_fds[0], F_GETFD) == -1 || fcntl(c.link_fd, F_GETFD) == -1) bad |= 2;
    if (fcntl(c.ready_fd, F_GETFD) & FD_CLOEXEC) bad |= 4;
    sigset_t blocked;
    sigprocmask(SIG_SETMASK, nullptr, &blocked);
    sigset_t only_usr1;
    sigemptyset(&only_usr1);
    sigaddset(&only_usr1, SIGUSR1);
    for (int s = 1; s < NSIG; ++s) {
      if (sigismember(&blocked, s) != sigismember(&only_usr1, s)) bad |= 8;
    }
    c.notify_ready();
    return 40 + bad;
  };
  // As the supervisor's signalfd does.
  sigset_t usr1, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigaddset(&usr1, SIGTERM);
  sigprocmask(SIG_BLOCK, &usr1, &old);
  auto pid = launcher.launch(ctx, main);
  sigprocmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(pid.ok()) << pid.error().reason;
  ready->theirs.reset();
  link->theirs.reset();
  auto pidfd = launcher.open_pidfd(pid.value());
  ASSERT_TRUE(pidfd.ok()) << pidfd.error().reason;
  auto exit = wait_exit(launcher, pidfd->get());
  ASSERT_TRUE(exit);
  EXPECT_EQ(exit->code, 40)
      << "bits: 1 stray open, 2 own fd closed, 4 ready cloexec, 8 mask is not SIGUSR1 alone";
  EXPECT_EQ(exit->signo, 0);
  char b = 0;
  EXPECT_EQ(::read(ready->ours.get(), &b, 1), 1);
  EXPECT_EQ(b, 'r');
}

TEST_F(ForkLauncherTest, ASignalledProcessReapsAsItsSignal) {
  auto ready = launcher.make_ready_pipe();
  auto link = launcher.make_link();
  ASSERT_TRUE(ready.ok() && link.ok());
  ChildContext ctx;
  ctx.ready_fd = ready->theirs.get();
  ctx.link_fd = link->theirs.get();
  auto pid = launcher.launch(ctx, [](const ChildContext& c) {
    c.notify_ready();
    for (;;) pause();
    return 0;
  });
  ASSERT_TRUE(pid.ok());
  ready->theirs.reset();
  auto pidfd = launcher.open_pidfd(pid.value());
  ASSERT_TRUE(pidfd.ok());
  char b;
  ASSERT_EQ(::read(ready->ours.get(), &b, 1), 1);  // running
  EXPECT_FALSE(launcher.reap(pidfd->get()));       // not exited: nothing to reap
  launcher.signal(pid.value(), SIGTERM);
  auto exit = wait_exit(launcher, pidfd->get());
  ASSERT_TRUE(exit);
  EXPECT_EQ(exit->code, -1);
  EXPECT_EQ(exit->signo, SIGTERM);
}

TEST_F(ForkLauncherTest, KillAndReapLeavesNoProcess) {
  auto ready = launcher.make_ready_pipe();
  auto link = launcher.make_link();
  ASSERT_TRUE(ready.ok() && link.ok());
  ChildContext ctx;
  ctx.ready_fd = ready->theirs.get();
  ctx.link_fd = link->theirs.get();
  auto pid = launcher.launch(ctx, [](const ChildContext&) {
    for (;;) pause();
    return 0;
  });
  ASSERT_TRUE(pid.ok());
  launcher.kill_and_reap(pid.value());
  errno = 0;
  EXPECT_EQ(kill(pid.value(), 0), -1);  // reaped: no such process (not a zombie of ours)
  EXPECT_EQ(errno, ESRCH);
}

// A CPU the process may not run on: the child exits kExitBadConfig (not respawned) before main.
TEST_F(ForkLauncherTest, AChildThatCannotBePinnedExitsBadConfig) {
  auto ready = launcher.make_ready_pipe();
  auto link = launcher.make_link();
  ASSERT_TRUE(ready.ok() && link.ok());
  ChildContext ctx;
  ctx.cpu = CPU_SETSIZE - 1;
  ctx.ready_fd = ready->theirs.get();
  ctx.link_fd = link->theirs.get();
  auto pid = launcher.launch(ctx, [](const ChildContext&) { return 0; });
  ASSERT_TRUE(pid.ok());
  auto pidfd = launcher.open_pidfd(pid.value());
  ASSERT_TRUE(pidfd.ok());
  auto exit = wait_exit(launcher, pidfd->get());
  ASSERT_TRUE(exit);
  EXPECT_EQ(exit->code, kExitBadConfig);
}

}  // namespace
}  // namespace corral::fanout
