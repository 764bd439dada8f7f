// Manager: the worker manager (spec seed §3 `chord/workers`, issue 4). It runs in the supervisor on
// its event loop and owns every worker process: one per address ("kind:key", e.g. "doc:42"),
// started on the first resolve() for the address, stopped when idle, never restarted by itself.
//
// Per address the operations queue: a start waits for the previous worker's exit (the worker also
// takes a per-address flock, so two managers on one state directory still never run two), a stop
// during a start waits for `started` and then stops. A child's events (its exit, its link's close,
// `started`, `ready`, `idle`, `fatal`) are recorded on that child, so a late event of an old child
// never changes a new one.
//
//  * start: the kind's start_hook (JSON; a throw fails the start), a listening Unix socket in
//    <state>/sockets/ (0700), the launch (Launcher), then `start {address, start, scripts, lock}`.
//    The start timer (start_timeout_ms from the fork) covers fork, lock and `started` only: past it
//    the process group is killed and the start fails. The ready timer (ready_timeout_ms from
//    `started`) bounds the setup the same way (ready_timeout). Waiters are answered at `ready`.
//  * failure: a crash (an exit nobody asked for), a `fatal`, a failed start leave the address
//    `failed` with a public error ({message, code?, reason?}; a child's `fatal` error is cut down
//    to those three strings) until retry(): resolve() answers 503 at once, nothing forks. The full
//    error and the stderr tail go only to the log (`worker_failed`).
//  * idle: checked every second; a worker idle (its last `ready`/`idle` said so) for the kind's
//    idle_ms since then is stopped, never before `ready`, and not while a connection waits in its
//    socket's accept queue (a request it has not taken yet: the manager keeps a copy of the
//    listening socket to see that).
//  * stop: the socket file is removed at once (a connect then fails before sending anything, and
//    the proxy resolves again: the start is queued behind the stop), `shutdown` (SIGTERM to the
//    group if the link is gone), SIGKILL to the process group after stop_grace_ms. A lost control
//    link while the child lives starts a stop; after `ready` it is recovered from once per minute
//    (`worker_link_lost`), a second within a minute (or one before `ready`) fails the address. An
//    EOF is only called a lost link if the child is still alive kLinkCheckMs later: a dying child
//    closes its fds a moment before its pidfd reports the exit.
//  * orphans (orphans.h): the supervisor is a child subreaper and each worker one too, in a
//    session of its own; what a worker leaves outside its process group (a daemon) comes to the
//    supervisor at the worker's exit and is killed and reaped then (and by the idle check).
//  * close(done): cancels queued starts (their waiters get an error), stops every worker; exits
//    during close are never failures; `done` runs once no child is left.
//  * bounds (issue 11): at most max_starting workers between fork and `ready` (or exit) at once,
//    and at most max_workers live worker processes (starting, running or stopping) per kind and in
//    all. A start over either bound queues, in order (the address's state is `queued`). A queued
//    start that needs a worker place takes a stop already under way, else stops the longest-idle
//    worker (of its kind when the kind is full; `worker_evicted`) and waits for that exit; with
//    none idle its waiters get 503 `worker_limit` with Retry-After. At most max_starting starts
//    wait for such an exit at once, so a burst stops at most that many workers at a time (and
//    the stops overlap the starts). A start queued for the kind's start_timeout
//    while no start finished and no worker exited gets 503 `start_limit`. A cancelled queued
//    start (stop, suspend, close) leaves no entry.
//  * code (issue 13, manager_rollout.cc): `start` carries the kind's current set (`scripts`,
//    `code`), which is the version the worker runs (its state entry's `version`) until a
//    `reloaded` with a report sets another. rollout() replaces the set, clears the kind's
//    failures and brings every live worker (starting or running, not stopping) on another set to
//    it: in place (`reload`; one in flight per worker, the newest set waits for its reply, and a
//    reply after its rollout gave up still frees the worker for the next reload and, on success,
//    sets the version) or by replacement (stopped with its start queued, so requests wait, and
//    started again at once). Each entry settles at its reply, the replacement's `ready`, the
//    worker's exit (clean: `stopped`; a crash: its error, the address failed), its lost link, or
//    reload_timeout_ms after the call (code reload_timeout; for a replacement too); close() settles
//    what is left `stopped`. A worker not ready yet in automatic mode is decided at its `ready`.
//  * hanging workers (issue 14, manager_heartbeat.cc): a ready worker whose `ready` said
//    `ping: true` is pinged every heartbeat_ms of its kind; no `pong` within 2 x heartbeat_ms is
//    `worker_unresponsive` and then handled as a lost link (above). The proxy's own wait for a
//    response head is the kind's response_timeout_ms (proxy_routes.h).
//  * why alive (issue 14, manager_state.cc): a running worker's entry has the counts of its last
//    `ready`/`idle` (`holds`: requests, upgraded, busy), `idle_since` and `idle_stop_at`.
//  * spares (issue 14, manager_spares.cc): a kind's `spares` keeps that many processes launched
//    without an address (no CORRAL_ADDRESS; a listening socket at
//    <state>/sockets/.spare-<pid>-<n>), past their own setup (`standby`), waiting for `start`. A
//    start for the kind takes one instead of forking: the spare's socket file is renamed to the
//    address's (the bound socket stays reachable under its new name) and it gets the usual `start`;
//    from there it is an ordinary starting worker (start timer, lock, `started`, `ready`). Spares
//    count against max_workers (of the kind and in all) but are the first to go when a start needs
//    room (stopped, before any worker is evicted); a new spare is launched only when no start is
//    queued and the start places are not full (starting workers and spares before `standby`
//    together), and a kind's refill waits while a spare bound by it starts (at most kSpareHoldMs),
//    so the fork of its replacement is not in the way of the first request. A spare that exits
//    unasked is replaced after a backoff (100 ms doubling to 30 s, reset by a bind;
//    `worker_spare_exited`); one that dies after its bind and before `started` fails nothing, its
//    start is made again once (`worker_spare_lost`). close() stops them with the workers.
//
// Addresses are bytes (anything a route's percent-decoding yields): the API takes and gives them
// raw, state() keys them by their wire form (core::wire_encode), and so does every message and
// environment variable a worker gets (docs/worker-protocol.md).
//
// Output: stdout/stderr lines are appended to <state>/logs/<kind>.log as "<address> <line>" (the
// address in its wire form with spaces as %20, the line log-escaped; the file rotates by size,
// workers/kind_log.h), and
// the last 64 KiB of stderr are kept per address (while the address has an entry).
//
// Processes: every call the manager makes about a child (launch, signal, reap, whether it is on
// its way out, the destructor's kill, the orphan sweep, becoming a subreaper) goes through its
// Launcher (launcher.h), as the fan-out supervisor's do through fanout::Launcher. What it does
// itself is the child's I/O on the descriptors of the launch: the control link, stdout and
// stderr, the pidfd it watches. Its lifecycle rules are tested on FakeLauncher (fake_launcher.h),
// on a fake clock and without a fork (manager_fake_test.cc).
//
// Lifetime: one Manager per supervisor, destroyed before its loop; its destructor SIGKILLs and
// reaps what is left. Single-threaded (the loop's thread).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/result.h"
#include "http/request.h"
#include "workers/code_set.h"
#include "workers/kind_counters.h"
#include "workers/kind_log.h"
#include "workers/launcher.h"

namespace corral::http {
class Router;
}

namespace corral::workers {

struct KindConfig {
  std::string name;
  std::vector<std::string> command;
  // Instead of `command`: a function of this program run in the forked child (launcher.h); its
  // return is the exit status. Embedding applications (app/) use it with worker::worker_main.
  std::function<int()> in_process;
  std::map<std::string, std::string> env;
  std::vector<std::string> routes;  // "/doc/{id}/*": a path matching it is for "doc:{id}"
  uint32_t idle_ms = 300'000;
  uint32_t start_timeout_ms = 60'000;
  // From `started` to `ready` (the worker's own setup): past it the address fails with
  // ready_timeout and the worker is killed. 0: three times start_timeout_ms.
  uint32_t ready_timeout_ms = 0;
  uint32_t stop_grace_ms = 5'000;
  size_t max_workers = 0;  // live workers of this kind; 0: only the manager's bound
  // The start data, called before each start (on the loop; a throw fails the start).
  std::function<nlohmann::json(std::string_view address)> start_hook;
  // May `principal` (nullopt: anonymous) reach `address`? Called by the server process's proxy
  // route (workers/proxy_routes.h), after the site's authenticators and before the resolve
  // message: a refusal or a throw is a 403 and nothing starts. The site is built before the fork,
  // so the hook is in every server process; it runs on the process's loop and must not block.
  using Authorize =
      std::function<bool(const std::optional<std::string>& principal, std::string_view address)>;
  Authorize authorize;

  // The kind's code (issue 13, docs/deploying.md): the directory a rollout snapshots (for
  // Rollouts; the manager never reads it) and the current set every start sends (`start`'s
  // scripts and code). No code: `scripts` is empty and workers carry no version.
  std::string code_dir;
  std::optional<CodeSet> code;
  // How a rollout brings a live worker to a new set: automatic reloads in place a worker whose
  // `ready` said `reload: true` and replaces the others.
  enum class Reload { automatic, in_place, restart };
  Reload reload = Reload::automatic;
  uint32_t reload_timeout_ms = 30'000;  // a worker's entry in a rollout settles by then

  // A hanging worker (issue 14). The proxy route's wait for a response's head: past it the client
  // gets 504 {"error":{"code":"worker_timeout"}} (proxy_routes.h).
  uint32_t response_timeout_ms = 60'000;
  // The control link's heartbeat (manager_heartbeat.cc): every heartbeat_ms the manager pings a
  // ready worker whose `ready` said `ping: true`; no `pong` within 2 x heartbeat_ms of a ping is
  // an unresponsive worker, handled as a lost link. 0: never pinged.
  uint32_t heartbeat_ms = 10'000;

  // Containment (issue 14; workers/containment.h, kind_log.h, docs/process-model.md): each of
  // the kind's workers runs under `limits` (memory_max, pids_max, cpu_weight), and its log file,
  // <state>/logs/<name>.log, rotates past `log_rotation.max_size`, keeping `log_rotation.keep`.
  Limits limits;
  LogRotation log_rotation;

  // --- Streamed request bodies (issue 14) ---
  // The kind's proxy routes stream request bodies to the worker (http/body_stream.h); this is
  // their body limit (nullopt: the server's limits.max_body).
  std::optional<uint64_t> max_body;
  // --- end streamed request bodies ---

  // Warm spares (issue 14, manager_spares.cc): processes of the command kept launched without an
  // address, past their own setup, for the next starts of this kind to bind instead of forking.
  size_t spares = 0;
};

struct ManagerOptions {
  std::string state_dir;
  std::vector<KindConfig> kinds;
  uint32_t idle_check_ms = 1'000;
  uint32_t link_recovery_window_ms = 60'000;  // a second lost link within this fails the address
  size_t stderr_tail_bytes = 64 * 1024;
  size_t max_starting = 0;  // workers between fork and `ready` at once; 0: default_max_starting()
  size_t max_workers = 0;   // live workers in all; 0: default_max_workers()
  // A worker that has served nothing since its `ready` is not stopped to make room for this long:
  // the requests that waited for its start are on their way to it.
  uint32_t evict_grace_ms = 1'000;
  // Kill and reap the orphans of exited workers (orphans.h): every child of this process outside
  // its session that is not one of this manager's workers. Off only where something else starts
  // such children in this process (a second manager's workers, in tests).
  bool sweep_orphans = true;
};

// 2 x the CPUs this process may run on (sched_getaffinity): a start is mostly CPU (exec, the
// runtime's own start, the worker's setup), and twice the CPUs keeps them busy while some wait.
size_t default_max_starting();

// The default bound on live workers: 1024, or less where the machine allows fewer tasks. Each
// worker is at least one task (a thread counts against every task limit) and 4 descriptors in
// the supervisor (pidfd, control link, stdout, stderr), so the bound is the smallest of 1024, a
// quarter of the tasks left to this user/cgroup/machine (RLIMIT_NPROC, the cgroup's pids.max,
// kernel.pid_max: workers may have threads, and the rest of the machine needs some too) and
// (RLIMIT_NOFILE - 64) / 6, at least 1. `basis` says which one decided.
struct DefaultBound {
  size_t value;
  std::string basis;
};
DefaultBound default_max_workers();

// What resolve() answers: the worker's socket, or a public error with its HTTP status.
struct Resolution {
  std::string socket_path;  // set when ok()
  int status = 200;         // 503 failed/suspended/closing/limits, 404 unknown kind, 500 otherwise
  nlohmann::json error;     // {message, code?, reason?}; null when ok()
  uint32_t retry_after_s = 0;  // > 0: try again in this many seconds (a bound, not a failure)
  // When ok(), the worker's pid, and whether the request waited for its start (cold: launched or
  // a spare bound for it) rather than finding it ready (warm): what the access log says.
  int64_t pid = 0;
  bool cold = false;
  bool ok() const { return error.is_null(); }
};
using ResolveCallback = std::function<void(const Resolution&)>;

// What a rollout did (Manager::rollout): per worker that ran an older set when it began, one of
// {address, report} (reloaded in place: the worker's reply; replaced: {"restarted": true}),
// {address, stopped: true} (stopped cleanly meanwhile; its next start gets the new set) or
// {address, error} (its reload failed or timed out, it crashed, its link was lost); addresses in
// their wire form.
struct RolloutReport {
  std::string kind;
  std::string version;   // the new current set's
  std::string previous;  // the set it replaced ("" if none)
  nlohmann::json workers = nlohmann::json::array();
  nlohmann::json cleared = nlohmann::json::array();  // failed addresses the rollout cleared
  size_t failed = 0;                                 // entries with an error
  uint64_t took_ms = 0;
  nlohmann::json to_json() const {
    return {{"kind", kind},       {"version", version}, {"previous", previous},
            {"workers", workers}, {"cleared", cleared}, {"failed", failed},
            {"took_ms", took_ms}};
  }
};
using RolloutCallback = std::function<void(const RolloutReport&)>;

// One state change: `entry` is the address's new state entry, null once it has none.
using ChangeCallback = std::function<void(const std::string& address, const nlohmann::json& entry)>;

// Percent-encodes everything but [A-Za-z0-9._-]: a file name for an address ("doc%3A42").
std::string encode_address(std::string_view address);
// The name of the address's lock in <state>/locks (core::bounded_file_name, ".lock"), at most
// 205 bytes; a socket in <state>/sockets has the same bounded name, cut to fit sun_path.
std::string lock_file_name(std::string_view address);

// The address of a request that a kind's route matched: "<kind>:<param>[:<param>...]", the
// route's {param}s in the pattern's order. nullopt when the route has more than one {param} and
// a value holds ':' (the key would be ambiguous: for "/pair/{a}/{b}", a = "x:y", b = "z" and
// a = "x", b = "y:z" would be one address, one worker). One {param}'s value may hold any byte the
// router lets through, ':' included.
std::optional<std::string> address_of(std::string_view kind,
                                      const std::vector<http::Param>& params);

class Manager {
 public:
  // Creates <state>/sockets, locks and logs (0700) and validates the kinds (names, commands,
  // route patterns: the HTTP router's syntax, any method, a {param}; no two kinds on one shape);
  // the error names the problem.
  static core::Result<std::unique_ptr<Manager>> create(core::EventLoop& loop, core::Logger& log,
                                                       ManagerOptions options,
                                                       std::unique_ptr<Launcher> launcher);
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;
  ~Manager();

  // Answers `cb` (possibly before returning) with the address's socket once its worker is ready,
  // starting it if needed, or with the public error.
  void resolve(const std::string& address, ResolveCallback cb);
  // The address for a request path, from the kinds' route patterns matched by an http::Router
  // (the matcher the proxy routes' site uses); nullopt when none matches.
  std::optional<std::string> address_for(std::string_view path) const;

  // Control operations; false when they do not apply (unknown kind, or nothing to act on).
  bool retry(const std::string& address);    // clears failed and suspended
  bool stop(const std::string& address);     // stops the worker (after `started` if starting)
  bool suspend(const std::string& address);  // 503 "suspended" until resume/retry
  bool resume(const std::string& address);
  void close(std::function<void()> done);

  // A SIGHUP's kinds and bounds (manager_config.cc). What can change under running workers is
  // applied and logged as `reload_applied kind=K keys="idle,..."`: idle, start_timeout,
  // ready_timeout, stop_grace, max_workers, spares (fewer: the newest unclaimed ones stop),
  // reload, reload_timeout, heartbeat (from one period to another), the limits (for workers
  // launched from now; only if some kind had a limit at start), routes, and the bounds of all
  // kinds (max_workers, max_starting; lower ones stop nothing). Each other change (a kind added
  // or removed, command, env, code, log rotation) is logged as `reload_ignored kind=K key=KEY
  // reason="..."` and returned.
  struct Ignored {
    std::string kind, key, reason;
  };
  std::vector<Ignored> reconfigure(std::vector<KindConfig> kinds, size_t max_workers,
                                   size_t max_starting);

  // The rollout step (issue 13, docs/deploying.md): makes `set` the kind's current set, clears
  // the kind's failures, brings every live worker on another set to it (in place or by
  // replacement, in parallel) and calls `done` (deferred) once each has settled. At most one per
  // kind at a time (Rollouts serialises them); false, and no call, for an unknown kind or one
  // already rolling.
  bool rollout(const std::string& kind, CodeSet set, RolloutCallback done);
  // {kind: {version (current, null without code), dirty, workers, stale, rolling, spares}}:
  // workers are the live ones (starting or running; a stopping one is on its way out), stale
  // those of them on a set other than the current one, dirty while any is; spares the warm
  // spares launched (stopping ones included).
  nlohmann::json kinds_state() const;
  // The versions the kind's workers run, stopping ones included, and those a reload in flight
  // or waiting brings them to (the store keeps them).
  std::set<std::string> versions_in_use(const std::string& kind) const;

  // {wire address: {status: starting|running|stopping, pid, startedAt, version?, and when running
  // holds?: {requests, upgraded, busy} (its last report), idle_since, idle_stop_at (ISO times,
  // null while not idle), idle_stop_delayed?} | {status: failed, error, at}
  //  | {status: queued, queuedAt}}; a suspended address has `suspended: true` (and
  //  `status: suspended` with no worker).
  nlohmann::json state() const;
  nlohmann::json entry(const std::string& address) const;  // null: no entry
  std::string stderr_tail(const std::string& address) const;
  size_t live_workers() const { return workers_live_; }
  size_t starting_workers() const { return starting_; }
  size_t queued_starts() const { return queue_.size(); }
  size_t max_starting() const { return options_.max_starting; }
  size_t max_workers() const { return options_.max_workers; }
  bool closing() const { return closing_; }
  // Warm spares (manager_spares.cc): how many are launched (of every kind, stopping ones
  // included), and each one's entry, {"spare/<kind>/<n>": {spare: true, kind, status:
  // warming|standby|stopping, pid, startedAt}}: keys without ':' (never an address), for
  // GET /workers.
  size_t spare_count() const;
  nlohmann::json spares_state() const;

  // For the status page (control/status_page.h), without building every entry. Per kind: its
  // addresses by status (live: those with a worker process, stopping ones included; spares
  // apart), its current code version ("" without code) and the latency of its
  // last starts (`start` to `ready`, kKindStartSamples of them kept). Each address with an entry,
  // in order, with its kind and status (as entry()'s `status` says it).
  static constexpr size_t kKindStartSamples = 256;
  struct KindSummary {
    std::string name;
    size_t live = 0, starting = 0, running = 0, stopping = 0, queued = 0, failed = 0, suspended = 0,
           spares = 0, stale = 0;
    std::string version;
    bool rolling = false;
    std::vector<uint32_t> start_ms;  // the last starts' latencies, oldest first
  };
  std::vector<KindSummary> kind_summaries() const;
  using AddressVisitor = std::function<void(const std::string& address, std::string_view kind,
                                            std::string_view status)>;
  void visit_addresses(const AddressVisitor& visit) const;
  // Each kind's counters (starts, failures, stops, start latency: kind_counters.h), in order.
  using CountersVisitor = std::function<void(std::string_view kind, const KindCounters& counters)>;
  void visit_counters(const CountersVisitor& visit) const;

  ChangeCallback on_change;  // every change, after the watchers
  uint64_t watch(ChangeCallback cb);
  void unwatch(uint64_t id);

  // The log file of `address`'s kind (kind_log.h) and how many rotated files it keeps; none for
  // an address of no kind.
  struct LogFile {
    std::string path;
    uint32_t keep = 0;
  };
  std::optional<LogFile> log_file(std::string_view address) const;
  // Each run of lines written to a kind's log, as written (kind_log.h), to a watcher (for
  // `corral ctl logs -f`); the callback may unwatch itself.
  using OutputCallback = std::function<void(std::string_view kind, std::string_view lines)>;
  uint64_t watch_output(OutputCallback cb);
  void unwatch_output(uint64_t id);
  // Every kind's log opens its path anew at its next line (SIGUSR1, after logrotate moved it).
  void reopen_logs() { kind_logs_.reopen(); }

 private:
  struct Kind;
  struct Rollout;
  struct RolloutEntry;
  struct Home;
  struct Worker;
  struct OutputReader;
  Manager(core::EventLoop& loop, core::Logger& log, ManagerOptions options,
          std::unique_ptr<Launcher> launcher);

  const Kind* kind_of(std::string_view address) const;
  Home* find(const std::string& address);
  const Home* find(const std::string& address) const;
  void start(Home& home);
  // The bounds: a start joins the queue, pump() starts what fits, in order.
  void enqueue(Home& home);
  void unqueue(Home& home);
  void pump();
  bool has_room(const Home& home) const;
  void make_room(Home& home);
  Worker* room_from(const Kind* kind, bool stopping);
  void expire_queued();
  void begin_stop(Worker& w, std::string_view why);
  void fail(Home& home, nlohmann::json public_error, std::string full);
  void answer(Home& home, const Resolution& r);
  void on_message(Worker& w, const nlohmann::json& msg);
  void on_link_closed(Worker& w);
  void on_link_check(Worker& w);
  void on_exit(Worker& w);
  void on_start_timeout(Worker& w);
  void on_ready_timeout(Worker& w);
  void on_output(Worker& w, bool is_err, std::string_view data, bool eof);
  void check_idle();
  static bool connection_waiting(const Worker& w);
  void arm_idle_check();
  bool send(Worker& w, const nlohmann::json& msg);
  void read_control(Worker& w);
  nlohmann::json entry_of(const Home& home) const;
  // Emits the home's entry if it changed, then erases the home if nothing is left in it.
  void settle(Home& home);
  void changed(Home& home);
  void remove_socket(Home& home);
  void emit(const std::string& address, const nlohmann::json& entry);
  void finish_close();
  void kill_now(Worker& w);  // the destructor's: SIGKILL to its group and reap, no grace
  // `sig` to the worker's process group, and to the worker itself through its pidfd (a child
  // that has not made its own group yet is not in it).
  void signal(const Worker& w, int sig);
  // Orphans (orphans.h): what workers that are gone left outside their groups is killed and
  // reaped; a sweep that found any comes again soon (their own children come next).
  void sweep_orphans(bool wait = false);
  // The rollout step's hooks in the lifecycle (manager_rollout.cc).
  RolloutEntry* rollout_entry(const Home& home) const;
  void rollout_on_ready(Worker& w);
  void rollout_on_start(Home& home);  // a worker forks (or a spare is bound) for the home
  void rollout_on_reloaded(Worker& w, const nlohmann::json& msg);
  bool rollout_on_exit(Home& home, bool crashed);  // true: start the replacement now
  void rollout_on_failed(Home& home);
  void rollout_on_link_lost(Home& home);
  void rollout_on_gone(Home& home);  // the home is about to be erased
  void rollout_on_close();
  void rollout_bring(Worker& w, Rollout& r, RolloutEntry& e);
  void rollout_reload(Worker& w, const CodeSet& set);  // now, or once the one in flight replied
  void rollout_replace(Worker& w, RolloutEntry& e);
  void rollout_settle(Kind& kind, const std::string& address, nlohmann::json result);
  void rollout_finish(Kind& kind);
  // The heartbeat (manager_heartbeat.cc): started at `ready` if it said `ping: true`, a `pong`
  // arms the next ping, the timer sends one or finds the waiting one unanswered.
  void heartbeat_on_ready(Worker& w, const nlohmann::json& ready);
  void heartbeat_on_pong(Worker& w, const nlohmann::json& pong);
  void heartbeat_due(Worker& w);
  // A lost control link, or an unresponsive worker (`why`): a stop recovered from once per
  // link_recovery_window_ms after `ready`, else the address fails with `error`.
  void link_lost(Worker& w, std::string_view why, nlohmann::json error);
  // The counts of a `ready` or `idle` (manager_state.cc), and the idle flip's time.
  void record_holds(Worker& w, const nlohmann::json& msg);
  void add_why_alive(const Worker& w, nlohmann::json& entry) const;
  static void record_start_latency(Kind& kind, uint64_t ms, bool from_spare);
  static std::string_view status_of(const Home& home);
  // The lifecycle shared by a start and a spare's bind (manager.cc): the start hook's data (a
  // throw fails the home: nullopt), the worker made from a launch (registered, counted live), its
  // `start` sent with the start timer armed.
  std::optional<nlohmann::json> start_data(Home& home);
  std::string socket_path_for(const std::string& address) const;
  Worker* adopt(Home& home, Launched launched, core::UniqueFd listener);
  void begin_start(Worker& w, nlohmann::json start_data);
  // Warm spares (manager_spares.cc).
  void spares_schedule();  // a fill after this loop round (coalesced)
  void spares_fill();
  bool spare_launch(Kind& kind);
  Worker* spare_for(const Kind& kind);
  void spare_bind(Home& home, Worker& spare);
  Worker* spare_room(const Kind* kind);  // stops a spare (of `kind`, or any) for a start's room
  void spare_stop(Worker& w, std::string_view why);
  void spare_on_message(Worker& w, const nlohmann::json& msg);
  void spare_on_exit(Worker& w);
  void spares_on_close();
  void spares_destroy();

  core::EventLoop& loop_;
  core::Logger& log_;
  ManagerOptions options_;
  std::unique_ptr<Launcher> launcher_;
  std::vector<std::unique_ptr<Kind>> kinds_;
  std::unique_ptr<http::Router> router_;  // every kind's routes (manager_config.cc)
  std::map<std::string, std::unique_ptr<Home>, std::less<>> homes_;
  KindLogs kind_logs_;            // the kinds' log files (kind_log.h)
  bool limits_at_start_ = false;  // some kind had a limit at create(): containment is set up
  std::map<std::string, uint64_t, std::less<>> recoveries_;  // address -> last lost-link recovery
  std::map<uint64_t, ChangeCallback> watchers_;
  std::map<uint64_t, OutputCallback> output_watchers_;
  uint64_t next_watch_ = 1;
  size_t workers_live_ = 0;
  std::vector<size_t> live_by_kind_;  // by Kind::index
  size_t starting_ = 0;               // between fork and `ready` (or exit)
  std::list<Home*> queue_;            // starts waiting for the bounds, oldest first
  size_t awaiting_exit_ = 0;          // queued starts that wait for a stopping worker's exit
  uint64_t progress_ms_ = 0;          // the last `ready` of a start, or exit
  bool pumping_ = false, pump_again_ = false;
  bool closing_ = false;
  core::Timer spares_timer_;  // a fill, soon (spares_schedule)
  uint64_t next_spare_ = 0;   // numbers spares' sockets and entries
  std::function<void()> close_done_;
  core::Timer idle_check_;
  pid_t session_ = 0;         // the supervisor's session: no worker's process is in it
  core::Timer orphan_sweep_;  // the next sweep after one that found orphans
  uint32_t orphan_retry_ms_ = 0;
};

}  // namespace corral::workers
