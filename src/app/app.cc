#include "app/app.h"

#include <cerrno>
#include <cstdlib>
#include <iostream>

#include "app/logs.h"
#include "app/problems.h"
#include "app/supervision.h"
#include "app/systemd.h"
#include "core/owned_path.h"
#include "fanout/listen_claim.h"
#include "http/runner.h"
#include "workers/rollouts.h"

namespace corral::app {

namespace {

// What the supervisor's services read and write in the state directory: with workers, their
// sockets/, locks/ and logs/ (and the kinds' log files in it) too.
core::Result<void> check_state_tree(const std::string& dir, const Options& options) {
  if (options.kinds.empty()) return {};
  for (const char* sub : {"/sockets", "/locks", "/logs"})
    if (auto r = core::ensure_owned_dir(dir + sub); !r) return r;
  for (const auto& kind : options.kinds)
    if (auto r = core::check_owned_if_present(dir + "/logs/" + kind.name + ".log"); !r) return r;
  return {};
}

// The single process watches its claim on the address while it serves (fanout/listen_claim.h):
// run_server owns this (destroyed before the loop).
class ClaimWatch {
 public:
  ClaimWatch(std::shared_ptr<fanout::ListenClaim> claim, core::EventLoop& loop)
      : claim_(std::move(claim)) {
    claim_->watch(loop);
  }
  ~ClaimWatch() { claim_->unwatch(); }
  ClaimWatch(const ClaimWatch&) = delete;
  ClaimWatch& operator=(const ClaimWatch&) = delete;

 private:
  std::shared_ptr<fanout::ListenClaim> claim_;
};

// What the single process runs on its loop: the watch of its claim, systemd's watchdog.
struct SingleServices {
  SingleServices(std::shared_ptr<fanout::ListenClaim> c, const core::Notifier& n,
                 core::EventLoop& loop)
      : watchdog(n, loop) {
    if (c) claim = std::make_unique<ClaimWatch>(std::move(c), loop);
  }
  std::unique_ptr<ClaimWatch> claim;
  core::Watchdog watchdog;
};

int serve_single(core::Logger& log, const Options& options, SystemdContext& systemd) {
  http::RunOptions run;
  std::shared_ptr<fanout::ListenClaim> claim;
  if (!systemd.passed.empty() && systemd.passed[0]) {
    // systemd's socket (app/systemd.h): no bind, no claim.
    auto bound = core::local_address(systemd.passed[0].get());
    log.info("listening", "address={} from=systemd", bound ? bound->to_string() : std::string("?"));
    run.adopt_fds.push_back(systemd.passed[0].release());
  } else {
    // Without SO_REUSEPORT the bind is exclusive already; the claim names who holds the address
    // (and makes a supervisor that comes second say so). A port 0 is the kernel's: no claim.
    if (options.listen.port() != 0) {
      auto c = fanout::claim_listen("tcp", options.listen);
      if (!c) return listen_problem(log, options.listen, c.error());
      c.value()->report(log);
      claim = std::move(c.value());
    }
    // Bound here rather than by run_server, so that an address another program holds is
    // listen_problem's to report (its own line and exit status), as under a supervisor.
    auto fd = core::listen_tcp(options.listen, {.backlog = 4096});
    if (!fd) return listen_problem(log, options.listen, fd.error());
    auto bound = core::local_address(fd->get());
    if (!bound) return listen_problem(log, options.listen, bound.error());
    log.info("listening", "address={}", bound->to_string());
    run.adopt_fds.push_back(fd->release());
  }
  core::Notifier& notifier = systemd.notifier;
  run.on_loop = [claim, &notifier](core::EventLoop& loop) {
    return std::make_shared<SingleServices>(claim, notifier, loop);
  };
  run.on_listening = [&notifier](http::Server&, const std::vector<core::SocketAddress>&) {
    notifier.ready();
    notifier.status("1 process serving");
  };
  run.on_close = [&notifier] {
    notifier.stopping();
    notifier.status("stopping");
  };
  run.server = options.server;
  run.policy = options.policy;
  // SIGHUP: only the admission policy changes in a single process.
  run.on_reload = [&options, &notifier]() -> std::shared_ptr<const http::AdmissionPolicy> {
    notifier.reloading();
    Options fresh;
    bool ok = options.reload && options.reload(fresh);
    notifier.ready();  // applied by the caller at once, or refused: serving either way
    return ok ? fresh.policy : nullptr;
  };
  return http::run_server(log, run, options.site);
}

}  // namespace

int print_problem(const std::string& where, const std::string& problem) {
  std::cerr << "corral: " << where << ": " << problem << "\n";
  return kExitBadConfig;
}

int state_problem(const core::Error& e) {
  std::cerr << "corral: state-dir: " << e.reason << "\n";
  return e.code == core::kErrorUnsafePath ? kExitUnsafeState : kExitBadConfig;
}

int listen_problem(core::Logger& log, const core::SocketAddress& address, const core::Error& e) {
  if (e.code == fanout::kErrorClaimed) {
    std::cerr << "corral: " << e.reason
              << ": refusing to share it (stop that corral first, or listen elsewhere)\n";
    return kExitAddressHeld;
  }
  if (e.code == EADDRINUSE) {
    std::cerr << "corral: " << e.reason
              << ": another program listens there (`ss -ltnup` names it): stop it, or listen "
                 "elsewhere (--listen, --tls-listen; listen, tls.listen in the config)\n";
    return kExitAddressHeld;
  }
  log.error("listen_failed", "address={} error=\"{}\"", address.to_string(), e.reason);
  return 1;
}

core::Result<std::string> state_directory(const std::string& configured) {
  std::string dir = configured;
  if (dir.empty()) {
    const char* xdg = getenv("XDG_STATE_HOME");
    dir = xdg && *xdg ? std::string(xdg) + "/corral" : ".corral";
  }
  if (auto r = core::ensure_owned_dir(dir); !r)
    return core::Error{r.error().code, "state directory " + r.error().reason};
  return dir;
}

// `log` is where the proxy routes say `authorize_failed` (a kind's authorize hook threw).
core::Result<void> build_site(Options& options, core::Logger& log,
                              const std::function<void(http::SiteBuilder&)>& routes) {
  http::SiteBuilder builder;
  auto slot = std::make_shared<workers::ResolverSlot>();
  if (!options.kinds.empty()) workers::add_proxy_routes(builder, options.kinds, slot, log);
  if (options.acme_board) {
    // A literal path: it wins over the application's "{param}" and "*" routes (http/router.h).
    builder.route("GET /.well-known/acme-challenge/{token}",
                  [board = options.acme_board](http::Request& req) {
                    auto answer = board->http01(req.param("token"));
                    if (!answer) return http::Response::text("not found\n", 404);
                    auto r = http::Response::text(std::move(*answer));
                    r.set_content_type_static("application/octet-stream");
                    return r;
                  });
  }
  if (routes) routes(builder);
  auto site = builder.build();
  if (!site) return core::Error{site.error().code, site.error().reason};
  options.site = std::move(site.value());
  options.resolver_slot = std::move(slot);
  return {};
}

bool supervised(const Options& options) {
  return options.processes != 1 || !options.kinds.empty() || options.tls || options.admin_listen;
}

int serve(core::Logger& log, Options options) {
  log.set_level(options.log_level);
  log.watch_event_file();  // SIGUSR1 opens it again when stderr is a file
  if (auto problem = apply_log_options(log, options); !problem.empty())
    return print_problem("access_log", problem);
  // systemd's NOTIFY_SOCKET and passed sockets, taken (and unset) before anything forks.
  std::vector<core::SocketAddress> addresses{options.listen};
  if (options.tls_listen) addresses.push_back(*options.tls_listen);
  auto systemd = take_systemd(addresses);
  if (!systemd) return print_problem("socket activation", systemd.error().reason);
  if (!supervised(options)) return serve_single(log, options, systemd.value());
  // The state directory before any socket: the control socket lives there, and the workers'.
  auto dir = state_directory(options.state_dir);
  if (!dir) return state_problem(dir.error());
  if (auto r = check_state_tree(dir.value(), options); !r)
    return state_problem({r.error().code, "state directory " + r.error().reason});
  // The kinds' code, snapshotted into the store before anything forks (the manager starts every
  // worker on its kind's set): a directory that cannot be read stops serve() here.
  {
    workers::ManagerOptions mo;
    mo.kinds = std::move(options.kinds);
    auto r = workers::Rollouts::prepare(dir.value(), mo);
    options.kinds = std::move(mo.kinds);
    if (!r) {  // the reason names the key: "workers.<kind>.code: <path>: <why>"
      std::cerr << "corral: " << r.error().reason << "\n";
      return kExitBadConfig;
    }
  }
  Supervision supervision(log, std::move(options), dir.value(), std::move(systemd.value()));
  return supervision.run();
}

}  // namespace corral::app
