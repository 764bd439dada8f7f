#include "workers/launcher.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace corral::workers {

namespace {

[[noreturn]] void child_fail(const char* what) {
  // Async-signal-safe: write(2) only. This lands in the worker's stderr pipe, so in its log.
  const char* err = strerror(errno);
  [[maybe_unused]] ssize_t w = ::write(2, "corral: ", 8);
  w = ::write(2, what, strlen(what));
  w = ::write(2, ": ", 2);
  w = ::write(2, err, strlen(err));
  w = ::write(2, "\n", 1);
  _exit(127);
}

}  // namespace

ProcessLauncher::ProcessLauncher() : containment_(Containment::rlimits_only()) {}

ProcessLauncher::ProcessLauncher(std::unique_ptr<Containment> containment)
    : containment_(std::move(containment)) {}

ExitCause ProcessLauncher::reaped(pid_t pid) {
  return containment_->reaped(pid);
}

void ProcessLauncher::signal(pid_t pid, int pidfd, int sig) {
  kill(-pid, sig);
  (void)syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0);
}

std::optional<WorkerExit> ProcessLauncher::reap(pid_t pid, int pidfd) {
  // The leader is a zombie until reaped, so its pid (= the group id) cannot be reused yet: kill
  // whatever it left in its group first. A worker's process group does not outlive it.
  kill(-pid, SIGKILL);
  siginfo_t info{};
  if (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG) <
          0 ||
      info.si_pid == 0)
    return std::nullopt;
  WorkerExit exit;
  if (info.si_code == CLD_EXITED) {
    exit.code = info.si_status;
  } else {
    exit.code = -1;
    exit.signo = info.si_status;
  }
  exit.cause = containment_->reaped(pid);  // its group is removed (containment.h)
  return exit;
}

namespace {

// Whether `pid` is on its way out (the kernel's PF_EXITING in /proc/PID/stat's flags): killed or
// exiting, but not yet reported by its pidfd. A process whose threads take long to die (a busy
// machine, many threads) closes its fds only with its last thread, and the exit follows.
bool exiting(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // gone already
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  // pid (comm) state ppid pgrp session tty_nr tpgid flags ...: comm may hold spaces and ')'.
  const char* p = strrchr(buf, ')');
  if (!p) return false;
  unsigned long flags = 0;
  char state = 0;
  if (sscanf(p + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2) return false;
  constexpr unsigned long kPfExiting = 0x4;
  return state == 'Z' || state == 'X' || (flags & kPfExiting) != 0;
}

}  // namespace

Liveness ProcessLauncher::liveness(pid_t pid, int pidfd) {
  siginfo_t info{};
  if (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info,
             WEXITED | WNOHANG | WNOWAIT) == 0 &&
      info.si_pid != 0)
    return Liveness::exited;
  return exiting(pid) ? Liveness::exiting : Liveness::alive;
}

void ProcessLauncher::kill_and_wait(pid_t pid, int pidfd) {
  signal(pid, pidfd, SIGKILL);
  siginfo_t info{};
  while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED) < 0 &&
         errno == EINTR) {
  }
}

bool ProcessLauncher::become_subreaper() {
  return prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
}

SweepResult ProcessLauncher::sweep_orphans(pid_t session,
                                           const std::function<bool(pid_t)>& is_worker, bool wait) {
  return workers::sweep_orphans(session, is_worker, wait);
}

namespace {

// What the child executes, built before fork() (after it, only async-signal-safe calls): the
// environment, with corral's variables, and the argument vector. Filled in place: envp and argv
// point into the strings.
struct ExecPlan {
  std::vector<std::string> env_strings, args;
  std::vector<char*> envp, argv;
};

void plan_exec(const LaunchSpec& spec, ExecPlan& plan) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) env[std::string(kv.substr(0, eq))] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : spec.env) env[k] = v;
  env["CORRAL_CONTROL_FD"] = "3";
  env["CORRAL_LISTEN_FD"] = "4";
  if (spec.address.empty())
    env.erase("CORRAL_ADDRESS");  // a warm spare: `start` names its address
  else
    env["CORRAL_ADDRESS"] = spec.address;
  env["CORRAL_STATE_DIR"] = spec.state_dir;
  plan.env_strings.reserve(env.size());
  for (const auto& [k, v] : env) plan.env_strings.push_back(k + "=" + v);
  for (auto& s : plan.env_strings) plan.envp.push_back(s.data());
  plan.envp.push_back(nullptr);
  plan.args = spec.command;
  for (auto& s : plan.args) plan.argv.push_back(s.data());
  plan.argv.push_back(nullptr);
}

// The child's descriptors before they are put in place: 0 /dev/null, 1 and 2 the output pipes,
// 3 the control socket, 4 the listening socket.
struct ChildFds {
  int fds[5];
};

// In the child, after fork(): confined, in its own session, a subreaper, with the normal scheduling
// policy, clean signals and exactly descriptors 0-4; then the command (or the in-process
// function). Never returns.
[[noreturn]] void become_worker(const LaunchSpec& spec, const Confinement& confinement,
                                ExecPlan& plan, ChildFds child, pid_t parent) {
  // First of all: the worker's group (so all it forks is inside too) and its rlimits.
  const char* step = nullptr;
  if (!Containment::enter(confinement, &step)) child_fail(step);
  // A session of its own (and so a process group of its own, both its pid): nothing the worker
  // starts can join the supervisor's session or process group, which is how the supervisor tells
  // a worker's orphans from its own children (orphans.h).
  if (setsid() < 0) child_fail("setsid");
  // Its orphans (a daemon's fork, setsid, fork) are adopted by the worker, not by init: while it
  // lives, everything it started is below it, and at its exit comes to the supervisor.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) child_fail("prctl(PR_SET_CHILD_SUBREAPER)");
  // A worker never keeps the supervisor's real-time policy (corral under chrt, a benchmark's
  // --priority rt): under SCHED_FIFO a worker thread that spins waiting for another thread of
  // the same process on its CPU never yields (seen with Node workers), and a runaway worker
  // would hold a CPU against everything else. Workers get the normal policy.
  if (int policy = sched_getscheduler(0); policy == SCHED_FIFO || policy == SCHED_RR) {
    sched_param normal{};
    sched_setscheduler(0, SCHED_OTHER, &normal);
  }
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(0);  // the supervisor died before prctl
  // The supervisor blocks its signals for a signalfd and ignores SIGPIPE: start clean.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s = 1; s < NSIG; ++s) signal(s, SIG_DFL);
  // Move every descriptor we keep above 4 first, so the dup2()s below cannot clobber one.
  for (int& fd : child.fds) {
    fd = fcntl(fd, F_DUPFD_CLOEXEC, 5);
    if (fd < 0) child_fail("fcntl(F_DUPFD)");
  }
  for (int target = 0; target < 5; ++target) {
    if (dup2(child.fds[target], target) < 0) child_fail("dup2");  // dup2 clears FD_CLOEXEC
  }
  close_range(5, ~0U, 0);
  // The listening socket was made non-blocking for nobody in particular: workers block.
  int fl = fcntl(4, F_GETFL);
  if (fl >= 0) fcntl(4, F_SETFL, fl & ~O_NONBLOCK);
  if (spec.in_process) {
    environ = plan.envp.data();  // what getenv() reads: CORRAL_CONTROL_FD and the rest
    int status = spec.in_process();
    fflush(nullptr);  // stdio buffers, which _exit would drop
    _exit(status);
  }
  execvpe(plan.argv[0], plan.argv.data(), plan.envp.data());
  child_fail(plan.argv[0]);
}

}  // namespace

core::Result<Launched> ProcessLauncher::launch(const LaunchSpec& spec) {
  if (spec.command.empty() && !spec.in_process)
    return core::Error{EINVAL, "the kind has no command"};
  ExecPlan plan;
  plan_exec(spec, plan);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return core::errno_error("socketpair");
  core::UniqueFd control(sv[0]), child_control(sv[1]);
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return core::errno_error("pipe2");
  core::UniqueFd out_rd(p[0]), out_wr(p[1]);
  if (pipe2(p, O_CLOEXEC) < 0) return core::errno_error("pipe2");
  core::UniqueFd err_rd(p[0]), err_wr(p[1]);
  core::UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull) return core::errno_error("open /dev/null");
  auto confinement =
      containment_->prepare(spec.address.empty() ? spec.spare : spec.address, spec.limits);
  if (!confinement) return confinement.error();

  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    auto e = core::errno_error("fork");
    containment_->adopt(std::move(confinement.value()), 0);
    return e;
  }
  if (pid == 0) {
    become_worker(
        spec, confinement.value(), plan,
        ChildFds{{devnull.get(), out_wr.get(), err_wr.get(), child_control.get(), spec.listen_fd}},
        parent);
  }
  containment_->adopt(std::move(confinement.value()), pid);
  Launched l;
  l.pid = pid;
  // The child makes its own session; the parent cannot set its group for it (a group leader's
  // setsid fails). Until it has, a kill of its group misses it: the manager signals the worker
  // through its pidfd as well.
  l.pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!l.pidfd) {
    auto e = core::errno_error("pidfd_open");
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    (void)containment_->reaped(pid);
    return e;
  }
  for (int fd : {control.get(), out_rd.get(), err_rd.get()})
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  l.control = std::move(control);
  l.out = std::move(out_rd);
  l.err = std::move(err_rd);
  return l;
}

}  // namespace corral::workers
