#include "control/control_site.h"

#include <nlohmann/json.hpp>

namespace corral::control {

nlohmann::json processes_json(const fanout::Supervisor& supervisor, const ProcessReport& reported) {
  nlohmann::json slots = nlohmann::json::array();
  for (const auto& s : supervisor.state()) {
    slots.push_back({{"index", s.index},
                     {"pid", s.pid},
                     {"cpu", s.cpu},
                     {"generation", s.generation},
                     {"started_at", s.started_at},
                     {"restarts", s.restarts},
                     {"last_exit", s.last_exit},
                     {"backoff_ms", s.backoff_ms},
                     {"status", s.status}});
    if (reported && s.pid != 0) {
      auto extra = reported(s.index);
      if (extra.is_object())
        for (auto& [k, v] : extra.items()) slots.back()[k] = v;
    }
  }
  // Older generations' processes still running after a reload (docs/process-model.md).
  nlohmann::json draining = nlohmann::json::array();
  for (const auto& d : supervisor.draining())
    draining.push_back({{"index", d.slot},
                        {"pid", d.pid},
                        {"generation", d.generation},
                        {"since", d.since},
                        {"status", d.status}});
  return {{"generation", supervisor.generation()},
          {"terminating", supervisor.terminating()},
          {"processes", slots},
          {"draining", draining}};
}

void add_process_routes(http::SiteBuilder& site, const fanout::Supervisor& supervisor,
                        ProcessReport reported) {
  site.route("GET /processes", [&supervisor, reported](http::Request&) {
    return http::Response::json(processes_json(supervisor, reported));
  });
}

}  // namespace corral::control
