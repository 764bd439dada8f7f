// Launcher: how the worker manager turns a kind's command into a running worker process. It is an
// interface (STYLE rule 5) so a test can run the manager with a fake; ProcessLauncher is the real
// one, the contract of docs/worker-protocol.md:
//
//  * fork + exec of `command` (argv; the program is looked up on PATH) in a new session and
//    process group (setsid, so a stop can kill the whole group, and no process of the worker's
//    is ever in the supervisor's session), as a child subreaper (PR_SET_CHILD_SUBREAPER: its
//    orphaned descendants stay below it rather than going to init; orphans.h), with
//    PR_SET_PDEATHSIG(SIGTERM) so no worker outlives the supervisor, the signal mask and
//    dispositions reset to the defaults;
//  * stdin /dev/null, stdout and stderr pipes (the parent's ends are returned, non-blocking);
//  * fd 3: one end of a socketpair(AF_UNIX, SOCK_SEQPACKET) (the control link; the parent's end is
//    returned, non-blocking), fd 4: `listen_fd` (the worker's listening Unix socket);
//  * the environment of this process, then the kind's `env`, then CORRAL_CONTROL_FD=3,
//    CORRAL_LISTEN_FD=4, CORRAL_ADDRESS (left out, also if inherited, for a warm spare: an empty
//    `address`), CORRAL_STATE_DIR; every other descriptor closed.
//
// A kind may instead be a function of the program itself (LaunchSpec::in_process, for embedding
// applications: app/): the child is set up the same way, then, without exec, `environ` is pointed
// at the environment above and the function runs in the forked copy of the supervisor; its return
// is the exit status (_exit: none of the supervisor's destructors or atexit handlers run in the
// child). That is only sound because the supervisor is single-threaded (fork copies one thread).
//
// Containment (workers/containment.h): LaunchSpec::limits are applied in the child before it
// does anything else, by joining its cgroup v2 group (made before the fork) or by rlimits; a
// failure there, like an exec failure, ends the child with 127. reaped() after a worker's exit
// removes its group and says whether its memory limit ended it.
//
// An exec failure is written to the child's stderr and the child exits 127: the manager sees an
// exit before `started`, a failed start. launch() allocates everything before fork(), so the child
// only makes async-signal-safe calls. Stateless; call on the supervisor's thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/unique_fd.h"
#include "workers/containment.h"
#include "workers/orphans.h"

namespace corral::workers {

struct LaunchSpec {
  std::vector<std::string> command;  // argv; command[0] is looked up on PATH
  std::map<std::string, std::string> env;
  std::string address;  // its wire form (core::wire_encode): CORRAL_ADDRESS; empty: a spare
  std::string state_dir;
  int listen_fd = -1;  // becomes fd 4 in the child; the caller keeps (and closes) its copy
  // Set: run this in the forked child instead of exec'ing `command` (which may then be empty).
  std::function<int()> in_process;
  Limits limits;  // the kind's (containment.h)
  // A warm spare's name ("spare/<kind>/<n>", never an address's): its containment group's name
  // while `address` is empty (it keeps that group once bound).
  std::string spare;
};

struct Launched {
  pid_t pid = 0;  // also the session and process group id, once the child made them
  core::UniqueFd pidfd;
  core::UniqueFd control;  // SOCK_SEQPACKET, O_NONBLOCK
  core::UniqueFd out;      // the child's stdout, O_NONBLOCK
  core::UniqueFd err;      // the child's stderr, O_NONBLOCK
};

// How a reaped worker ended: exit `code` (signo 0), or killed by `signo` (code -1); and what its
// containment says of it.
struct WorkerExit {
  int code = 0;
  int signo = 0;
  ExitCause cause;
  // "exit N" or "signal N", as the log says it.
  std::string text() const {
    return signo ? "signal " + std::to_string(signo) : "exit " + std::to_string(code);
  }
};

// Where a launched worker is on its way out, short of a reap.
enum class Liveness {
  alive,
  exiting,  // killed or exiting, its exit not reported yet (its threads take long to die)
  exited,   // its pidfd reports the exit; not reaped yet
};

// Every call the manager makes to the OS about its children goes through this interface: the
// launch, a signal, the reap at its pidfd's report, a look at whether it is on its way out, the
// destructor's kill, and the sweep of what workers left behind (orphans.h). A worker is named by
// its pid and the pidfd of its launch (Launched), which the manager watches on its loop (EPOLLIN:
// the worker exited). The manager's unit tests run on FakeLauncher (fake_launcher.h): nothing
// forks.
class Launcher {
 public:
  virtual ~Launcher() = default;
  virtual core::Result<Launched> launch(const LaunchSpec& spec) = 0;
  // `sig` to the worker's process group, and to the worker itself through its pidfd (a child that
  // has not made its own group yet is not in it).
  virtual void signal(pid_t pid, int pidfd, int sig) = 0;
  // After its pidfd was readable: SIGKILL to what the worker left in its process group (the
  // leader is a zombie until reaped, so the group id cannot be reused yet), then the reap and its
  // containment's word (its group removed). Nothing if it has not exited (a spurious wakeup).
  virtual std::optional<WorkerExit> reap(pid_t pid, int pidfd) = 0;
  virtual Liveness liveness(pid_t pid, int pidfd) = 0;
  // The destructor's way out: SIGKILL (as signal()) and wait for the exit, no grace.
  virtual void kill_and_wait(pid_t pid, int pidfd) = 0;
  // Makes this process a child subreaper (orphans.h): false (errno set) if it cannot.
  virtual bool become_subreaper() = 0;
  // What workers left outside their groups, in this process's `session`: killed and reaped
  // (workers::sweep_orphans, orphans.h).
  virtual SweepResult sweep_orphans(pid_t session, const std::function<bool(pid_t)>& is_worker,
                                    bool wait) = 0;
};

// The real one: fork and exec as above, kill(2) and pidfd_send_signal, waitid on the pidfd,
// /proc/PID/stat, prctl.
class ProcessLauncher : public Launcher {
 public:
  ProcessLauncher();  // limits as rlimits (Containment::rlimits_only)
  explicit ProcessLauncher(std::unique_ptr<Containment> containment);
  core::Result<Launched> launch(const LaunchSpec& spec) override;
  void signal(pid_t pid, int pidfd, int sig) override;
  std::optional<WorkerExit> reap(pid_t pid, int pidfd) override;
  Liveness liveness(pid_t pid, int pidfd) override;
  void kill_and_wait(pid_t pid, int pidfd) override;
  bool become_subreaper() override;
  SweepResult sweep_orphans(pid_t session, const std::function<bool(pid_t)>& is_worker,
                            bool wait) override;
  // After the worker `pid` was reaped: what its containment says of it (reap() asks it).
  ExitCause reaped(pid_t pid);
  const Containment& containment() const { return *containment_; }

 private:
  std::unique_ptr<Containment> containment_;
};

}  // namespace corral::workers
