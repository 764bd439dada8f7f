// Supervision: serve() under the fan-out supervisor. It holds what lives for the supervisor's
// whole life — the current Generation, the listeners' addresses, HTTP/3 (QuicService), the
// server processes' last reports, the manager the links answer with — and gives the fan-out its
// hooks: each generation's ChildMain (a ServerProcess), SIGHUP (reload: a new Generation, new
// listeners when the addresses changed), each process's link (workers::serve_link), the services
// (SupervisorServices) and their shutdown.
//
// Lifetime: on serve()'s stack for the whole run(); single-threaded (the supervisor's loop).
#pragma once

#include <memory>
#include <string>

#include "app/generation.h"
#include "app/quic_service.h"
#include "app/services.h"
#include "app/systemd.h"
#include "control/metrics.h"
#include "fanout/supervisor.h"

namespace corral::app {

class Supervision {
 public:
  Supervision(core::Logger& log, Options options, std::string state_dir, SystemdContext systemd);
  // Listeners, processes, HTTP/3, then the supervisor until it stops: the exit status.
  int run();

 private:
  fanout::ChildMain child_main() const;
  bool reload(std::shared_ptr<fanout::ListenerSet>& set, fanout::ChildMain& main);
  bool start_generation(std::shared_ptr<fanout::ListenerSet>& set, fanout::ChildMain& main);
  std::string status(const fanout::Supervisor& supervisor) const;  // systemd's STATUS= line
  std::shared_ptr<void> start_services(core::EventLoop& loop, fanout::Supervisor& supervisor);
  void terminate(std::function<void()> done);

  core::Logger& log_;
  std::string state_dir_;
  // Shared with the ChildMain of its generation (generation.h).
  std::shared_ptr<const Generation> generation_;
  int processes_ = 0;  // as resolved at the start; a reload keeps it
  std::unique_ptr<QuicService> quic_;
  // The server processes' counters for GET /metrics (control/metrics.h): mapped before the first
  // fork; every kind of every generation gets its index before that generation forks. Null if
  // the mapping failed (then /metrics has the supervisor's and the manager's families only).
  std::unique_ptr<control::MetricsRegion> metrics_;
  // What each server process last reported, by slot: written by the links, read by the control
  // API (GET /processes). Shared with the control API's route.
  std::shared_ptr<workers::ProcessReports> reports_ = std::make_shared<workers::ProcessReports>();
  workers::Manager* manager_ = nullptr;     // SupervisorServices' while it serves (services.h)
  SupervisorServices* services_ = nullptr;  // owned by the fan-out (on_started)
  // NOTIFY_SOCKET (READY, RELOADING, STOPPING, STATUS, WATCHDOG) and the sockets systemd passed,
  // which the first listener set takes (app/systemd.h).
  SystemdContext systemd_;
  SystemdReport* systemd_report_ = nullptr;  // owned by the fan-out (on_started), like services_
  // The addresses as configured (not as bound: port 0, a passed socket bound to another address
  // of the same port), which a reload compares with its own.
  std::vector<core::SocketAddress> configured_;
};

}  // namespace corral::app
