#include "fanout/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "fanout/cpus.h"

namespace corral::fanout {

void ChildContext::notify_ready() const {
  if (ready_fd < 0) return;
  [[maybe_unused]] ssize_t w = ::write(ready_fd, "r", 1);
  ::close(ready_fd);
}

core::Result<FdPair> ForkLauncher::make_ready_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) return core::errno_error("pipe2");
  return FdPair{core::UniqueFd(fds[0]), core::UniqueFd(fds[1])};
}

core::Result<FdPair> ForkLauncher::make_link() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) < 0)
    return core::errno_error("socketpair");
  return FdPair{core::UniqueFd(fds[0]), core::UniqueFd(fds[1])};
}

core::Result<core::UniqueFd> ForkLauncher::listen(const core::SocketAddress& address) {
  return core::listen_tcp(address, {.backlog = 4096, .reuse_port = true});
}

core::Result<pid_t> ForkLauncher::launch(const ChildContext& ctx, const ChildMain& main) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return core::errno_error("fork");
  if (pid > 0) return pid;
  // The child. Die with the supervisor, and check it did not die already (before prctl).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(0);
  if (ctx.cpu >= 0) {
    if (auto r = pin_to_cpu(ctx.cpu); !r) {
      log_.error("pin_failed", "slot={} cpu={} error=\"{}\"", ctx.slot, ctx.cpu, r.error().reason);
      _exit(kExitBadConfig);
    }
  }
  // The supervisor's signals were blocked for its signalfd: start clean, but for SIGUSR1 (reopen
  // the logs), which the supervisor passes on at any time: its default action would end a
  // process that has not taken it into its own signalfd yet; blocked, it waits for that.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGUSR1);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  fcntl(ctx.ready_fd, F_SETFD, 0);
  // Close everything else we inherited: the epoll and signal fds, pidfds, other slots' sockets,
  // the supervisor's end of the link.
  std::vector<int> keep = {0, 1, 2, ctx.ready_fd, ctx.link_fd, ctx.forward_rx};
  keep.insert(keep.end(), ctx.listen_fds.begin(), ctx.listen_fds.end());
  keep.insert(keep.end(), ctx.udp_fds.begin(), ctx.udp_fds.end());
  for (const auto& tx : ctx.forward_tx) keep.insert(keep.end(), tx.begin(), tx.end());
  std::sort(keep.begin(), keep.end());
  unsigned next = 0;
  for (int fd : keep) {
    if (fd < 0) continue;
    if (static_cast<unsigned>(fd) > next) close_range(next, static_cast<unsigned>(fd) - 1, 0);
    next = static_cast<unsigned>(fd) + 1;
  }
  close_range(next, ~0U, 0);
  _exit(main(ctx));
}

core::Result<core::UniqueFd> ForkLauncher::open_pidfd(pid_t pid) {
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return core::errno_error("pidfd_open");
  return core::UniqueFd(fd);
}

std::optional<ProcessExit> ForkLauncher::reap(int pidfd) {
  siginfo_t info{};
  if (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG) <
          0 ||
      info.si_pid == 0)
    return std::nullopt;
  if (info.si_code == CLD_EXITED) return ProcessExit{info.si_status, 0};
  return ProcessExit{-1, info.si_status};
}

void ForkLauncher::kill_and_reap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

void ForkLauncher::signal(pid_t pid, int signo) {
  kill(pid, signo);
}

}  // namespace corral::fanout
