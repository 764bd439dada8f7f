// Launcher: every call the supervisor makes to the OS to start, signal and reap a server
// process, behind one interface (STYLE rule 5), so its respawn, backoff, termination and
// generations run in a unit test on a fake clock with fake processes (supervisor_test.cc): no
// fork, no sleep, and each step of a spawn can be made to fail.
//
// The steps of a spawn, in the supervisor's order: the ready pipe, the link socketpair, a fresh
// listening socket for a slot whose sockets were closed, the fork (which runs the ChildMain in the
// child), the pidfd. A readable pidfd means the process exited; reap() says how. ForkLauncher is
// the real one (`corral serve`, run_fanout's callers). workers::Launcher is the same seam for the
// worker manager, which execs a command in one call; a server process is forked in steps, each of
// which can fail on its own.
//
// A launcher is borrowed by its Supervisor and must outlive it. Single-threaded, like the
// supervisor; ForkLauncher holds no state but the logger its children log to.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/log.h"
#include "core/result.h"
#include "core/socket.h"
#include "core/unique_fd.h"
#include "fanout/quic_sockets.h"

namespace corral::fanout {

constexpr int kExitBadConfig = 78;  // a child exiting with this is not respawned

// What a child gets: its slot, its CPU, its sockets, and a way to say it is serving. Every
// descriptor in it is one the child keeps; the child closes every other one it inherited.
struct ChildContext {
  int slot = 0;
  int cpu = -1;  // -1: not pinned
  uint64_t generation = 0;
  std::vector<int> listen_fds;  // this slot's sockets, one per address (owned by the child)
  // QUIC (empty without SupervisorOptions::quic): this slot's UDP sockets, one per QUIC address;
  // this slot's forwarding socket of this generation's index (read end); every slot's forwarding
  // write ends, by slot and generation index (generation % kGenerations: the processes of a slot
  // that run at once read different pairs); the shared serving generation per slot.
  std::vector<int> udp_fds;
  int forward_rx = -1;
  std::vector<std::array<int, kGenerations>> forward_tx;
  const std::atomic<uint64_t>* quic_serving = nullptr;
  int ready_fd = -1;
  int link_fd = -1;  // SOCK_SEQPACKET to the supervisor (resolve addresses, later counters)
  // Tells the supervisor this process is serving (listeners adopted, routes published).
  void notify_ready() const;
};

// Runs in the forked child; its return value is the child's exit status. It must not return into
// the caller's stack frames in any other way (the launcher _exit()s with the value).
using ChildMain = std::function<int(const ChildContext&)>;

// How a process ended: exit `code` (signo 0), or killed by `signo` (code -1).
struct ProcessExit {
  int code = 0;
  int signo = 0;
};

// Two ends: the supervisor's and the child's.
struct FdPair {
  core::UniqueFd ours;
  core::UniqueFd theirs;
};

class Launcher {
 public:
  virtual ~Launcher() = default;

  // The pipe a child writes one byte to once it serves (ChildContext::notify_ready).
  virtual core::Result<FdPair> make_ready_pipe() = 0;
  // The child's SOCK_SEQPACKET link to the supervisor (core::MessageLink on both ends).
  virtual core::Result<FdPair> make_link() = 0;
  // A listening socket joining `address`'s SO_REUSEPORT group, for a slot whose sockets were
  // closed (its process exited 0 or 78) and that a reload starts again.
  virtual core::Result<core::UniqueFd> listen(const core::SocketAddress& address) = 0;
  // Starts a process running main(ctx) and exiting with its value; the descriptors in `ctx` are
  // the supervisor's and stay open here (the caller closes its copies). The child dies with the
  // supervisor, and runs pinned to ctx.cpu if that is >= 0 (exit kExitBadConfig if it cannot).
  virtual core::Result<pid_t> launch(const ChildContext& ctx, const ChildMain& main) = 0;
  // A descriptor that becomes readable (EPOLLIN) when `pid` exits.
  virtual core::Result<core::UniqueFd> open_pidfd(pid_t pid) = 0;
  // After `pidfd` was readable: how the process ended, or nothing if it has not (a spurious
  // wakeup). Reaps it: its pid may be reused afterwards.
  virtual std::optional<ProcessExit> reap(int pidfd) = 0;
  // A process started without a pidfd (open_pidfd failed): SIGKILL it and wait for it.
  virtual void kill_and_reap(pid_t pid) = 0;
  virtual void signal(pid_t pid, int signo) = 0;
};

// The real thing: pipe2, socketpair, core::listen_tcp, fork, pidfd_open, waitid, kill. The child
// arms PR_SET_PDEATHSIG(SIGTERM), then checks its parent is still the process that forked it (it
// may have died before prctl), pins itself, unblocks the signals the supervisor's signalfd had
// blocked and closes every inherited descriptor not in its ChildContext.
class ForkLauncher final : public Launcher {
 public:
  explicit ForkLauncher(core::Logger& log) : log_(log) {}

  core::Result<FdPair> make_ready_pipe() override;
  core::Result<FdPair> make_link() override;
  core::Result<core::UniqueFd> listen(const core::SocketAddress& address) override;
  core::Result<pid_t> launch(const ChildContext& ctx, const ChildMain& main) override;
  core::Result<core::UniqueFd> open_pidfd(pid_t pid) override;
  std::optional<ProcessExit> reap(int pidfd) override;
  void kill_and_reap(pid_t pid) override;
  void signal(pid_t pid, int signo) override;

 private:
  core::Logger& log_;  // the child's, for a pinning failure
};

}  // namespace corral::fanout
