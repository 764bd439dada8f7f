// TEMP (dropped at merge: r-manager builds the real manager_rollout.cc): a Manager::rollout that
// only makes the set current and reports no workers, so that r-glue links and its tests run.
#include "workers/manager.h"
#include "workers/manager_impl.h"

namespace corral::workers {

bool Manager::rollout(const std::string& kind, CodeSet set, RolloutCallback done) {
  for (auto& k : kinds_) {
    if (k->config.name != kind) continue;
    RolloutReport report;
    report.kind = kind;
    report.version = set.version;
    report.previous = k->config.code ? k->config.code->version : "";
    log_.info("rollout_started", "kind={} version={} workers=0", kind, set.short_version());
    k->config.code = std::move(set);
    loop_.defer([done = std::move(done), report = std::move(report)] { done(report); });
    return true;
  }
  return false;
}

nlohmann::json Manager::kinds_state() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& k : kinds_)
    out[k->config.name] = {
        {"version", k->config.code ? nlohmann::json(k->config.code->version) : nlohmann::json()},
        {"dirty", false},
        {"workers", live_by_kind_[k->index]},
        {"stale", 0},
        {"rolling", false}};
  return out;
}

std::set<std::string> Manager::versions_in_use(const std::string&) const {
  return {};
}

}  // namespace corral::workers
