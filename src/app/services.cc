#include "app/services.h"

#include <sys/socket.h>
#include <unistd.h>

#include "control/admin.h"
#include "control/control_site.h"
#include "control/metrics.h"
#include "control/rollout_routes.h"
#include "control/status_page.h"
#include "control/worker_routes.h"

namespace corral::app {

SupervisorServices::SupervisorServices(core::EventLoop& loop, core::Logger& log,
                                       fanout::Supervisor& supervisor, const Generation& generation,
                                       const std::string& state_dir,
                                       std::shared_ptr<const workers::ProcessReports> reports,
                                       workers::Manager*& manager_ref,
                                       const control::MetricsRegion* metrics)
    : manager_ref_(manager_ref) {
  const Options& o = generation.options;
  if (!o.kinds.empty()) {
    workers::ManagerOptions mo;
    mo.state_dir = state_dir;
    mo.kinds = o.kinds;
    mo.max_workers = o.max_workers;
    mo.max_starting = o.max_starting;
    auto m = workers::Manager::create(loop, log, std::move(mo), nullptr);
    if (!m) {
      log.error("workers_failed", "error=\"{}\"", m.error().reason);
    } else {
      manager_ = std::move(m.value());
      manager_ref_ = manager_.get();
      rollouts_ = std::make_unique<workers::Rollouts>(loop, log, *manager_, state_dir, o.kinds);
      if (o.watch)
        if (auto w = rollouts_->watch(); !w)
          log.error("watch_failed", "error=\"{}\"", w.error().reason);
    }
  }
  std::string control_path = state_dir + "/control.sock";
  auto fd = core::listen_unix(control_path);
  if (!fd) {
    log.error("control_failed", "path={} error=\"{}\"", control_path, fd.error().reason);
    return;
  }
  http::ServerOptions opts;
  opts.access_log = false;
  // Only the user running corral: the socket's mode (0600) says so to the file system, and
  // SO_PEERCRED says so again for a socket file whose mode was opened (root is no exception
  // unless corral runs as root; docs/operate.md, "The control socket").
  opts.admit_socket = [&log, me = ::geteuid()](int fd) {
    ucred peer{};
    socklen_t len = sizeof peer;
    bool known = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0;
    if (known && peer.uid == me) return true;
    log.warn("control_refused", "uid={} pid={}", known ? int64_t{peer.uid} : -1,
             known ? int64_t{peer.pid} : -1);
    return false;
  };
  control_ = std::make_unique<http::Server>(loop, log, opts);
  http::SiteBuilder site;
  // What each server process last reported, and what its metrics block counts now: requests
  // (every protocol, every code) and open connections, for GET /processes and the status page.
  control::ProcessReport reported = [reports, metrics, &supervisor](int slot) {
    auto it = reports->by_slot.find(slot);
    nlohmann::json extra = it == reports->by_slot.end() ? nlohmann::json() : it->second;
    if (!metrics) return extra;
    for (const auto& st : supervisor.state()) {
      if (st.index != slot) continue;
      const http::ProcessMetrics* b = metrics->block(slot, st.generation);
      if (!b) break;
      uint64_t requests = 0;
      int64_t open = 0;
      for (const auto& p : b->proto) {
        for (uint64_t n : p.requests) requests += http::load(n);
      }
      for (int64_t n : b->gauges.connections_open) open += http::load(n);
      if (!extra.is_object()) extra = nlohmann::json::object();
      extra["http_requests"] = requests;
      extra["connections_open"] = open;
      extra["websockets_open"] = http::load(b->gauges.websockets_open);
      break;
    }
    return extra;
  };
  control::add_process_routes(site, supervisor, reported);
  if (manager_) {
    control::add_worker_routes(site, *manager_);
    control::add_rollout_routes(site, *rollouts_);
  }
  control::add_status_routes(site, loop, {&supervisor, reported, manager_.get()});
  control::add_health_routes(site, supervisor);
  control::add_metrics_routes(site, {metrics, &supervisor, manager_.get()});
  if (o.admin_listen)
    control::add_admin_guard(site, std::make_shared<control::AdminAccess>(o.admin), log);
  auto built = site.build().value();
  (void)control_->adopt_listener(std::move(fd.value()));
  control_->publish(built);
  log.info("control_listening", "path={}", control_path);
  if (o.admin_listen) start_admin(loop, log, *o.admin_listen, o.policy.get(), built);
}

// The control Site over TCP as well (control/admin.h). A port it cannot bind is logged: the
// server processes serve on regardless.
void SupervisorServices::start_admin(core::EventLoop& loop, core::Logger& log,
                                     const core::SocketAddress& listen,
                                     const http::AdmissionPolicy* policy,
                                     std::shared_ptr<const http::Site> site) {
  auto a = control::AdminListener::start(loop, log, listen, control::admin_policy(policy, listen),
                                         std::move(site));
  if (!a) {
    log.error("admin_failed", "address={} error=\"{}\"", listen.to_string(), a.error().reason);
    return;
  }
  admin_ = std::move(a.value());
  log.info("admin_listening", "url={}", admin_->url());
}

SupervisorServices::~SupervisorServices() {
  admin_.reset();
  control_.reset();
  rollouts_.reset();
  if (manager_ref_ == manager_.get()) manager_ref_ = nullptr;
}

void SupervisorServices::close(std::function<void()> done) {
  if (!manager_ref_) return done();
  manager_ref_->close([this, done = std::move(done)] {
    manager_ref_ = nullptr;
    done();
  });
}

}  // namespace corral::app
