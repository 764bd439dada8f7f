// Rollouts: the kinds' code from directory to live workers (issue 13; docs/deploying.md). Owns
// the code store, the thread its work runs on and the --watch watchers, borrows the Manager: a
// rollout snapshots the kind's directory (or finds a kept version: a rollback) on the store's
// thread (workers/code_store_thread.h: never on the loop, which goes on serving meanwhile), hands
// the set to Manager::rollout, makes it the kind's current version once the manager took it, and
// collects the store's old versions once it is done. One rollout per kind at a time: calls that
// come meanwhile wait, and waiting calls for the same target share the next run's report (a burst
// of saved files under --watch is one rollout).
//
// Refusals, answered through `done` (never before rollout() returns) and logged
// `rollout_refused kind= code= error=`: an unknown kind 404 `unknown_kind`, a kind without `code`
// 409 `no_code`, a `to` that is no kept version (or a prefix of fewer than 8 hex digits, or one
// that two versions share) 404 `unknown_version`, a snapshot that failed (the reason names the
// path) 500 `snapshot_failed`. A refused set never becomes current. After each rollout the store
// keeps the kind's kKeepVersions newest versions, every version a live worker runs and every
// version a waiting `to` names.
//
// --watch: one CodeWatcher per kind with code; each settled burst is a rollout of the directory,
// logged `watch_rollout kind= trigger=change` (the manager logs `rollout_done` with the counts)
// and, when refused, `watch_rollout_refused kind= code= error=`.
//
// Lifetime: made by the supervisor's services after the Manager, destroyed before it; a rollout
// still running at destruction never calls back (a snapshot under way is stopped and its thread
// joined). On the loop's thread, but for the store's work on the store's thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/result.h"
#include "workers/code_store.h"
#include "workers/code_store_thread.h"
#include "workers/code_watch.h"
#include "workers/manager.h"

namespace corral::workers {

// A refused rollout: the HTTP status and public error the control API answers with.
struct RolloutRefusal {
  int status;            // 404 unknown_kind | unknown_version, 409 no_code, 500 snapshot_failed
  nlohmann::json error;  // {message, code}
};

class Rollouts {
 public:
  using Done = std::function<void(const RolloutReport*, const RolloutRefusal*)>;

  // Snapshots the code directory (KindConfig::code_dir) of every kind of `options` that has one
  // and sets KindConfig::code to it: call before Manager::create. The error names the kind and
  // the path.
  static core::Result<void> prepare(const std::string& state_dir, ManagerOptions& options);

  // `kinds`: the manager's (after prepare): each kind's code directory and timeouts.
  Rollouts(core::EventLoop& loop, core::Logger& log, Manager& manager, const std::string& state_dir,
           const std::vector<KindConfig>& kinds);
  ~Rollouts();
  Rollouts(const Rollouts&) = delete;
  Rollouts& operator=(const Rollouts&) = delete;

  // `to`: a kept version (full hex or a unique prefix of at least 8 digits). Exactly one of the
  // two pointers `done` gets is set.
  void rollout(const std::string& kind, std::optional<std::string> to, Done done);
  // Starts watching every kind's code directory: each settled change is a rollout, logged.
  core::Result<void> watch(uint32_t settle_ms = 100);
  // Manager::kinds_state() with, per kind, its kept versions ("versions":[{version, current}],
  // newest first), "code" (the directory, null without), "reload" (auto|in-place|restart) and
  // "rollout_timeout_ms" (how long one of its rollouts may take at most: the longer of
  // reload_timeout and stop_grace + start_timeout; `corral ctl rollout` waits that plus 30 s).
  nlohmann::json state() const;

 private:
  struct Pending;
  struct KindRuns;
  void run_next(const std::string& kind);
  // On the loop, once the store's thread found the set `to` names, or snapshotted the directory.
  void start(const std::string& kind, core::Result<CodeSet> set,
             const std::optional<std::string>& to);
  void finish(const std::string& kind, const RolloutReport* report, const RolloutRefusal* refusal);
  // Collects the kind's old versions on the store's thread, then runs `then` on the loop.
  void collect(const std::string& kind, std::function<void()> then);

  core::EventLoop& loop_;
  core::Logger& log_;
  Manager& manager_;
  std::optional<CodeStore> store_;
  std::unique_ptr<CodeStoreThread> store_thread_;  // the store's work (set with store_)
  // CORRAL_TEST_SNAPSHOT_HOLD (test builds only, CORRAL_FAULT_INJECTION): while this file
  // exists, a snapshot holds after each file's copy, so a test can act while one is surely under
  // way.
  std::string snapshot_hold_;
  std::map<std::string, std::unique_ptr<KindRuns>, std::less<>> runs_;
  std::map<std::string, std::unique_ptr<CodeWatcher>, std::less<>> watchers_;
  std::shared_ptr<bool> alive_;
};

}  // namespace corral::workers
