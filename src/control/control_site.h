// The control API's routes, served by the supervisor on a Unix socket in the state directory
// (<state-dir>/control.sock, mode 0600: only the user running corral can reach it). Today:
//   GET /processes   the fan-out's slots as JSON (index, pid, cpu, generation, started_at,
//                    restarts, last_exit, backoff_ms, status, and what the process last reported
//                    of itself: "quic" with HTTP/3's connections, steering mode and counters)
// The worker routes (control/worker_routes.h) and the kinds' rollout routes
// (control/rollout_routes.h) are added beside these by app/services.cc.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>

#include "fanout/supervisor.h"
#include "http/site.h"

namespace corral::control {

// `reported(slot)`: what slot's process last reported (an object whose members are added to the
// slot's entry), or null.
using ProcessReport = std::function<nlohmann::json(int slot)>;
// What GET /processes answers: {generation, terminating, processes: [...], draining: [...]}.
nlohmann::json processes_json(const fanout::Supervisor& supervisor,
                              const ProcessReport& reported = {});
void add_process_routes(http::SiteBuilder& site, const fanout::Supervisor& supervisor,
                        ProcessReport reported = {});

}  // namespace corral::control
