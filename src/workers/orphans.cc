#include "workers/orphans.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/unique_fd.h"

namespace corral::workers {

namespace {

// A tree deeper than this is killed a level at a time: each killed process's children come to
// the supervisor (the nearest subreaper) and the next sweep finds them.
constexpr int kMaxDepth = 64;

bool read_small(const std::string& path, std::string& out) {
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  out.clear();
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20)) return true;
  }
}

core::UniqueFd open_pidfd(pid_t pid) {
  return core::UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
}

// Whether the process of `pidfd` has exited (a pidfd polls readable then).
bool exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

void signal_kill(int pidfd) {
  (void)syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
}

size_t kill_below(int pidfd, pid_t pid, size_t budget, int depth) {
  signal_kill(pidfd);
  size_t n = 1;
  if (depth >= kMaxDepth) return n;
  std::vector<pid_t> kids = children_of(pid);
  // Read while it lived: the list was its own (its pid cannot name another process before it is
  // reaped). Dead already, its children went to a subreaper: a later sweep's.
  if (exited(pidfd)) return n;
  for (pid_t c : kids) {
    if (n >= budget) break;
    core::UniqueFd child = open_pidfd(c);
    if (!child) continue;
    auto st = proc_stat(c);
    // Its parent still lives after the read, so `pid` named it: the pidfd is of its child.
    if (!st || st->ppid != pid || exited(pidfd)) continue;
    n += kill_below(child.get(), c, budget - n, depth + 1);
  }
  return n;
}

}  // namespace

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  std::string text;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (!read_small(dir + "/" + e->d_name + "/children", text)) continue;
    const char* p = text.c_str();
    char* end = nullptr;
    for (long v = std::strtol(p, &end, 10); end != p; v = std::strtol(p, &end, 10)) {
      if (v > 0) out.push_back(static_cast<pid_t>(v));
      p = end;
    }
  }
  ::closedir(d);
  return out;
}

std::optional<ProcStat> proc_stat(pid_t pid) {
  std::string text;
  if (!read_small("/proc/" + std::to_string(pid) + "/stat", text)) return std::nullopt;
  // pid (comm) state ppid pgrp session ...: comm may hold spaces and ')'.
  size_t paren = text.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  ProcStat st;
  int ppid = 0, pgrp = 0, session = 0;
  if (sscanf(text.c_str() + paren + 1, " %c %d %d %d", &st.state, &ppid, &pgrp, &session) != 4)
    return std::nullopt;
  st.ppid = ppid;
  st.pgrp = pgrp;
  st.session = session;
  return st;
}

size_t kill_tree(int pidfd, pid_t pid, size_t budget) {
  return budget == 0 ? 0 : kill_below(pidfd, pid, budget, 0);
}

SweepResult sweep_orphans(pid_t session, const std::function<bool(pid_t)>& is_worker, bool wait) {
  // Bounded work per sweep on the loop; what is left is found by the next one.
  constexpr size_t kBudget = 4096;
  SweepResult r;
  const pid_t self = getpid();
  for (pid_t c : children_of(self)) {
    if (is_worker(c)) continue;
    // Our child: its pid is ours until we reap it, so the stat and the pidfd below are its.
    auto st = proc_stat(c);
    if (!st || st->ppid != self || st->session == session) continue;
    core::UniqueFd fd = open_pidfd(c);
    if (!fd) continue;
    if (r.killed >= kBudget) {
      ++r.left;
      continue;
    }
    r.killed += kill_tree(fd.get(), c, kBudget - r.killed);
    siginfo_t info{};
    int flags = WEXITED | (wait ? 0 : WNOHANG);
    int rc;
    while ((rc = waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(fd.get()), &info,
                        flags)) < 0 &&
           errno == EINTR) {
    }
    if (rc == 0 && info.si_pid != 0)
      ++r.reaped;
    else
      ++r.left;
  }
  return r;
}

}  // namespace corral::workers
