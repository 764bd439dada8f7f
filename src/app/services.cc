#include "app/services.h"

#include "control/control_site.h"
#include "control/rollout_routes.h"
#include "control/worker_routes.h"

namespace corral::app {

SupervisorServices::SupervisorServices(core::EventLoop& loop, core::Logger& log,
                                       fanout::Supervisor& supervisor, const Generation& generation,
                                       const std::string& state_dir,
                                       std::shared_ptr<const workers::ProcessReports> reports,
                                       workers::Manager*& manager_ref)
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
  control_ = std::make_unique<http::Server>(loop, log, opts);
  http::SiteBuilder site;
  control::add_process_routes(site, supervisor, [reports](int slot) {
    auto it = reports->by_slot.find(slot);
    return it == reports->by_slot.end() ? nlohmann::json() : it->second;
  });
  if (manager_) {
    control::add_worker_routes(site, *manager_);
    control::add_rollout_routes(site, *rollouts_);
  }
  (void)control_->adopt_listener(std::move(fd.value()));
  control_->publish(site.build().value());
  log.info("control_listening", "path={}", control_path);
}

SupervisorServices::~SupervisorServices() {
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
