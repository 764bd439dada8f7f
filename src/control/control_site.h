// The control API's routes, served by the supervisor on a Unix socket in the state directory
// (<state-dir>/control.sock, mode 0600: only the user running corral can reach it). Today:
//   GET /processes   the fan-out's slots as JSON (index, pid, cpu, generation, started_at,
//                    restarts, last_exit, backoff_ms, status)
// The workers issue adds the worker routes here.
#pragma once

#include "fanout/supervisor.h"
#include "http/site.h"

namespace corral::control {

void add_process_routes(http::SiteBuilder& site, const fanout::Supervisor& supervisor);

}  // namespace corral::control
