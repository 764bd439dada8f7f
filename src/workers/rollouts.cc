#include "workers/rollouts.h"

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <set>
#include <utility>
#include <vector>

namespace corral::workers {

namespace {

RolloutRefusal refusal(int status, std::string message, const char* code) {
  return {status, {{"message", std::move(message)}, {"code", code}}};
}

const char* reload_name(KindConfig::Reload r) {
  switch (r) {
    case KindConfig::Reload::in_place:
      return "in-place";
    case KindConfig::Reload::restart:
      return "restart";
    case KindConfig::Reload::automatic:
      break;
  }
  return "auto";
}

// What `to` must look like before the store is asked: 8 to 64 hex digits (lowercased first).
bool version_like(const std::string& to) {
  if (to.size() < 8 || to.size() > 64) return false;
  for (char c : to)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

// One queued call's target and everyone who waits for its run (calls for the same target that
// came one after the other share it).
struct Rollouts::Pending {
  std::optional<std::string> to;
  std::vector<Done> waiters;
};

struct Rollouts::KindRuns {
  std::string code_dir;  // empty: the kind has no code
  std::string reload;
  uint64_t rollout_timeout_ms = 0;
  bool running = false;
  std::vector<Done> current;  // the waiters of the run under way
  std::deque<Pending> queue;
};

core::Result<void> Rollouts::prepare(const std::string& state_dir, ManagerOptions& options) {
  std::optional<CodeStore> store;
  for (auto& kind : options.kinds) {
    if (kind.code_dir.empty()) continue;
    if (!store) {
      auto s = CodeStore::open(state_dir);
      if (!s) return core::Error{s.error().code, "code store: " + s.error().reason};
      store.emplace(std::move(s.value()));
    }
    auto set = store->snapshot(kind.name, kind.code_dir);
    if (!set)
      return core::Error{set.error().code, "workers." + kind.name + ".code: " + set.error().reason};
    if (auto r = store->make_current(kind.name, set->version); !r)
      return core::Error{r.error().code, "workers." + kind.name + ".code: " + r.error().reason};
    kind.code = std::move(set.value());
    // Nothing runs yet: what an earlier run left beyond the kept versions can go. A failure is
    // tried again after the next rollout.
    (void)store->collect(kind.name, kKeepVersions, {});
  }
  return {};
}

Rollouts::Rollouts(core::EventLoop& loop, core::Logger& log, Manager& manager,
                   const std::string& state_dir, const std::vector<KindConfig>& kinds)
    : loop_(loop), log_(log), manager_(manager), alive_(std::make_shared<bool>(true)) {
  bool any_code = false;
  for (const auto& k : kinds) {
    auto runs = std::make_unique<KindRuns>();
    runs->code_dir = k.code_dir;
    runs->reload = reload_name(k.reload);
    // One worker's worst case: in place, reload_timeout; replaced, its stop (stop_grace), its
    // queued start (start_limit after start_timeout), its start (start_timeout) and its setup
    // (reload_timeout from the fork: Manager::rollout_on_start). Replacements that queue behind
    // max_starting may take longer in all; ctl then says the rollout goes on.
    runs->rollout_timeout_ms = uint64_t{k.stop_grace_ms} + 2 * uint64_t{k.start_timeout_ms} +
                               uint64_t{k.reload_timeout_ms};
    any_code = any_code || !k.code_dir.empty();
    runs_.emplace(k.name, std::move(runs));
  }
  if (!any_code) return;
  auto s = CodeStore::open(state_dir);
  if (!s) {
    log_.error("code_store_failed", "error=\"{}\"", s.error().reason);
    return;
  }
  auto t = CodeStoreThread::create(loop_);
  if (!t) {
    log_.error("code_store_failed", "error=\"{}\"", t.error().reason);
    return;
  }
  store_.emplace(std::move(s.value()));
  store_thread_ = std::move(t.value());
#ifdef CORRAL_FAULT_INJECTION
  if (const char* hold = std::getenv("CORRAL_TEST_SNAPSHOT_HOLD"); hold && *hold)
    snapshot_hold_ = hold;
#endif
}

Rollouts::~Rollouts() {
  *alive_ = false;
  store_thread_.reset();  // stops a snapshot under way and joins: nothing uses store_ after this
}

void Rollouts::rollout(const std::string& kind, std::optional<std::string> to, Done done) {
  auto refuse = [this, &done, &kind](RolloutRefusal r) {
    log_.warn("rollout_refused", "kind={} code={} error=\"{}\"", kind, r.error.value("code", ""),
              r.error.value("message", ""));
    loop_.defer([alive = alive_, done = std::move(done), r = std::move(r)] {
      if (*alive) done(nullptr, &r);
    });
  };
  auto it = runs_.find(kind);
  if (it == runs_.end())
    return refuse(refusal(404, "No worker kind is named '" + kind + "'.", "unknown_kind"));
  KindRuns& runs = *it->second;
  if (runs.code_dir.empty())
    return refuse(refusal(
        409,
        "The worker kind '" + kind + "' has no code to roll out (set [workers." + kind + "] code).",
        "no_code"));
  if (runs.running)
    log_.info("rollout_queued", "kind={} to={} (after the rollout under way)", kind,
              to ? *to : std::string("directory"));
  // A run of the same target queued last (a burst of saved files, a second click) is the one
  // this call waits for: it starts after this call, so it sees what this call wanted.
  if (!runs.queue.empty() && runs.queue.back().to == to) {
    runs.queue.back().waiters.push_back(std::move(done));
  } else {
    Pending p{std::move(to), {}};
    p.waiters.push_back(std::move(done));
    runs.queue.push_back(std::move(p));
  }
  // Deferred: `done` never runs before rollout() returns, and a burst of calls in one loop round
  // coalesces before the first run takes its snapshot.
  loop_.defer([this, alive = alive_, kind] {
    if (*alive) run_next(kind);
  });
}

void Rollouts::run_next(const std::string& kind) {
  auto it = runs_.find(kind);
  if (it == runs_.end()) return;
  KindRuns& runs = *it->second;
  if (runs.running || runs.queue.empty()) return;
  Pending p = std::move(runs.queue.front());
  runs.queue.pop_front();
  runs.running = true;
  runs.current = std::move(p.waiters);

  if (!store_) {
    RolloutRefusal r = refusal(500, "The code store could not be opened.", "snapshot_failed");
    return finish(kind, nullptr, &r);
  }
  CodeStore* store = &*store_;
  auto deliver = [this, alive = alive_, kind, to = p.to](core::Result<CodeSet> set) {
    return std::function<void()>([this, alive, kind, to, set = std::move(set)]() mutable {
      if (*alive) start(kind, std::move(set), to);
    });
  };
  if (p.to) {
    for (char& c : *p.to) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!version_like(*p.to)) {
      RolloutRefusal r =
          refusal(404, "'" + *p.to + "' is not a version: 8 to 64 hex digits.", "unknown_version");
      return finish(kind, nullptr, &r);
    }
    // Not made current yet: only once the manager took it (start()).
    store_thread_->post([store, kind, to = *p.to, deliver](std::stop_token) {
      return deliver(store->find(kind, to, /*make_current=*/false));
    });
    return;
  }
  log_.info("rollout_snapshot", "kind={} dir={}", kind, runs.code_dir);
  store_thread_->post(
      [store, kind, dir = runs.code_dir, hold = snapshot_hold_, deliver](std::stop_token stop) {
        SnapshotControl control;
        control.stop = stop;
        if (!hold.empty()) {
          // Tests only: hold after each file's copy while the file `hold` exists (or until a stop).
          control.after_copy = [hold, stop](const std::string&) {
            struct stat st;
            while (!stop.stop_requested() && ::stat(hold.c_str(), &st) == 0) {
              timespec ts{0, 10'000'000};
              ::nanosleep(&ts, nullptr);
            }
          };
        }
        return deliver(store->snapshot(kind, dir, control));
      });
}

void Rollouts::start(const std::string& kind, core::Result<CodeSet> set,
                     const std::optional<std::string>& to) {
  auto it = runs_.find(kind);
  if (it == runs_.end()) return;
  KindRuns& runs = *it->second;
  if (!set) {
    if (to) {
      // ENOENT/EINVAL: no kept version has it, or two do; anything else is the store's I/O.
      int code = set.error().code;
      bool unknown = code == ENOENT || code == EINVAL || code == 0;
      RolloutRefusal r =
          unknown
              ? refusal(404,
                        "No kept version of '" + kind + "' is '" + *to + "': " + set.error().reason,
                        "unknown_version")
              : refusal(500, set.error().reason, "snapshot_failed");
      return finish(kind, nullptr, &r);
    }
    RolloutRefusal r =
        refusal(500, "The snapshot of " + runs.code_dir + " failed: " + set.error().reason,
                "snapshot_failed");
    return finish(kind, nullptr, &r);
  }
  if (!to)
    log_.info("rollout_snapshot_done", "kind={} version={} files={}", kind, set->short_version(),
              set->files.size());
  std::string version = set->version;
  bool started = manager_.rollout(kind, std::move(set.value()),
                                  [this, alive = alive_, kind](const RolloutReport& report) {
                                    if (*alive) finish(kind, &report, nullptr);
                                  });
  if (!started) {
    // Unknown to the manager (it was made from other kinds) or already rolling: neither
    // happens while Rollouts serialises the kind's calls, but the caller gets an answer.
    RolloutRefusal r =
        refusal(503, "The worker manager refused the rollout (it is closing).", "closing");
    return finish(kind, nullptr, &r);
  }
  // The manager took it: it is the kind's current version (before this run's collect, which is
  // posted behind it).
  CodeStore* store = &*store_;
  store_thread_->post([this, store, kind, version, alive = alive_](std::stop_token) {
    auto r = store->make_current(kind, version);
    return std::function<void()>([this, alive, kind, r = std::move(r)] {
      if (*alive && !r)
        log_.warn("code_history_failed", "kind={} error=\"{}\"", kind, r.error().reason);
    });
  });
}

void Rollouts::collect(const std::string& kind, std::function<void()> then) {
  auto it = runs_.find(kind);
  if (!store_ || it == runs_.end()) return then();
  // Kept besides the newest: what a live worker runs, and what a waiting `to` names (a kept
  // version someone asked for must still be there when its turn comes).
  std::set<std::string> in_use = manager_.versions_in_use(kind);
  std::vector<std::string> wanted;
  for (const auto& p : it->second->queue) {
    if (!p.to) continue;
    std::string to = *p.to;
    for (char& c : to) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (version_like(to)) wanted.push_back(std::move(to));
  }
  CodeStore* store = &*store_;
  store_thread_->post([this, store, kind, in_use = std::move(in_use), wanted = std::move(wanted),
                       then = std::move(then), alive = alive_](std::stop_token) mutable {
    for (const auto& v : store->versions(kind))
      for (const auto& to : wanted)
        if (v.compare(0, to.size(), to) == 0) in_use.insert(v);
    auto r = store->collect(kind, kKeepVersions, in_use);
    return std::function<void()>([this, alive, kind, r = std::move(r), then = std::move(then)] {
      if (!*alive) return;
      if (!r) log_.warn("code_collect_failed", "kind={} error=\"{}\"", kind, r.error().reason);
      then();
    });
  });
}

void Rollouts::finish(const std::string& kind, const RolloutReport* report,
                      const RolloutRefusal* refusal) {
  auto it = runs_.find(kind);
  if (it == runs_.end()) return;
  if (refusal)
    log_.warn("rollout_refused", "kind={} code={} error=\"{}\"", kind,
              refusal->error.value("code", ""), refusal->error.value("message", ""));
  // The answers once the store's work for this run is done (its history written, its old
  // versions collected, after a refused snapshot too: it may have stored a version that never
  // became current): `ctl kinds` right after `ctl rollout` lists what the report says.
  std::optional<RolloutReport> kept_report;
  std::optional<RolloutRefusal> kept_refusal;
  if (report) kept_report = *report;
  if (refusal) kept_refusal = *refusal;
  collect(kind, [this, kind, report = std::move(kept_report), refusal = std::move(kept_refusal)] {
    auto it = runs_.find(kind);
    if (it == runs_.end()) return;
    KindRuns& runs = *it->second;
    auto waiters = std::move(runs.current);
    runs.current.clear();
    runs.running = false;
    // The next run after this one's answers, on a later round (a waiter may queue another).
    if (!runs.queue.empty())
      loop_.defer([this, alive = alive_, kind] {
        if (*alive) run_next(kind);
      });
    auto alive = alive_;
    for (auto& done : waiters) {
      if (!*alive) return;  // a waiter destroyed us
      done(report ? &*report : nullptr, refusal ? &*refusal : nullptr);
    }
  });
}

core::Result<void> Rollouts::watch(uint32_t settle_ms) {
  for (const auto& [kind, runs] : runs_) {
    if (runs->code_dir.empty() || watchers_.count(kind)) continue;
    auto w = CodeWatcher::create(loop_, log_, runs->code_dir, settle_ms, [this, kind = kind] {
      log_.info("watch_rollout", "kind={} trigger=change", kind);
      rollout(kind, std::nullopt, [this, kind](const RolloutReport*, const RolloutRefusal* r) {
        // The report is the manager's `rollout_done` line (and its worker_reload_failed).
        if (r)
          log_.error("watch_rollout_refused", "kind={} code={} error=\"{}\"", kind,
                     r->error.value("code", ""), r->error.value("message", ""));
      });
    });
    if (!w)
      return core::Error{w.error().code, "workers." + kind + ".code: watch: " + w.error().reason};
    watchers_.emplace(kind, std::move(w.value()));
    log_.info("watching", "kind={} dir={} settle_ms={}", kind, runs->code_dir, settle_ms);
  }
  return {};
}

nlohmann::json Rollouts::state() const {
  nlohmann::json out = manager_.kinds_state();
  if (!out.is_object()) out = nlohmann::json::object();
  for (const auto& [kind, runs] : runs_) {
    nlohmann::json& k = out[kind];
    if (!k.is_object()) k = nlohmann::json::object();
    if (!k.contains("version")) k["version"] = nullptr;
    k["code"] = runs->code_dir.empty() ? nlohmann::json() : nlohmann::json(runs->code_dir);
    k["reload"] = runs->reload;
    k["rollout_timeout_ms"] = runs->rollout_timeout_ms;
    nlohmann::json versions = nlohmann::json::array();
    if (store_ && !runs->code_dir.empty()) {
      const nlohmann::json& current = k["version"];
      for (const auto& v : store_->versions(kind))
        versions.push_back(
            {{"version", v}, {"current", current.is_string() && current.get<std::string>() == v}});
    }
    k["versions"] = std::move(versions);
  }
  return out;
}

}  // namespace corral::workers
