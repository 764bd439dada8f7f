// The Manager's warm spares (workers/manager.h, "spares"; issue 14): a kind's `spares` processes
// launched without an address and waiting for `start`, bound by the next starts of the kind
// instead of a fork. A spare is a Worker in a Home of its own (Kind::spares, in no map, so the
// lifecycle's walks over homes_ never see it); the lifecycle in manager.cc hands a spare's
// messages, lost link and exit here, the bounds (manager_bounds.cc) bind one before they look for
// room and stop one before they evict a worker, and every pump() ends with a fill.
#include <signal.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/escape.h"
#include "core/socket.h"
#include "workers/control_codec.h"
#include "workers/manager_impl.h"

namespace corral::workers {

using namespace detail;

namespace {

// A spare that exits before it is bound (and nobody asked) is replaced after this, doubling up to
// kSpareBackoffMaxMs: a command that crashes at once must not be forked in a loop.
constexpr uint32_t kSpareBackoffMinMs = 100;
constexpr uint32_t kSpareBackoffMaxMs = 30'000;
// A kind's refill waits this long at most for the `ready` of a spare it bound: the fork of the
// replacement would otherwise take the supervisor's loop (and a CPU) while that first request
// waits for its worker.
constexpr uint64_t kSpareHoldMs = 100;

std::string spare_key(const std::string& kind, uint64_t n) {
  return "spare/" + kind + "/" + std::to_string(n);
}

}  // namespace

size_t Manager::spare_count() const {
  size_t n = 0;
  for (const auto& kind : kinds_) n += kind->spares.size();
  return n;
}

nlohmann::json Manager::spares_state() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& kind : kinds_) {
    for (const auto& s : kind->spares) {
      const Worker* w = s->worker.get();
      if (!w) continue;
      out[s->address] = {{"spare", true},
                         {"kind", kind->config.name},
                         {"status", w->stopping  ? "stopping"
                                    : w->standby ? "standby"
                                                 : "warming"},
                         {"pid", w->pid},
                         {"startedAt", iso8601(w->started_at)}};
    }
  }
  return out;
}

void Manager::spares_schedule() {
  if (spares_timer_.armed() || closing_) return;
  bool any = false;
  for (const auto& kind : kinds_) any = any || kind->config.spares > 0;
  // At the next loop round: a fill forks, and what called this (a start, an exit, the answers to
  // a `ready`, deferred to the end of this round) is done first. A timer, not a deferred call:
  // the manager may be gone by then (its timers go with it).
  if (any) spares_timer_.arm_after(0);
}

// Launches the spares that are missing, while nothing else wants the places: no start is queued,
// the kind and the total are under max_workers, and the starting workers and the spares still
// warming up together leave a start place.
void Manager::spares_fill() {
  if (closing_) return;
  const uint64_t now = loop_.now();
  size_t warming = 0;
  for (const auto& kind : kinds_)
    for (const auto& s : kind->spares)
      warming += s->worker && !s->worker->standby && !s->worker->stopping;
  for (auto& kind_ptr : kinds_) {
    Kind& kind = *kind_ptr;
    if (kind.config.spares == 0) continue;
    if (now < kind.spare_retry_at) continue;  // backing off; its timer comes back
    if (now - kind.bound_at < kSpareHoldMs) {
      bool bound_starting = false;
      for (const auto& [address, home] : homes_) {
        const Worker* w = home->worker.get();
        bound_starting =
            bound_starting || (home->kind == &kind && w && w->from_spare && w->counts_starting);
      }
      if (bound_starting) continue;  // its `ready` (or the hold's timer) comes back
    }
    size_t live = 0;
    for (const auto& s : kind.spares) live += s->worker && !s->worker->stopping;
    while (live < kind.config.spares) {
      if (!queue_.empty() || starting_ + warming >= options_.max_starting) return;
      if (live_by_kind_[kind.index] >= kind.config.max_workers ||
          workers_live_ >= options_.max_workers)
        break;
      if (!spare_launch(kind)) break;
      ++live;
      ++warming;
    }
  }
}

bool Manager::spare_launch(Kind& kind) {
  const KindConfig& cfg = kind.config;
  auto s = std::make_unique<Home>();
  s->kind = &kind;
  s->spare_id = ++next_spare_;
  s->address = spare_key(cfg.name, s->spare_id);
  // Never an address's file name (those never start with '.'), unique across managers on one
  // state directory (the pid), and short enough for sun_path under any accepted state directory
  // (at most 75 bytes: ".spare-" + 7 + "-" + 8 digits fits the 23 left).
  s->socket_path = fmt::format("{}/sockets/.spare-{}-{}", options_.state_dir, getpid(),
                               s->spare_id % 100'000'000);
  auto backoff = [&](std::string_view why) {
    kind.spare_backoff_ms =
        std::clamp(kind.spare_backoff_ms * 2, kSpareBackoffMinMs, kSpareBackoffMaxMs);
    kind.spare_retry_at = loop_.now() + kind.spare_backoff_ms;
    kind.spare_timer.arm_after(kind.spare_backoff_ms);
    log_.error("worker_spare_failed", "kind={} error=\"{}\" backoff_ms={}", cfg.name, why,
               kind.spare_backoff_ms);
    return false;
  };
  auto listener = core::listen_unix(s->socket_path);
  if (!listener) return backoff(listener.error().reason);
  struct stat st;
  s->socket_inode = ::stat(s->socket_path.c_str(), &st) == 0 ? st.st_ino : 0;
  // No address: the launcher leaves CORRAL_ADDRESS out, and `start` will name it.
  LaunchSpec spec{cfg.command,        cfg.env,         std::string(),
                  options_.state_dir, listener->get(), cfg.in_process};
  spec.spare = s->address;
  spec.limits = cfg.limits;  // containment: the kind's, from the launch on
  auto launched = launcher_->launch(spec);
  if (!launched) {
    ::unlink(s->socket_path.c_str());
    return backoff(launched.error().reason);
  }
  Worker* w = adopt(*s, std::move(launched.value()), std::move(listener.value()));
  w->spare = true;
  log_.info("worker_spare_starting", "kind={} spare={} pid={}", cfg.name, s->spare_id, w->pid);
  kind.spares.push_back(std::move(s));
  return true;
}

// The spare a start of `kind` binds: the oldest in standby, else the oldest still warming up (its
// `start` waits in its socket until it reads it).
Manager::Worker* Manager::spare_for(const Kind& kind) {
  if (kind.spares.empty()) return nullptr;
  Worker* warming = nullptr;
  for (const auto& s : kind.spares) {
    Worker* w = s->worker.get();
    if (!w || w->stopping || w->claimed_by) continue;
    if (w->standby) return w;
    if (!warming) warming = w;
  }
  return warming;
}

void Manager::spare_bind(Home& home, Worker& w) {
  Kind& kind = *kinds_[home.kind->index];
  auto data = start_data(home);
  if (!data) return;  // the home failed; the spare stays for the next start
  auto it = std::find_if(kind.spares.begin(), kind.spares.end(),
                         [&w](const auto& s) { return s->worker.get() == &w; });
  if (it == kind.spares.end()) return;  // cannot happen: spare_for found it there
  std::unique_ptr<Home> spare = std::move(*it);
  kind.spares.erase(it);
  std::string path = socket_path_for(home.address);
  // rename(2) moves the name, not the socket: the spare's listening socket (bound to the old
  // name) is what a connect to the new path reaches, and the inode is the same.
  if (::rename(spare->socket_path.c_str(), path.c_str()) < 0) {
    std::string why = fmt::format("rename of the spare's socket to {}: {}", path, strerror(errno));
    kind.spares.push_front(std::move(spare));
    spare_stop(w, "bind_failed");
    return fail(home, public_error("The worker could not be started.", "start_failed"), why);
  }
  home.socket_path = std::move(path);
  home.socket_inode = spare->socket_inode;
  home.tail = std::move(spare->tail);
  home.worker = std::move(spare->worker);
  w.home = &home;
  w.spare = false;
  w.from_spare = true;
  kind.spare_backoff_ms = 0;
  kind.spare_retry_at = 0;
  kind.bound_at = loop_.now();
  kind.spare_timer.arm_after(kSpareHoldMs);
  log_.info("worker_spare_bound", "address=\"{}\" kind={} spare={} pid={} standby={}", home.address,
            kind.config.name, spare->spare_id, w.pid, w.standby);
  begin_start(w, std::move(*data));
}

// A spare whose exit makes room for a start: one already stopping that no start waits for, else
// the newest (of `kind`, or of any kind when null), stopped now.
Manager::Worker* Manager::spare_room(const Kind* kind) {
  Worker* best = nullptr;
  for (auto& k : kinds_) {
    if (kind && k.get() != kind) continue;
    for (auto& s : k->spares) {
      Worker* w = s->worker.get();
      if (!w || w->claimed_by) continue;
      if (w->stopping) return w;
      best = w;
    }
  }
  if (best) spare_stop(*best, "room");
  return best;
}

void Manager::spare_stop(Worker& w, std::string_view why) {
  if (w.stopping) return;
  w.stopping = true;
  log_.info("worker_spare_stopping", "kind={} spare={} pid={} reason={}", w.home->kind->config.name,
            w.home->spare_id, w.pid, why);
  remove_socket(*w.home);
  if (!send(w, control::shutdown())) signal(w, SIGTERM);
  w.kill_timer.arm_after(w.home->kind->config.stop_grace_ms);
}

void Manager::spare_on_message(Worker& w, const nlohmann::json& msg) {
  const std::string type = msg["type"].get<std::string>();
  if (type == "standby") {
    if (w.standby) return;
    w.standby = true;
    log_.info("worker_spare_standby", "kind={} spare={} pid={}", w.home->kind->config.name,
              w.home->spare_id, w.pid);
    spares_schedule();  // it no longer takes a start place
  } else if (type == "fatal") {
    log_.warn("worker_spare_fatal", "kind={} spare={} pid={} error={}", w.home->kind->config.name,
              w.home->spare_id, w.pid, log_json(msg));
    // It exits by itself; its exit is a spare's failure (the backoff).
  } else if (type == "started" || type == "ready" || type == "idle" || type == "reloaded") {
    log_.warn("worker_protocol_error", "kind={} spare={} error=\"`{}` from a spare\"",
              w.home->kind->config.name, w.home->spare_id, type);
  }
  // Unknown types are ignored (forward compatibility).
}

void Manager::spare_on_exit(Worker& w) {
  Home& spare = *w.home;
  Kind& kind = *kinds_[spare.kind->index];
  // Its group killed and reaped, its containment group gone (as on_exit).
  std::optional<WorkerExit> exit = launcher_->reap(w.pid, w.pidfd.get());
  if (!exit) return;
  loop_.remove(w.pidfd.get());
  if (w.control) loop_.remove(w.control.get());
  w.out.drain();
  w.err.drain();
  w.out.close();
  w.err.close();
  if (!w.out.partial.empty()) on_output(w, false, {}, true);
  if (!w.err.partial.empty()) on_output(w, true, {}, true);
  const bool asked = w.stopping || closing_;
  std::string how = exit->text();
  w.exited = true;
  remove_socket(spare);
  --workers_live_;
  --live_by_kind_[kind.index];
  if (Home* claimer = std::exchange(w.claimed_by, nullptr)) {  // its room is there now
    claimer->awaiting = nullptr;
    --awaiting_exit_;
  }
  if (asked) {
    log_.info("worker_spare_exited", "kind={} spare={} pid={} how=\"{}\" asked=true",
              kind.config.name, spare.spare_id, w.pid, how);
  } else {
    kind.spare_backoff_ms =
        std::clamp(kind.spare_backoff_ms * 2, kSpareBackoffMinMs, kSpareBackoffMaxMs);
    kind.spare_retry_at = loop_.now() + kind.spare_backoff_ms;
    kind.spare_timer.arm_after(kind.spare_backoff_ms);
    log_.error("worker_spare_exited",
               "kind={} spare={} pid={} how=\"{}\" asked=false standby={} backoff_ms={} "
               "stderr_tail=\"{}\"",
               kind.config.name, spare.spare_id, w.pid, how, w.standby, kind.spare_backoff_ms,
               spare.tail);
  }
  auto it = std::find_if(kind.spares.begin(), kind.spares.end(),
                         [&spare](const auto& s) { return s.get() == &spare; });
  if (it != kind.spares.end()) {
    std::unique_ptr<Home> owned = std::move(*it);
    kind.spares.erase(it);
    loop_.destroy_later(std::move(owned->worker));  // events of this round may still name it
  }
  if (closing_ && workers_live_ == 0) finish_close();
  // A stopped spare's exit is progress for the start that waited for its room; a crash-looping
  // spare's is not (it must not hold off the start_limit of starts that do not move).
  if (asked) progress_ms_ = loop_.now();
  sweep_orphans();  // what it left outside its group
  pump();           // a worker place is free
}

void Manager::spares_on_close() {
  for (auto& kind : kinds_) {
    kind->spare_timer.cancel();
    std::vector<Worker*> live;
    for (auto& s : kind->spares)
      if (s->worker) live.push_back(s->worker.get());
    for (Worker* w : live) spare_stop(*w, "close");
  }
}

// The destructor's part: what is left dies now (a destructor cannot wait for a grace period).
void Manager::spares_destroy() {
  for (auto& kind : kinds_) {
    kind->spare_timer.cancel();
    for (auto& s : kind->spares) {
      if (!s->worker) continue;
      kill_now(*s->worker);
      remove_socket(*s);
    }
    kind->spares.clear();
  }
}

}  // namespace corral::workers
