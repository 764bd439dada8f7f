// SupervisorServices: what the supervisor runs on its own loop once its first generation is
// forked: the worker manager (with worker kinds) and the control API on <state>/control.sock
// (GET /processes, /workers, the workers' operations, the kinds' rollouts, /healthz, /readyz,
// /metrics: control/metrics.h) and, with Options::admin_listen, the same Site over TCP
// (control/admin.h). With the manager come its Rollouts (issue 13: the code store, `--watch`'s
// watchers), a member after the manager and destroyed before it; the kinds' code was snapshotted
// by serve() before anything forked (Rollouts::prepare). The control server is a member after
// both, so it is destroyed first (its routes use them).
//
// Lifetime: made by the fan-out's on_started and owned by it (destroyed before the loop).
// `manager_ref` is the Supervision's pointer that the server processes' links answer with
// (workers::serve_link): set while a manager serves, null once it closes or goes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "app/generation.h"
#include "control/admin.h"
#include "control/metrics.h"
#include "fanout/supervisor.h"
#include "http/server.h"
#include "workers/link_server.h"
#include "workers/manager.h"
#include "workers/rollouts.h"

namespace corral::app {

class SupervisorServices {
 public:
  SupervisorServices(core::EventLoop& loop, core::Logger& log, fanout::Supervisor& supervisor,
                     const Generation& generation, const std::string& state_dir,
                     std::shared_ptr<const workers::ProcessReports> reports,
                     workers::Manager*& manager_ref, const control::MetricsRegion* metrics);
  ~SupervisorServices();
  SupervisorServices(const SupervisorServices&) = delete;
  SupervisorServices& operator=(const SupervisorServices&) = delete;

  // SIGTERM: the manager stops every worker; `done` once none is left.
  void close(std::function<void()> done);

 private:
  void start_admin(core::EventLoop& loop, core::Logger& log, const core::SocketAddress& listen,
                   const http::AdmissionPolicy* policy, std::shared_ptr<const http::Site> site);

  workers::Manager*& manager_ref_;
  std::unique_ptr<workers::Manager> manager_;
  std::unique_ptr<workers::Rollouts> rollouts_;
  std::unique_ptr<http::Server> control_;
  std::unique_ptr<control::AdminListener> admin_;  // [admin] listen: the same Site over TCP
};

}  // namespace corral::app
