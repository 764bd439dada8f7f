#include "cli/worker_kinds.h"

#include "workers/code_store.h"

namespace corral::cli {

std::vector<workers::KindConfig> kind_configs(const std::vector<WorkerKind>& kinds) {
  std::vector<workers::KindConfig> out;
  for (const auto& k : kinds) {
    workers::KindConfig c;
    c.name = k.name;
    c.command = k.command;
    c.env = k.env;
    c.routes = k.routes;
    c.idle_ms = k.idle_ms;
    c.start_timeout_ms = k.start_timeout_ms;
    c.ready_timeout_ms = k.ready_timeout_ms;
    c.stop_grace_ms = k.stop_grace_ms;
    c.max_workers = k.max_workers;
    c.spares = k.spares;
    c.code_dir = k.code;
    c.reload = k.reload == "in-place"  ? workers::KindConfig::Reload::in_place
               : k.reload == "restart" ? workers::KindConfig::Reload::restart
                                       : workers::KindConfig::Reload::automatic;
    c.reload_timeout_ms = k.reload_timeout_ms;
    c.response_timeout_ms = k.response_timeout_ms;
    c.heartbeat_ms = k.heartbeat_ms;
    // Containment (workers/containment.h, kind_log.h)
    c.limits = {k.memory_max, k.pids_max, k.cpu_weight};
    c.log_rotation = {k.log_max_size, k.log_keep};
    c.max_body = k.max_body;  // streamed request bodies (issue 14)
    out.push_back(std::move(c));
  }
  return out;
}

void check_code_dirs(const std::vector<WorkerKind>& kinds, std::vector<std::string>& problems) {
  for (const auto& k : kinds) {
    if (k.code.empty()) continue;
    if (auto r = workers::CodeStore::check(k.code); !r)
      problems.push_back("workers." + k.name + ".code: " + r.error().reason);
  }
}

}  // namespace corral::cli
