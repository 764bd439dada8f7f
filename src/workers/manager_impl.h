// Internal to the workers component: the Manager's private types (a kind, an address's home, a
// worker process and its output readers) and the helpers the Manager's files share. The Manager is
// split by job: manager.cc the lifecycle (start, messages, failure, idle, stop, close),
// manager_config.cc the options' validation and the route patterns, manager_bounds.cc the bounds
// and eviction, manager_state.cc the state entries and their watchers. Not an API: only those
// files include it. Lifetime and threading are the Manager's (workers/manager.h). The rollout step
// (issue 13) is in manager_rollout.cc: a kind's rollout in progress (Rollout, its entries by
// address) and the reload state of each worker (Worker::version, reload_sent, reload_pending).
// The heartbeat (issue 14) is in manager_heartbeat.cc; what holds a worker (its counts) is read in
// manager_state.cc.
// Warm spares (issue 14) are in manager_spares.cc: a kind's spares, each a Worker in a Home of
// its own that is in no map (Kind::spares), moved into the address's home by a bind.
#pragma once

#include <sys/types.h>

#include <ctime>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/timer_wheel.h"
#include "core/unique_fd.h"
#include "http/router.h"
#include "workers/manager.h"

namespace corral::workers {

namespace detail {

// File names for an address (core::bounded_file_name): a lock's is the same in every manager on
// the state directory whatever its path is spelled like, a socket's fits sun_path.
constexpr size_t kMaxLockName = 200;
// What a start refused by the bounds tells the client: try again in a second (a worker place frees
// as soon as one of the running workers goes idle or exits).
constexpr uint32_t kRetryAfterS = 1;

inline nlohmann::json public_error(std::string_view message, std::string_view code) {
  return {{"message", message}, {"code", code}};
}

// JSON for the log only (lossy is fine there): never throws.
inline core::Verbatim log_json(const nlohmann::json& j) {
  return {j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

// A child's error (a `fatal`'s, a `reloaded`'s) cut down to the public fields: three bounded
// strings, nothing else (manager.cc).
nlohmann::json sanitize_error(const nlohmann::json& e);

inline std::string iso8601(time_t t) {
  char buf[32];
  size_t n = core::format_iso8601(t, buf);
  return std::string(buf, n);
}

}  // namespace detail

// A worker's place in its kind's rollout (manager_rollout.cc), until it settled.
struct Manager::RolloutEntry {
  enum class Phase {
    undecided,      // automatic, not ready yet: in place or replaced is decided at its `ready`
    reloading,      // waits for the `reloaded` to a reload of the rollout's set
    replacing_old,  // the old worker stops; a start is queued behind its exit
    replacing_new,  // the new worker starts (or waits for the bounds) on the rollout's set
  };
  Phase phase = Phase::undecided;
  core::Timer timeout;  // reload_timeout_ms from the call; a replacement: from its fork
};

// A kind's rollout in progress: one entry per worker that ran another set when it began, removed
// once it settled (its result is then in `report`).
struct Manager::Rollout {
  CodeSet set;
  RolloutReport report;
  RolloutCallback done;
  uint64_t started_ms = 0;
  size_t reloaded = 0, restarted = 0, stopped = 0;
  bool setting_up = true;  // rollout() is still making the entries: done is not due yet
  std::map<std::string, std::unique_ptr<RolloutEntry>, std::less<>> entries;  // by raw address
};

struct Manager::Kind {
  KindConfig config;  // config.code: the current set (replaced by a rollout)
  size_t index = 0;   // in kinds_ (and live_by_kind_); its routes' id in router_
  std::unique_ptr<Rollout> rollout;
  // Warm spares (manager_spares.cc): the spares' homes (each holds its Worker, and its
  // spare_id), oldest first; the crash-loop backoff of a spare that exits unasked (0: none),
  // no launch before spare_retry_at; the last bind (a refill waits a little for its `ready`);
  // spare_timer runs the next fill at the end of a backoff or a hold.
  std::list<std::unique_ptr<Home>> spares;
  uint32_t spare_backoff_ms = 0;
  uint64_t spare_retry_at = 0;
  uint64_t bound_at = 0;
  core::Timer spare_timer;
  // The latencies of the last starts (`start` to `ready`, ms), a ring of kKindStartSamples.
  std::vector<uint32_t> start_latencies;
  size_t start_latency_next = 0;
  KindCounters counters;  // for /metrics
};

struct Manager::OutputReader final : core::IoHandler {
  Manager* m = nullptr;
  Worker* w = nullptr;
  bool is_err = false;
  core::UniqueFd fd;
  std::string partial;
  int64_t partial_ms = 0;  // the wall clock time of the partial line's first byte

  // Not after the worker's exit: an event of the same epoll round as its pidfd's may still come,
  // and its home may be gone by then.
  void on_io(uint32_t) override;
  // One read; false once the pipe is at EOF (and closed).
  bool read_some();
  void drain() {
    for (int i = 0; i < 64 && fd && read_some();) ++i;  // bounded: a straggler may keep writing
  }
  void close();
};

struct Manager::Worker final : core::IoHandler {
  struct Control final : core::IoHandler {
    Worker* w = nullptr;
    void on_io(uint32_t) override {
      if (!w->exited) w->m.read_control(*w);
    }
  };

  Worker(Manager& manager, Home& s) : m(manager), home(&s) {
    control_handler.w = this;
    for (auto* r : {&out, &err}) {
      r->m = &manager;
      r->w = this;
    }
    err.is_err = true;
  }
  void on_io(uint32_t) override {
    if (!exited) m.on_exit(*this);
  }

  Manager& m;
  Home* home;
  // Reaped: it waits for the loop's deferred destruction, and its home may already be gone (the
  // events of its descriptors still queued in this epoll round are ignored).
  bool exited = false;
  pid_t pid = 0;
  core::UniqueFd pidfd;
  core::UniqueFd control;
  // Our copy of its listening socket: nothing here accepts, but its queue tells whether a
  // connection is waiting for the worker (check_idle), and with it open a connection the worker
  // never accepted is not reset when the worker closes its copy.
  core::UniqueFd listener;
  Control control_handler;
  OutputReader out, err;
  core::Timer start_timer, ready_timer, kill_timer, link_check;
  time_t started_at = 0;
  bool started = false;  // `started`: the lock is taken
  bool ready = false;
  bool idle = false;
  uint64_t idle_since = 0;
  uint64_t ready_at = 0;
  uint64_t start_ms = 0;         // loop time of its `start` (begin_start)
  bool served = false;           // reported busy at least once since `ready`
  bool counts_starting = false;  // counted in starting_ (until `ready` or the exit)
  Home* claimed_by = nullptr;    // a queued start waiting for this worker's exit
  bool stopping = false;
  bool stop_after_started = false;  // a stop asked during the start runs at `started`
  // A warm spare (manager_spares.cc): launched without an address, in a spare home until a bind
  // moves it to an address's home (then an ordinary starting worker, from_spare).
  bool spare = false;
  bool standby = false;  // its `standby` came: its own setup is done
  bool from_spare = false;
  std::string_view stop_reason = "stop";  // that stop's reason, for the log
  std::string failure_log;                // the full error, logged at the exit with the stderr tail
  // Its code (issue 13): the version it runs ("" for a kind without code), from its `start` and
  // then from each successful `reloaded`; whether its `ready` said `reload: true`; the reload in
  // flight (one at a time; its reply frees the worker for the next reload even after its rollout
  // gave up on it) and the newest set waiting for that reply.
  std::string version;
  bool can_reload = false;
  uint64_t reload_ids = 0;  // the last reload id sent (ids start at 1)
  struct SentReload {
    uint64_t id;
    std::string version;
  };
  std::optional<SentReload> reload_sent;
  std::optional<CodeSet> reload_pending;
  // The heartbeat (issue 14, manager_heartbeat.cc): whether its `ready` said `ping: true`; the
  // timer (the next ping, or the deadline of the one waiting for its `pong`); that ping's id (0:
  // none waits) and when it was sent.
  bool can_ping = false;
  core::Timer heartbeat;
  uint64_t ping_ids = 0;
  uint64_t ping_waiting = 0;
  uint64_t ping_sent_ms = 0;
  // What holds it (issue 14, "why alive"): the counts of its last `ready` or `idle` that had them
  // (none from a worker that never sent any), and the wall time of its last flip to idle.
  struct Holds {
    uint64_t requests = 0, upgraded = 0, busy = 0;
  };
  std::optional<Holds> holds;
  time_t idle_since_wall = 0;
};

// An address's home in the manager: its socket, its live worker, the requests waiting for it, its
// queued start, its failure. ("Slot", in corral, is only a fan-out server process's place:
// fanout/supervisor.h.)
struct Manager::Home {
  std::string address;
  const Kind* kind = nullptr;
  std::string socket_path;
  ino_t socket_inode = 0;
  std::unique_ptr<Worker> worker;        // the live child, if any
  std::vector<ResolveCallback> waiters;  // for the current start, or for the queued one
  bool start_queued = false;             // a start waits for the current worker's exit
  bool queued = false;                   // in queue_: a start waits for the bounds
  std::list<Home*>::iterator queue_pos;  // where, when queued
  uint64_t queued_ms = 0;
  time_t queued_at = 0;
  Worker* awaiting = nullptr;  // the stopping worker whose exit makes room for this start
  nlohmann::json failed;       // the public error; null unless failed
  time_t failed_at = 0;
  bool suspended = false;
  std::string tail;  // the last stderr bytes
  nlohmann::json last_emitted;
  uint64_t spare_id = 0;  // a spare's home: its number; its address is "spare/<kind>/<n>" (logs)
  // A spare bound for this start died before `started`: the start was made again (once, until
  // a worker of the address is ready).
  bool spare_lost = false;
};

}  // namespace corral::workers
