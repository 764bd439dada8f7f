// The Manager's rollout step (workers/manager.h, Manager::rollout; the design in
// docs/deploying.md): a kind's new current set, the failures it clears, and each live worker on
// another set brought to it, in place (`reload`/`reloaded`, one in flight per worker) or by
// replacement (stopped, and started again at once on the new set while its requests wait). The
// lifecycle in manager.cc calls the rollout_on_* hooks at a worker's `ready`, `reloaded`, exit,
// failure and lost link, at a home's end and at close; each settles the worker's entry, and the
// last one settled reports.
#include "core/escape.h"
#include "workers/control_codec.h"
#include "workers/manager_impl.h"

namespace corral::workers {

using namespace detail;

namespace {

std::string short_version(const std::string& version) {
  return version.substr(0, 12);
}

}  // namespace

bool Manager::rollout(const std::string& kind_name, CodeSet set, RolloutCallback done) {
  Kind* kind = nullptr;
  for (auto& k : kinds_)
    if (k->config.name == kind_name) kind = k.get();
  if (!kind || kind->rollout) return false;
  auto owned = std::make_unique<Rollout>();
  Rollout& r = *owned;
  r.report.kind = kind_name;
  r.report.version = set.version;
  r.report.previous = kind->config.code ? kind->config.code->version : "";
  r.started_ms = loop_.now();
  r.done = std::move(done);
  // 1. Every start from now on sends the new set.
  kind->config.code = set;
  r.set = std::move(set);
  kind->rollout = std::move(owned);

  // 2. The failures recorded before this call, cleared as retry() does: their next request
  // starts them on the new set (a failed address has no waiters: resolve() refuses at once).
  std::vector<std::string> cleared;
  for (auto& [address, home] : homes_) {
    if (home->kind != kind || home->failed.is_null()) continue;
    home->failed = nullptr;
    recoveries_.erase(address);
    r.report.cleared.push_back(core::wire_encode(address));
    cleared.push_back(address);
  }
  for (const auto& address : cleared) {
    log_.info("worker_retry", "address=\"{}\" by=rollout", address);
    if (Home* home = find(address)) settle(*home);
  }

  // 3. Every live worker whose set (or the one it is being brought to) is another.
  std::vector<std::string> stale;
  for (auto& [address, home] : homes_) {
    Worker* w = home->worker.get();
    if (home->kind != kind || !w || w->stopping) continue;
    const std::string& target = w->reload_pending ? w->reload_pending->version
                                : w->reload_sent  ? w->reload_sent->version
                                                  : w->version;
    if (w->version == r.set.version && target == r.set.version) continue;
    auto e = std::make_unique<RolloutEntry>();
    e->timeout.bind(loop_.timers(), [this, kind, address = address] {
      using Phase = RolloutEntry::Phase;
      auto it = kind->rollout->entries.find(address);  // armed only while the entry is there
      Phase phase = it->second->phase;
      bool replacing = phase == Phase::replacing_old || phase == Phase::replacing_new;
      rollout_settle(*kind, address,
                     {{"error", public_error(replacing ? "The worker was not replaced in time."
                                                       : "The worker did not reload in time.",
                                             "reload_timeout")}});
    });
    e->timeout.arm_after(kind->config.reload_timeout_ms);
    r.entries.emplace(address, std::move(e));
    stale.push_back(address);
  }
  log_.info("rollout_started", "kind={} version={} previous={} workers={} cleared={}", kind_name,
            short_version(r.set.version), short_version(r.report.previous), stale.size(),
            cleared.size());
  for (const auto& address : stale) {
    Home* home = find(address);
    auto it = r.entries.find(address);
    if (home && home->worker && it != r.entries.end()) rollout_bring(*home->worker, r, *it->second);
  }
  r.setting_up = false;
  if (r.entries.empty()) rollout_finish(*kind);
  return true;
}

void Manager::rollout_bring(Worker& w, Rollout& r, RolloutEntry& e) {
  using Reload = KindConfig::Reload;
  const Reload mode = w.home->kind->config.reload;
  if (mode == Reload::automatic && !w.ready) return;  // undecided until its `ready`
  if (mode == Reload::in_place || (mode == Reload::automatic && w.can_reload)) {
    e.phase = RolloutEntry::Phase::reloading;
    rollout_reload(w, r.set);  // before `ready` too: the child queues it until then
  } else {
    rollout_replace(w, e);
  }
}

void Manager::rollout_reload(Worker& w, const CodeSet& set) {
  if (w.reload_sent) {
    // One in flight: the newest set goes when it replies (or nothing more, if it is this one).
    if (w.reload_sent->version == set.version)
      w.reload_pending.reset();
    else
      w.reload_pending = set;
    return;
  }
  uint64_t id = ++w.reload_ids;
  nlohmann::json msg = control::reload(id, set);
  if (send(w, msg)) {
    w.reload_sent = Worker::SentReload{id, set.version};
    return;
  }
  // No link (its loss or its exit settles the entry too) or a full socket: this reload is lost.
  Kind& kind = *kinds_[w.home->kind->index];
  RolloutEntry* e = rollout_entry(*w.home);
  if (e && e->phase == RolloutEntry::Phase::reloading && kind.rollout->set.version == set.version)
    rollout_settle(kind, w.home->address,
                   {{"error", public_error("The reload could not be sent.", "link_lost")}});
}

void Manager::rollout_replace(Worker& w, RolloutEntry& e) {
  e.phase = RolloutEntry::Phase::replacing_old;
  // A replacement is bounded by its own steps, not by reload_timeout from the call: the stop by
  // stop_grace, the queued start by the bounds' start_limit, and the new worker from its fork
  // (rollout_on_start). Under load the starts queue behind max_starting for longer than any
  // fixed timeout would allow, while every one of them progresses.
  e.timeout.cancel();
  if (w.stop_after_started) return;  // a stop was asked already: it settles `stopped`
  Home& home = *w.home;
  home.start_queued = true;  // requests that come meanwhile wait for the new worker
  if (!w.started) {
    w.stop_after_started = true;  // as a stop during a start: at `started`
    w.stop_reason = "rollout";
    return;
  }
  begin_stop(w, "rollout");
}

Manager::RolloutEntry* Manager::rollout_entry(const Home& home) const {
  const Rollout* r = kinds_[home.kind->index]->rollout.get();
  if (!r) return nullptr;
  auto it = r->entries.find(home.address);
  return it == r->entries.end() ? nullptr : it->second.get();
}

void Manager::rollout_on_start(Home& home) {
  RolloutEntry* e = rollout_entry(home);
  if (!e || e->phase != RolloutEntry::Phase::replacing_new) return;
  const KindConfig& cfg = home.kind->config;
  e->timeout.arm_after(uint64_t{cfg.start_timeout_ms} + cfg.reload_timeout_ms);
}

void Manager::rollout_on_ready(Worker& w) {
  Home& home = *w.home;
  RolloutEntry* e = rollout_entry(home);
  if (!e) return;
  Kind& kind = *kinds_[home.kind->index];
  if (e->phase == RolloutEntry::Phase::replacing_new) {
    rollout_settle(kind, home.address, {{"report", {{"restarted", true}}}});
  } else if (e->phase == RolloutEntry::Phase::undecided) {
    rollout_bring(w, *kind.rollout, *e);  // automatic: now it is known whether it can reload
  }
}

void Manager::rollout_on_reloaded(Worker& w, const nlohmann::json& msg) {
  Home& home = *w.home;
  auto id = msg.find("id");
  if (!w.reload_sent || id == msg.end() || !id->is_number_unsigned() ||
      id->get<uint64_t>() != w.reload_sent->id) {
    log_.warn("worker_protocol_error", "address=\"{}\" error=\"a `reloaded` for no reload sent\"",
              home.address);
    return;
  }
  Worker::SentReload sent = std::move(*w.reload_sent);
  w.reload_sent.reset();
  Kind& kind = *kinds_[home.kind->index];
  RolloutEntry* e = rollout_entry(home);
  // The caller still waits (else a late reply: it only frees the worker for the next reload and
  // sets the version).
  bool waited =
      e && e->phase == RolloutEntry::Phase::reloading && kind.rollout->set.version == sent.version;
  nlohmann::json result;
  auto error = msg.find("error");
  if (error != msg.end() && !error->is_null()) {
    result = {{"error", sanitize_error(*error)}};
    if (!waited)  // a waited-for one is logged as it settles
      log_.warn("worker_reload_failed", "address=\"{}\" version={} error={} late=true",
                home.address, short_version(sent.version), log_json(result["error"]));
  } else {
    w.version = sent.version;
    auto report = msg.find("report");
    result = {
        {"report", report == msg.end() || report->is_null() ? nlohmann::json::object() : *report}};
    log_.info("worker_reloaded", "address=\"{}\" version={}{}", home.address,
              short_version(sent.version), waited ? "" : " late=true");
    changed(home);  // its entry's version
  }
  if (waited) rollout_settle(kind, home.address, std::move(result));
  if (w.reload_pending) {
    CodeSet next = std::move(*w.reload_pending);
    w.reload_pending.reset();
    if (!w.stopping) rollout_reload(w, next);  // a reload during a stop is ignored anyway
  }
}

bool Manager::rollout_on_exit(Home& home, bool crashed) {
  RolloutEntry* e = rollout_entry(home);
  if (!e) return false;
  Kind& kind = *kinds_[home.kind->index];
  if (crashed) {  // fail() settled it already; this is for an exit it did not see
    rollout_settle(kind, home.address,
                   {{"error", home.failed.is_null()
                                  ? public_error("The worker exited unexpectedly.", "worker_exited")
                                  : home.failed}});
    return false;
  }
  if (e->phase == RolloutEntry::Phase::replacing_old && home.start_queued && !closing_ &&
      !home.suspended) {
    e->phase = RolloutEntry::Phase::replacing_new;
    return true;
  }
  // Stopped cleanly (idle, stop, eviction; or its replacement was cancelled): its next start
  // gets the new set.
  rollout_settle(kind, home.address, {{"stopped", true}});
  return false;
}

void Manager::rollout_on_failed(Home& home) {
  if (rollout_entry(home))
    rollout_settle(*kinds_[home.kind->index], home.address, {{"error", home.failed}});
}

void Manager::rollout_on_link_lost(Home& home) {
  if (rollout_entry(home))
    rollout_settle(*kinds_[home.kind->index], home.address,
                   {{"error", public_error("The worker lost its link.", "link_lost")}});
}

// No worker, start or waiter is left at the address (a replacement start refused by the bounds,
// or cancelled): nothing is wrong there, its next start gets the new set.
void Manager::rollout_on_gone(Home& home) {
  if (rollout_entry(home))
    rollout_settle(*kinds_[home.kind->index], home.address, {{"stopped", true}});
}

// Every worker is being stopped and no start will run: what is left settles `stopped` now.
void Manager::rollout_on_close() {
  for (auto& kind : kinds_) {
    if (!kind->rollout) continue;
    std::vector<std::string> left;
    for (const auto& [address, e] : kind->rollout->entries) left.push_back(address);
    for (const auto& address : left) rollout_settle(*kind, address, {{"stopped", true}});
  }
}

void Manager::rollout_settle(Kind& kind, const std::string& address, nlohmann::json result) {
  Rollout* r = kind.rollout.get();
  if (!r) return;
  auto it = r->entries.find(address);
  if (it == r->entries.end()) return;
  std::unique_ptr<RolloutEntry> e = std::move(it->second);
  r->entries.erase(it);
  e->timeout.cancel();
  const RolloutEntry::Phase phase = e->phase;
  loop_.destroy_later(std::move(e));  // this may run in its own timer's callback
  nlohmann::json item = {{"address", core::wire_encode(address)}};
  if (result.contains("error")) {
    ++r->report.failed;
    log_.warn("worker_reload_failed", "address=\"{}\" version={} error={}", address,
              short_version(r->set.version), log_json(result["error"]));
  } else if (result.contains("stopped")) {
    ++r->stopped;
  } else if (phase == RolloutEntry::Phase::replacing_new) {
    ++r->restarted;
  } else {
    ++r->reloaded;
  }
  item.update(result);
  r->report.workers.push_back(std::move(item));
  if (r->entries.empty() && !r->setting_up) rollout_finish(kind);
}

void Manager::rollout_finish(Kind& kind) {
  std::unique_ptr<Rollout> r = std::move(kind.rollout);
  r->report.took_ms = loop_.now() - r->started_ms;
  log_.info("rollout_done",
            "kind={} version={} reloaded={} restarted={} stopped={} failed={} took_ms={}",
            kind.config.name, short_version(r->set.version), r->reloaded, r->restarted, r->stopped,
            r->report.failed, r->report.took_ms);
  // Deferred: `done` may start the kind's next rollout, or close the manager.
  loop_.defer([done = std::move(r->done), report = std::move(r->report)] {
    if (done) done(report);
  });
  loop_.destroy_later(std::move(r));
}

nlohmann::json Manager::kinds_state() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& kind : kinds_) {
    const auto& code = kind->config.code;
    size_t live = 0, stale = 0;
    for (const auto& [address, home] : homes_) {
      const Worker* w = home->worker.get();
      if (home->kind != kind.get() || !w || w->stopping) continue;
      ++live;
      if (w->version != (code ? code->version : std::string())) ++stale;
    }
    out[kind->config.name] = {{"version", code ? nlohmann::json(code->version) : nullptr},
                              {"dirty", stale > 0},
                              {"workers", live},
                              {"stale", stale},
                              {"rolling", kind->rollout != nullptr},
                              {"spares", kind->spares.size()}};
  }
  return out;
}

std::set<std::string> Manager::versions_in_use(const std::string& kind) const {
  std::set<std::string> out;
  for (const auto& [address, home] : homes_) {
    const Worker* w = home->worker.get();
    if (!w || home->kind->config.name != kind) continue;
    // Stopping ones too (they still run their code), and the sets a reload is bringing it to.
    if (!w->version.empty()) out.insert(w->version);
    if (w->reload_sent) out.insert(w->reload_sent->version);
    if (w->reload_pending) out.insert(w->reload_pending->version);
  }
  return out;
}

}  // namespace corral::workers
