#include "app/supervision.h"

#include <unistd.h>

#include "app/problems.h"
#include "app/server_process.h"
#include "fanout/cpus.h"
#include "fanout/launcher.h"
#include "fanout/listen_claim.h"

namespace corral::app {

namespace {

std::vector<core::SocketAddress> wanted_addresses(const Options& o) {
  std::vector<core::SocketAddress> a{o.listen};
  if (o.tls_listen) a.push_back(*o.tls_listen);
  return a;
}

void log_listening(core::Logger& log, const fanout::ListenerSet& set) {
  if (set.addresses.size() > 1)
    log.info("tls_listening", "address={}", set.addresses[1].to_string());
}

}  // namespace

Supervision::Supervision(core::Logger& log, Options options, std::string state_dir,
                         SystemdContext systemd)
    : log_(log), state_dir_(std::move(state_dir)), systemd_(std::move(systemd)) {
  auto g = std::make_shared<Generation>();
  g->options = std::move(options);
  generation_ = std::move(g);
}

fanout::ChildMain Supervision::child_main() const {
  // The fan-out calls it in the forked child, where this Supervision is a copy nobody else uses.
  return [this, generation = generation_](const fanout::ChildContext& ctx) {
    return ServerProcess(log_, generation, ctx, quic_.get(), metrics_.get()).run();
  };
}

int Supervision::run() {
  const Options& o = generation_->options;
  auto cpus = fanout::allowed_cpus();
  if (!cpus) return print_problem("processes", cpus.error().reason);
  auto n = fanout::resolve_process_count(o.processes, cpus.value(), o.pin);
  if (!n) return print_problem("processes", n.error().reason);
  processes_ = n.value();
  configured_ = wanted_addresses(o);
  auto listeners = fanout::make_listeners(configured_, processes_, nullptr, &systemd_.passed);
  if (!listeners) return listen_problem(log_, o.listen, listeners.error());
  auto set = std::make_shared<fanout::ListenerSet>(std::move(listeners.value()));
  fanout::report_claims(log_, set->claims);
  log_.info("listening", "address={} processes={} pin={}", set->addresses.front().to_string(),
            processes_, o.pin);
  log_listening(log_, *set);
  // The TLS port as bound, for the first generation's Alt-Svc: set before the generation is shared
  // (child_main, below).
  if (set->addresses.size() > 1)
    std::const_pointer_cast<Generation>(generation_)->tls_port = set->addresses[1].port();

  if (auto region = control::MetricsRegion::map(processes_); region) {
    metrics_ = std::move(region.value());
    for (const auto& kind : o.kinds) (void)metrics_->add_kind(kind.name);
  } else {
    log_.error("metrics_failed", "error=\"{}\"", region.error().reason);
  }

  fanout::SupervisorOptions options;
  options.processes = processes_;
  options.pin = o.pin;
  options.cpus = cpus.value();
  options.stop_timeout_ms = o.server.close_timeout_ms + 5'000;
  options.max_draining = static_cast<uint32_t>(o.max_draining_generations);
  if (o.tls && o.http3) {
    int status = 1;
    quic_ = QuicService::create(log_, *generation_, set->addresses[1], processes_, status);
    if (!quic_) return status;
    options.quic = quic_->sockets();
  }

  fanout::FanoutHooks hooks;
  hooks.on_reload = [this](std::shared_ptr<fanout::ListenerSet>& set, fanout::ChildMain& main) {
    return reload(set, main);
  };
  hooks.on_link = [this](int slot, core::MessageLink& link) {
    workers::serve_link(link, &manager_, slot, reports_);
  };
  hooks.on_started = [this](core::EventLoop& loop, fanout::Supervisor& supervisor) {
    return start_services(loop, supervisor);
  };
  hooks.on_terminate = [this](std::function<void()> done) { terminate(std::move(done)); };
  // SIGUSR1: the kinds' log files are opened again at their next line.
  hooks.on_reopen_logs = [this] {
    if (manager_) manager_->reopen_logs();
  };
  hooks.on_serving = [this](uint64_t generation) {
    systemd_.notifier.ready();
    if (systemd_report_) systemd_report_->update();
    log_.debug("serving", "generation={}", generation);
  };
  // The set is the supervisor's from here: a reload that replaces it lets it go (and its sockets
  // and claims with its last process).
  fanout::ForkLauncher launcher(log_);
  int r = fanout::run_fanout(log_, launcher, options, std::move(set), child_main(), hooks);
  unlink((state_dir_ + "/control.sock").c_str());
  return r < 0 ? 1 : r;
}

bool Supervision::reload(std::shared_ptr<fanout::ListenerSet>& set, fanout::ChildMain& main) {
  // systemd: reloading from now until the new generation serves (on_serving: READY=1), or at once
  // back to ready when the reload is refused and the current generation goes on.
  systemd_.notifier.reloading();
  bool started = start_generation(set, main);
  if (!started) systemd_.notifier.ready();
  return started;
}

bool Supervision::start_generation(std::shared_ptr<fanout::ListenerSet>& set,
                                   fanout::ChildMain& main) {
  const Options& current = generation_->options;
  auto fresh = std::make_shared<Generation>();
  if (current.reload) {
    if (!current.reload(fresh->options)) return false;
  } else {
    fresh->options = current;
  }
  Options& f = fresh->options;
  if (!f.reload) f.reload = current.reload;  // the next SIGHUP asks the same hook
  if (f.processes != current.processes || f.pin != current.pin ||
      f.max_draining_generations != current.max_draining_generations)
    log_.warn("reload_partial",
              "reason=\"processes, pin and max_draining_generations change only on restart\"");
  auto wanted = wanted_addresses(f);
  bool same = wanted.size() == set->addresses.size() && wanted.size() == configured_.size();
  for (size_t i = 0; same && i < wanted.size(); ++i) {
    const auto& now = set->addresses[i];
    same = wanted[i].to_string() == configured_[i].to_string() ||
           wanted[i].to_string() == now.to_string() ||
           (wanted[i].port() == 0 && wanted[i].ip() == now.ip());
  }
  if (!same) {
    auto fresh_set = fanout::make_listeners(wanted, static_cast<int>(set->slots.size()), set.get());
    if (!fresh_set) {
      if (fresh_set.error().code == fanout::kErrorClaimed)
        log_.error("reload_refused", "problem=\"{}\"", fresh_set.error().reason);
      else
        log_.error("reload_refused", "problem=\"listen {}: {}\"", wanted.front().to_string(),
                   fresh_set.error().reason);
      return false;
    }
    set = std::make_shared<fanout::ListenerSet>(std::move(fresh_set.value()));
    configured_ = wanted;
    fanout::report_claims(log_, set->claims);
    log_.info("listening", "address={}", set->addresses.front().to_string());
    log_listening(log_, *set);
  }
  f.processes = current.processes;
  if (set->addresses.size() > 1) fresh->tls_port = set->addresses[1].port();
  if (quic_ && fresh->tls_port != generation_->tls_port)
    log_.warn("reload_partial", "reason=\"the HTTP/3 port changes only on restart\"");
  if (f.watch != current.watch)
    log_.warn("reload_ignored",
              "key=watch reason=\"watching the code directories starts or "
              "stops only on restart\"");
  if (metrics_)
    for (const auto& kind : f.kinds) (void)metrics_->add_kind(kind.name);
  generation_ = std::move(fresh);
  // The worker kinds: the manager takes what can change under running workers and names, in the
  // log, each change it leaves for a restart.
  if (manager_) (void)manager_->reconfigure(f.kinds, f.max_workers, f.max_starting);
  main = child_main();
  return true;
}

std::shared_ptr<void> Supervision::start_services(core::EventLoop& loop,
                                                  fanout::Supervisor& supervisor) {
  struct Started {
    std::shared_ptr<SupervisorServices> services;
    std::unique_ptr<SystemdReport> systemd;
    // [tls] acme: its thread starts after the first fork; destroying it joins the thread.
    std::unique_ptr<acme::Renewer> acme;
  };
  auto started = std::make_shared<Started>();
  if (const Options& o = generation_->options; o.acme && o.acme_board) {
    started->acme = std::make_unique<acme::Renewer>(*o.acme, o.acme_board);
    started->acme->start();
  }
  started->services = std::make_shared<SupervisorServices>(
      loop, log_, supervisor, *generation_, state_dir_, reports_, manager_, metrics_.get());
  services_ = started->services.get();
  started->systemd = std::make_unique<SystemdReport>(
      systemd_.notifier, loop, [this, &supervisor] { return status(supervisor); });
  systemd_report_ = started->systemd.get();
  return started;
}

std::string Supervision::status(const fanout::Supervisor& supervisor) const {
  // One line for `systemctl status`: "generation 3: 2/2 processes running, 1 draining, 4 workers
  // live" (the draining and workers parts only when there are any).
  auto slots = supervisor.state();
  size_t running = 0;
  for (const auto& s : slots) running += s.status == "running";
  std::string line = (supervisor.terminating() ? "stopping, generation " : "generation ") +
                     std::to_string(supervisor.generation()) + ": " + std::to_string(running) +
                     "/" + std::to_string(slots.size()) + " processes running";
  if (size_t d = supervisor.draining().size()) line += ", " + std::to_string(d) + " draining";
  if (manager_) line += ", " + std::to_string(manager_->live_workers()) + " workers live";
  return line;
}

void Supervision::terminate(std::function<void()> done) {
  systemd_.notifier.stopping();
  if (systemd_report_) systemd_report_->update();
  if (!services_) return done();
  services_->close(std::move(done));
}

}  // namespace corral::app
