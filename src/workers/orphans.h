// Orphans: the processes a worker leaves behind outside its process group (a daemon's fork,
// setsid, fork), found and killed without cgroups (docs/process-model.md, "Containment").
//
// How they are told apart, exactly: the launcher (launcher.h) starts every worker in a session of
// its own and as a child subreaper, and the worker manager makes the supervisor a child subreaper
// too. So while a worker lives, every process it started is below it (an orphan goes to the
// worker, not to init); when it exits, its remaining children come to the supervisor. A child of
// the supervisor outside the supervisor's session is therefore either a live worker (the manager
// knows its pid) or an orphan of a worker that is gone: nothing descended from a worker can be in
// the supervisor's session (sessions are only left, never joined), and corral's own children
// (server processes) stay in it. sweep() kills such orphans with all they started and reaps them.
//
// Every process is signalled through a pidfd opened before it is checked (its parent, read from
// /proc while that parent is known to be alive), so a pid reused meanwhile is never signalled.
// Plain functions over /proc; call on the supervisor's thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

namespace corral::workers {

// The children of `pid` (every thread's, /proc/PID/task/TID/children); empty when it is gone.
std::vector<pid_t> children_of(pid_t pid);

// Fields of /proc/PID/stat; nullopt when it is gone.
struct ProcStat {
  char state = 0;
  pid_t ppid = 0, pgrp = 0, session = 0;
};
std::optional<ProcStat> proc_stat(pid_t pid);

// SIGKILLs the process of `pidfd` (whose pid is `pid`) and everything below it, at most `budget`
// processes; returns how many were signalled. A process with a SIGKILL pending forks no more, so
// the children read after its kill are all it will have.
size_t kill_tree(int pidfd, pid_t pid, size_t budget);

struct SweepResult {
  size_t killed = 0;  // processes signalled (the orphans and what they started)
  size_t reaped = 0;  // orphans reaped
  size_t left = 0;    // orphans not dead yet (or over the budget): sweep again soon
};
// Kills and reaps this process's children that are outside its session `session` and that
// `is_worker` does not claim. `wait`: block until each killed orphan is reaped (a destructor's
// last sweep), else reap only the dead ones.
SweepResult sweep_orphans(pid_t session, const std::function<bool(pid_t)>& is_worker, bool wait);

}  // namespace corral::workers
