// Containment: the limits each worker of a kind runs under (issue 14, docs/process-model.md
// "Containment"), applied by the ProcessLauncher (workers/launcher.h) around its fork.
//
// Two ways, decided once when the manager is made (Containment::create), with one log line saying
// which (a warning when it is the second):
//
//  * cgroup v2: when the group the supervisor runs in (/proc/self/cgroup's "0::" line, under the
//    cgroup2 mount of /proc/self/mountinfo) is writable and offers the memory and pids controllers
//    (as under systemd with Delegate=yes), each worker gets a group of its own,
//    <group>/corral-workers/<address as a file name>, with memory.max, pids.max and cpu.weight from
//    its kind (memory.swap.max 0 and memory.oom.group 1 where the kernel has them). The child
//    writes its pid to the group's cgroup.procs between fork and exec, so the worker and all it
//    forks are inside before the worker's first instruction. The only writes outside corral's own
//    groups are the delegated group's cgroup.subtree_control (+memory +pids, +cpu when offered)
//    and, when that is refused because the group holds processes (cgroup v2's rule: controllers
//    for children only in a group without processes of its own) and all of them are corral's
//    (the supervisor and its server processes), moving those into <group>/corral-supervisor
//    first (and back if that does not help; a group with any other process is left as it is,
//    and the rlimits apply). A cgroup v1 hierarchy
//    is never touched, nor a group corral did not create. After the worker's exit its group is
//    emptied (cgroup.kill) and removed; memory.events' oom_kill, compared with its value at the
//    start, tells a death by the memory limit.
//  * rlimits, otherwise: memory_max becomes RLIMIT_AS (the address space, a looser bound than
//    memory.max: a runtime's reserved virtual memory counts, so leave it room); cpu_weight is not
//    applied. pids_max becomes RLIMIT_NPROC only when corral runs as root of the initial user
//    namespace (tasks_rlimit_is_per_worker()): the kernel counts RLIMIT_NPROC over every task of
//    the real uid and exempts root, so there it binds a worker that switches to a uid of its own
//    (and counts that uid's tasks), and leaves a worker that stays root unbound; run as any other
//    user, every worker shares corral's uid with the supervisor and each other, and the limit
//    would count them all, so it is not applied. Only the worker sees an allocation fail, so a
//    death by the memory limit is the worker's own report: a `fatal` whose error has code
//    "memory_limit" (what a worker library sends when an allocation fails: std::bad_alloc,
//    MemoryError) from a worker of a kind with memory_max.
//
// Either way an address whose worker its memory limit ended is `failed` with the public error
// memory_limit_error() (reason "memory limit").
//
// Lifetime: one per ProcessLauncher; its destructor removes the groups it still has. Threading:
// the supervisor's thread; enter() is the one call made in the forked child (async-signal-safe).
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/result.h"
#include "core/unique_fd.h"

namespace corral::workers {

// A kind's limits ([workers.<kind>] memory_max, pids_max, cpu_weight); 0: not limited.
struct Limits {
  uint64_t memory_max = 0;  // bytes
  uint64_t pids_max = 0;    // tasks (processes and threads) in the worker's group
  uint32_t cpu_weight = 0;  // 1..10000, cgroup v2's cpu.weight (100 is every group's default)
  bool any() const { return memory_max || pids_max || cpu_weight; }
};

// "256M", "1G", "4096": bytes, with an optional binary unit K, M, G or T (1024^n); at least 1.
core::Result<uint64_t> parse_size(std::string_view text);

// The directory of this process's cgroup v2 group, from the text of /proc/self/cgroup (its
// "0::<path>" line) and /proc/self/mountinfo (the cgroup2 mount and the root it shows); an error
// says why there is none (cgroup v1 only, no cgroup2 mount, the group outside the mount).
core::Result<std::string> cgroup2_group_dir(std::string_view proc_cgroup,
                                            std::string_view mountinfo);

// The pids of a group's cgroup.procs text that are corral's: `self` (the supervisor) and its
// children (by `parent_of`, its server processes); the others go to `foreign`.
std::vector<pid_t> own_processes(std::string_view procs, pid_t self,
                                 const std::function<pid_t(pid_t)>& parent_of,
                                 std::vector<pid_t>* foreign);

// What containment says of a worker after its exit.
struct ExitCause {
  bool memory_limit = false;  // its group saw an OOM kill while it ran
};

// {message, code: "memory_limit", reason: "memory limit"}: the address's public error.
nlohmann::json memory_limit_error();
// Whether a worker that exited unasked was ended by its memory limit: its group's OOM kill, or a
// `fatal` with code "memory_limit" (`failed`: the address's public error so far) from a worker
// of a kind with memory_max.
bool ended_by_memory_limit(const ExitCause& cause, const nlohmann::json& failed,
                           const Limits& limits);

// Whether RLIMIT_NPROC may stand for pids_max: this process runs as uid 0 of the initial user
// namespace (/proc/self/uid_map maps all of it to itself). Root's own tasks are exempt from it, so
// it binds only a worker that switches to another uid, and counts that uid's tasks alone; for any
// other user it would count the supervisor's and every worker's tasks together.
bool tasks_rlimit_is_per_worker();

// One launch's containment, made before the fork; the child applies it with enter().
struct Confinement {
  core::UniqueFd procs;  // the worker's group's cgroup.procs (cgroup mode)
  std::string group;     // that group's directory
  uint64_t oom_kills = 0;
  bool limit_memory = false;  // rlimits mode: RLIMIT_AS
  rlimit memory{};
  bool limit_tasks = false;  // rlimits mode as root: RLIMIT_NPROC (tasks_rlimit_is_per_worker)
  rlimit tasks{};
};

class Containment {
 public:
  enum class Mode { rlimits, cgroup };
  struct Options {
    // The supervisor's cgroup v2 group; empty: found from proc_cgroup and mountinfo. Tests pass a
    // directory that stands in for the cgroup filesystem.
    std::string group_dir;
    std::string proc_cgroup = "/proc/self/cgroup";
    std::string mountinfo = "/proc/self/mountinfo";
    // Removes a worker's emptied group: rmdir(2), which cgroupfs allows with the interface files
    // in it. A stand-in directory holds ordinary files, so its tests pass a recursive removal.
    std::function<int(const std::string& dir)> remove_group;
  };

  // Rlimits only, nothing looked up or logged (ProcessLauncher's default).
  static std::unique_ptr<Containment> rlimits_only();
  // The cgroup way when `wanted` (a kind sets a limit) and the group allows it, else rlimits;
  // logs `workers_containment` once: info for cgroups (or when no kind sets a limit), a warning
  // naming the reason and the limits rlimits give otherwise.
  static std::unique_ptr<Containment> create(core::Logger& log, Options options, bool wanted);
  ~Containment();
  Containment(const Containment&) = delete;
  Containment& operator=(const Containment&) = delete;

  Mode mode() const { return mode_; }
  // What applies, in words: the warning's text in rlimits mode.
  const std::string& summary() const { return summary_; }
  // The directory workers' groups are made in (cgroup mode).
  const std::string& workers_dir() const { return workers_dir_; }

  // Before the fork of `address`'s worker: its group made and limited (cgroup), or its rlimits.
  core::Result<Confinement> prepare(std::string_view address, const Limits& limits);
  // In the forked child, before exec: joins the group, sets the rlimits. Async-signal-safe;
  // false (errno set, `what` the failed step) when it could not.
  static bool enter(const Confinement& c, const char** what);
  // After the fork: the group is the child's (its cgroup.procs descriptor is closed). A failed
  // fork passes pid 0: the group is removed at once.
  void adopt(Confinement c, pid_t pid);
  // After the worker `pid` was reaped: whether its memory limit ended it; its group is emptied
  // and removed (a group whose last processes are still dying is removed on a later call).
  ExitCause reaped(pid_t pid);

 private:
  Containment() = default;
  core::Result<void> set_up_cgroup(const Options& options);
  void remove(const std::string& group);
  void retry_removals();

  Mode mode_ = Mode::rlimits;
  std::string summary_;
  std::string group_dir_, workers_dir_;
  bool cpu_ = false;           // the cpu controller is enabled for the workers' groups
  bool tasks_rlimit_ = false;  // rlimits mode: pids_max as RLIMIT_NPROC
  std::function<int(const std::string&)> remove_group_;
  struct Group {
    std::string dir;
    uint64_t oom_kills = 0;  // memory.events' oom_kill when the worker started
  };
  std::map<pid_t, Group> groups_;
  std::vector<std::string> removals_;  // groups still busy when their worker was reaped
};

}  // namespace corral::workers
