// corral: the program. Wires the components together (STYLE rule 9: cli only wires).
#include <sys/stat.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "cli/config.h"
#include "cli/demo.h"
#include "cli/sites.h"
#include "cli/worker_kinds.h"
#include "control/control_site.h"
#include "control/worker_routes.h"
#include "core/owned_path.h"
#include "fanout/cpus.h"
#include "fanout/listen_claim.h"
#include "fanout/supervisor.h"
#include "http/percent.h"
#include "http/runner.h"
#include "quic/server.h"
#include "quic/steering_setup.h"
#include "tls/session.h"
#include "workers/link_server.h"
#include "workers/process_services.h"
#include "workers/proxy_routes.h"

#include <fmt/format.h>
#include <gnutls/crypto.h>

namespace {

using namespace corral;

constexpr const char* kVersion = "0.1.0";
// Exit statuses besides cli::kExitBadConfig (78), from sysexits.h like it.
constexpr int kExitUnsafeState = 77;  // EX_NOPERM: the state directory (or a file corral reads
                                      // from it) is not the running user's alone
constexpr int kExitAddressHeld = 75;  // EX_TEMPFAIL: another corral listens on the address

// What the command line said; applied over the file on every (re)load.
struct Flags {
  std::string config_path, listen, root, log_level, state_dir;
  std::string tls_listen, cert, key;
  std::string steering, retry;  // [http3] overrides
  bool no_http3 = false;
  bool no_access_log = false;
  int processes = -1;  // -1: not given
  bool pin = false;
  bool serve_dotfiles = false;
  int64_t drain_timeout_ms = -1;  // -1: not given
  int max_draining = -1;          // -1: not given
};

// Everything a server process needs, built and validated before any process starts.
struct Prepared {
  cli::Config config;
  core::SocketAddress address;
  std::shared_ptr<const http::AdmissionPolicy> policy;
  std::shared_ptr<const http::Site> site;
  // [tls]: set when a TLS listener is configured; credentials loaded before any fork.
  std::optional<core::SocketAddress> tls_address;
  std::shared_ptr<const tls::ServerConfig> tls;
  std::shared_ptr<tls::Credentials> credentials;  // the same ones, for HTTP/3
  int tls_port = 0;                               // as bound (HTTP/3 uses it over UDP)
  quic::Http3Options http3;
  // Each server process sets its resolver here once its loop exists (the site is built before
  // the fork and holds the slot).
  std::shared_ptr<workers::ResolverSlot> resolver_slot = std::make_shared<workers::ResolverSlot>();
  bool unsafe_state = false;  // a problem is an unsafe state directory (kExitUnsafeState)
};

bool parse_level(const std::string& s, core::LogLevel& out) {
  if (s == "debug")
    out = core::LogLevel::kDebug;
  else if (s == "info")
    out = core::LogLevel::kInfo;
  else if (s == "warn")
    out = core::LogLevel::kWarn;
  else if (s == "error")
    out = core::LogLevel::kError;
  else
    return false;
  return true;
}

// --state-dir, else $XDG_STATE_HOME/corral, else ./.corral; created 0700. It must be the running
// user's and not writable by group or others (core/owned_path.h): Error::code is then
// core::kErrorUnsafePath.
core::Result<std::string> state_directory(const std::string& flag) {
  std::string dir = flag;
  if (dir.empty()) {
    const char* xdg = getenv("XDG_STATE_HOME");
    dir = xdg && *xdg ? std::string(xdg) + "/corral" : ".corral";
  }
  if (auto r = core::ensure_owned_dir(dir); !r)
    return core::Error{r.error().code, "state directory " + r.error().reason};
  return dir;
}

// A state directory problem on stderr; its exit status.
int state_problem(const core::Error& e) {
  std::cerr << "corral: state-dir: " << e.reason << "\n";
  return e.code == core::kErrorUnsafePath ? kExitUnsafeState : cli::kExitBadConfig;
}

// What the supervisor's services read and write in the state directory: with workers, their
// sockets/, locks/ and logs/ (and the kinds' log files in it) too.
core::Result<void> check_state_tree(const std::string& dir, const cli::Config& config) {
  if (config.workers.empty()) return {};
  for (const char* sub : {"/sockets", "/locks", "/logs"})
    if (auto r = core::ensure_owned_dir(dir + sub); !r) return r;
  for (const auto& kind : config.workers)
    if (auto r = core::check_owned_if_present(dir + "/logs/" + kind.name + ".log"); !r) return r;
  return {};
}

// A listen address another corral holds (fanout/listen_claim.h): the message and its status.
int listen_problem(core::Logger& log, const core::SocketAddress& address, const core::Error& e) {
  if (e.code == fanout::kErrorClaimed) {
    std::cerr << "corral: " << e.reason
              << ": refusing to share it (stop that corral first, or listen elsewhere)\n";
    return kExitAddressHeld;
  }
  log.error("listen_failed", "address={} error=\"{}\"", address.to_string(), e.reason);
  return 1;
}

// [tls]: the address, then the credentials (configured files, or the dev certificate in
// <state_dir>/tls), loaded now so a bad certificate is a startup (or reload) error.
void prepare_tls(const Flags& flags, const cli::Config& config,
                 const std::shared_ptr<tls::TicketKey>& ticket_key, core::Logger& log,
                 cli::ConfigErrors& errors, Prepared& out) {
  auto addr = core::parse_address(config.tls.listen);
  if (!addr) {
    errors.problems.push_back("tls.listen: " + addr.error().reason);
    return;
  }
  std::string cert = config.tls.cert, key = config.tls.key;
  bool dev = cert.empty() && key.empty();
  if (cert.empty() != key.empty()) {
    errors.problems.push_back("tls.cert, tls.key: set both (or neither: the dev certificate)");
    return;
  }
  if (dev) {
    auto dir = state_directory(flags.state_dir.empty() ? config.state_dir : flags.state_dir);
    if (!dir) {
      errors.problems.push_back("state-dir: " + dir.error().reason);
      out.unsafe_state = dir.error().code == core::kErrorUnsafePath;
      return;
    }
    auto paths = tls::ensure_dev_cert(dir.value() + "/tls");
    if (!paths) {
      errors.problems.push_back("tls: dev certificate: " + paths.error().reason);
      out.unsafe_state = paths.error().code == core::kErrorUnsafePath;
      return;
    }
    cert = paths->cert;
    key = paths->key;
  }
  auto creds = tls::Credentials::load(cert, key);
  if (!creds) {
    errors.problems.push_back("tls." + creds.error().reason);  // "tls.cert: <file>: ..."
    return;
  }
  auto config_tls = tls::ServerConfig::create(creds.value(), ticket_key);
  if (!config_tls) {
    errors.problems.push_back(config_tls.error().reason);
    return;
  }
  log.info("tls_credentials", "cert={} key={} dev={} spki_sha256={}", cert, key, dev,
           creds.value()->spki_sha256());
  out.tls_address = addr.value();
  out.tls = std::move(config_tls.value());
  out.credentials = creds.value();
}

cli::ConfigErrors prepare(const Flags& flags, core::Logger& log, Prepared& out,
                          const std::shared_ptr<tls::TicketKey>& ticket_key) {
  cli::Config config;
  if (!flags.config_path.empty()) {
    auto errors = cli::load_config(flags.config_path, config);
    if (!errors.empty()) return errors;
  }
  cli::ConfigErrors errors;
  if (!flags.listen.empty()) config.listen = flags.listen;
  if (!flags.root.empty()) config.root = flags.root;
  if (!flags.tls_listen.empty()) config.tls.listen = flags.tls_listen;
  if (!flags.cert.empty()) config.tls.cert = flags.cert;
  if (!flags.key.empty()) config.tls.key = flags.key;
  if (flags.no_access_log) config.server.access_log = false;
  if (!flags.steering.empty()) config.http3.steering = flags.steering;
  if (!flags.retry.empty()) config.http3.retry = flags.retry;
  if (flags.no_http3) config.http3.enabled = false;
  cli::check_http3(config.http3, errors);
  if (flags.processes >= 0) config.processes = flags.processes;
  if (flags.pin) config.pin = true;
  if (flags.serve_dotfiles) config.serve_dotfiles = true;
  if (flags.drain_timeout_ms >= 0) {
    if (flags.drain_timeout_ms > 86'400'000)
      errors.problems.push_back("--drain-timeout-ms: at most 86400000 (a day)");
    else
      config.server.drain_timeout_ms = static_cast<uint32_t>(flags.drain_timeout_ms);
  }
  if (flags.max_draining >= 0) {
    if (flags.max_draining > 3)
      errors.problems.push_back("--max-draining-generations: at most 3");
    else
      config.max_draining_generations = flags.max_draining;
  }
  if (!flags.log_level.empty() && !parse_level(flags.log_level, config.log_level))
    errors.problems.push_back("--log-level: expected one of debug, info, warn, error");
  auto addr = core::parse_address(config.listen);
  if (!addr) errors.problems.push_back("listen: " + addr.error().reason);
  if (!config.root.empty()) {
    struct stat st;
    if (stat(config.root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      errors.problems.push_back("root: '" + config.root + "' is not a directory");
  }
  // `corral serve` with no config and no DIR: the notes demo, when its program is next to corral.
  cli::DemoResult demo;
  if (flags.config_path.empty()) demo = cli::add_demo_kind(config);
  if (!demo.unavailable.empty())
    log.warn("demo_unavailable", "reason=\"the notes demo cannot start: {}\"", demo.unavailable);
  auto policy = cli::build_policy(config, errors);
  http::SiteBuilder builder;
  auto resolver_slot = std::make_shared<workers::ResolverSlot>();
  if (!config.workers.empty())
    workers::add_proxy_routes(builder, cli::kind_configs(config.workers), resolver_slot, log);
  if (config.root.empty()) {
    cli::add_welcome_routes(builder, cli::demo_welcome_item(demo));
    cli::add_welcome_sockets(builder);
  } else {
    cli::add_static_routes(builder, config.root, config.serve_dotfiles);
  }
  if (config.process_header) cli::add_process_header(builder);
  builder.on_error([&log](const http::ErrorEvent& e) {
    log.error("route_error", "pattern=\"{}\" target=\"{}\" error=\"{}\"", e.pattern,
              e.request.target, e.message);
  });
  auto site = builder.build();
  if (!site) errors.problems.push_back("routes: " + site.error().reason);
  if (errors.empty() && !config.tls.listen.empty())
    prepare_tls(flags, config, ticket_key, log, errors, out);
  if (!errors.empty()) return errors;
  out.http3.idle_timeout_ms = config.http3.idle_ms;
  out.http3.retry = config.http3.retry == "on"    ? quic::RetryMode::kOn
                    : config.http3.retry == "off" ? quic::RetryMode::kOff
                                                  : quic::RetryMode::kAuto;
  out.http3.max_connections = config.server.max_connections;
  out.config = std::move(config);
  out.address = addr.value();
  out.policy = std::move(policy);
  out.site = std::move(site.value());
  out.resolver_slot = std::move(resolver_slot);
  return errors;
}

int print_problems(const cli::ConfigErrors& errors, const std::string& where) {
  for (const auto& p : errors.problems) std::cerr << "corral: " << where << ": " << p << "\n";
  return cli::kExitBadConfig;
}

// SIGHUP in single-process mode: the admission policy is re-read.
std::shared_ptr<const http::AdmissionPolicy> reload_policy(const Flags& flags, core::Logger& log) {
  if (flags.config_path.empty()) return nullptr;
  Prepared fresh;
  auto errors = prepare(flags, log, fresh, nullptr);
  if (!errors.empty()) {
    for (const auto& p : errors.problems)
      log.error("reload_refused", "file={} problem=\"{}\"", flags.config_path, p);
    return nullptr;
  }
  return fresh.policy;
}

// HTTP/3 in the supervisor: made once per start, before the first fork, and kept across SIGHUP
// generations (the UDP sockets live in SupervisorOptions::quic for the same reason): tokens and
// stateless resets from one generation stay valid in the next.
// The generation index bits of QUIC CIDs and the supervisor's forwarding pairs per slot agree.
static_assert(fanout::kGenerations == quic::kGenerations);

struct QuicShared {
  std::shared_ptr<quic::Steering> steering;
  std::shared_ptr<const quic::Secrets> secrets;
  std::shared_ptr<tls::TicketKey> ticket_key;
};

// {"type":"report","quic":{...}}: what GET /processes shows of a process's HTTP/3.
std::string quic_report(const quic::Http3Server& h3) {
  return nlohmann::json{{"type", "report"}, {"quic", h3.stats_json()}}.dump();
}

fanout::ChildMain child_main(std::shared_ptr<const Prepared> p, core::Logger& log, Flags flags,
                             std::shared_ptr<const QuicShared> quic_shared = nullptr) {
  return [p, &log, flags, quic_shared](const fanout::ChildContext& ctx) {
    cli::set_process_slot(ctx.slot);
    http::RunOptions run;
    // The slot's sockets in make_listeners' order: the plain listener, then the TLS one.
    run.adopt_fds = {ctx.listen_fds.front()};
    if (p->tls && ctx.listen_fds.size() > 1) {
      run.adopt_tls_fds = {ctx.listen_fds[1]};
      run.tls = p->tls;
    }
    run.server = p->config.server;
    run.policy = p->policy;
    run.drain_signal = fanout::kDrainSignal;  // a newer generation serves the slot
    run.on_listening = [&ctx](http::Server&, const std::vector<core::SocketAddress>&) {
      ctx.notify_ready();
    };
    int link_fd = ctx.link_fd;
    run.on_loop = [p, link_fd](core::EventLoop& loop) -> std::shared_ptr<void> {
      if (link_fd < 0) return nullptr;
      return std::make_shared<workers::ProcessServices>(
          loop, core::UniqueFd(link_fd), p->resolver_slot, !p->config.workers.empty());
    };
    if (quic_shared && p->credentials && !ctx.udp_fds.empty()) {
      run.server.alt_svc = fmt::format("h3=\":{}\"; ma=86400", p->tls_port);
      run.on_server = [p, quic_shared, &ctx, &log](http::Server& server) {
        auto pc = quic_shared->steering->context(ctx.slot, ctx.generation, ctx.udp_fds,
                                                 ctx.forward_rx, ctx.forward_tx, ctx.quic_serving);
        pc.secrets = quic_shared->secrets;
        pc.credentials = p->credentials;
        pc.ticket_key = quic_shared->ticket_key;
        auto h3 = std::make_shared<quic::Http3Server>(server, std::move(pc), p->http3);
        if (auto r = h3->start(); !r) {
          log.error("http3_failed", "slot={} error=\"{}\"", ctx.slot, r.error().reason);
          return http::RunOptions::Companion{};
        }
        // Every second the process reports its HTTP/3 state to the supervisor (GET /processes).
        struct Running {
          std::shared_ptr<quic::Http3Server> h3;
          core::Timer report;
        };
        auto running = std::make_shared<Running>();
        running->h3 = h3;
        auto resolver_slot = p->resolver_slot;
        running->report.bind(server.loop().timers(), [r = running.get(), resolver_slot] {
          if (resolver_slot->resolver) resolver_slot->resolver->report(quic_report(*r->h3));
          r->report.arm_after(1000);
        });
        running->report.arm_after(100);
        return http::RunOptions::Companion{
            running, [h3](std::function<void()> done) { h3->close(std::move(done)); }};
      };
    }
    log.set_level(p->config.log_level);
    // Fault injection for the fan-out's tests: a slot that crashes at startup (a crash loop);
    // every server process exiting with a status at startup (a configuration it cannot run: 78).
    if (const char* crash = getenv("CORRAL_TEST_CRASH_AT_START");
        crash && std::to_string(ctx.slot) == crash)
      abort();
    if (const char* code = getenv("CORRAL_TEST_EXIT_AT_START"); code && *code) return atoi(code);
    return http::run_server(log, run, p->site);
  };
}

int serve(const Flags& flags) {
  core::Logger log(2);
  // One session-ticket key per supervisor start, kept across SIGHUP generations: every process of
  // every generation resumes every other's tickets.
  auto ticket_key = tls::TicketKey::generate();
  if (!ticket_key) return print_problems({{ticket_key.error().reason}}, "tls");
  auto prepared = std::make_shared<Prepared>();
  if (auto errors = prepare(flags, log, *prepared, ticket_key.value()); !errors.empty()) {
    int status =
        print_problems(errors, flags.config_path.empty() ? "command line" : flags.config_path);
    return prepared->unsafe_state ? kExitUnsafeState : status;
  }
  log.set_level(prepared->config.log_level);

  // Workers are children of the supervisor (they outlive a server process's crash): with workers
  // configured, even one server process runs under a supervisor. So does TLS: a SIGHUP reloads
  // the certificate by starting a new generation.
  if (prepared->config.processes == 1 && prepared->config.workers.empty() && !prepared->tls) {
    http::RunOptions run;
    // Without SO_REUSEPORT the bind is exclusive already; the claim names who holds the address
    // (and makes a supervisor that comes second say so). A port 0 is the kernel's: no claim.
    std::shared_ptr<fanout::ListenClaim> claim;
    if (prepared->address.port() != 0) {
      auto c = fanout::claim_listen("tcp", prepared->address);
      if (!c) return listen_problem(log, prepared->address, c.error());
      claim = std::move(c.value());
      run.on_loop = [claim](core::EventLoop& loop) -> std::shared_ptr<void> {
        claim->watch(loop);
        return std::shared_ptr<void>(nullptr, [claim](void*) { claim->unwatch(); });
      };
    }
    run.listen.push_back(prepared->address);
    run.server = prepared->config.server;
    run.policy = prepared->policy;
    run.on_reload = [&] { return reload_policy(flags, log); };
    return http::run_server(log, run, prepared->site);
  }

  // The state directory before any socket: the control socket lives there, and the workers'.
  auto dir =
      state_directory(flags.state_dir.empty() ? prepared->config.state_dir : flags.state_dir);
  if (!dir) return state_problem(dir.error());
  if (auto r = check_state_tree(dir.value(), prepared->config); !r)
    return state_problem({r.error().code, "state directory " + r.error().reason});

  auto cpus = fanout::allowed_cpus();
  if (!cpus) return print_problems({{cpus.error().reason}}, "processes");
  auto n =
      fanout::resolve_process_count(prepared->config.processes, cpus.value(), prepared->config.pin);
  if (!n) return print_problems({{n.error().reason}}, "processes");
  auto wanted_addresses = [](const Prepared& p) {
    std::vector<core::SocketAddress> a{p.address};
    if (p.tls_address) a.push_back(*p.tls_address);
    return a;
  };
  auto listeners = fanout::make_listeners(wanted_addresses(*prepared), n.value());
  if (!listeners) return listen_problem(log, prepared->address, listeners.error());
  auto set = std::make_shared<fanout::ListenerSet>(std::move(listeners.value()));
  log.info("listening", "address={} processes={} pin={}", set->addresses.front().to_string(),
           n.value(), prepared->config.pin);
  if (set->addresses.size() > 1)
    log.info("tls_listening", "address={}", set->addresses[1].to_string());

  fanout::SupervisorOptions options;
  options.processes = n.value();
  options.pin = prepared->config.pin;
  options.cpus = cpus.value();
  options.stop_timeout_ms = prepared->config.server.close_timeout_ms + 5'000;
  options.max_draining = static_cast<uint32_t>(prepared->config.max_draining_generations);
  if (set->addresses.size() > 1) prepared->tls_port = set->addresses[1].port();

  // HTTP/3: per slot a UDP socket on the TLS listener's port, the forwarding pairs, the steering
  // program; one secret for tokens and stateless resets. All made before the first fork.
  std::shared_ptr<QuicShared> quic_shared;
  if (prepared->tls && prepared->config.http3.enabled) {
    auto request = quic::parse_steering_request(prepared->config.http3.steering);
    if (!request) return print_problems({{request.error().reason}}, "http3.steering");
    auto sockets = fanout::make_quic_sockets({set->addresses[1]}, n.value());
    if (!sockets) return listen_problem(log, set->addresses[1], sockets.error());
    auto quic_sockets = std::make_shared<fanout::QuicSockets>(std::move(sockets.value()));
    std::vector<std::vector<int>> groups;
    for (size_t a = 0; a < quic_sockets->addresses.size(); ++a)
      groups.push_back(quic_sockets->group(a));
    auto steering =
        quic::setup_steering(groups, static_cast<uint32_t>(n.value()), request.value(), log);
    if (!steering) return print_problems({{steering.error().reason}}, "http3.steering");
    quic_sockets->steering = steering.value();
    options.quic = quic_sockets;
    auto secrets = std::make_shared<quic::Secrets>();
    if (gnutls_rnd(GNUTLS_RND_KEY, secrets->static_secret, sizeof secrets->static_secret) != 0)
      return print_problems({{"no random bytes for the QUIC secret"}}, "http3");
    quic_shared = std::make_shared<QuicShared>();
    quic_shared->steering = steering.value();
    quic_shared->secrets = std::move(secrets);
    quic_shared->ticket_key = ticket_key.value();
    log.info("http3_listening", "address={} processes={} steering={} retry={}",
             quic_sockets->addresses.front().to_string(), n.value(),
             quic::steering_name(steering.value()->mode), prepared->config.http3.retry);
  }

  fanout::FanoutHooks hooks;
  hooks.on_reload = [&](std::shared_ptr<fanout::ListenerSet>& set, fanout::ChildMain& main) {
    auto fresh = std::make_shared<Prepared>();
    auto errors = prepare(flags, log, *fresh, ticket_key.value());
    if (!errors.empty()) {
      for (const auto& p : errors.problems)
        log.error("reload_refused", "file={} problem=\"{}\"", flags.config_path, p);
      return false;
    }
    if (fresh->config.processes != prepared->config.processes ||
        fresh->config.pin != prepared->config.pin ||
        fresh->config.max_draining_generations != prepared->config.max_draining_generations)
      log.warn("reload_partial",
               "reason=\"processes, pin and max_draining_generations change only on restart\"");
    auto wanted = wanted_addresses(*fresh);
    bool same = wanted.size() == set->addresses.size();
    for (size_t i = 0; same && i < wanted.size(); ++i) {
      const auto& current = set->addresses[i];
      same = wanted[i].to_string() == current.to_string() ||
             (wanted[i].port() == 0 && wanted[i].ip() == current.ip());
    }
    if (!same) {
      auto fresh_set =
          fanout::make_listeners(wanted, static_cast<int>(set->slots.size()), set.get());
      if (!fresh_set) {
        if (fresh_set.error().code == fanout::kErrorClaimed)
          log.error("reload_refused", "problem=\"{}\"", fresh_set.error().reason);
        else
          log.error("reload_refused", "problem=\"listen {}: {}\"", wanted.front().to_string(),
                    fresh_set.error().reason);
        return false;
      }
      set = std::make_shared<fanout::ListenerSet>(std::move(fresh_set.value()));
      log.info("listening", "address={}", set->addresses.front().to_string());
      if (set->addresses.size() > 1)
        log.info("tls_listening", "address={}", set->addresses[1].to_string());
    }
    fresh->config.processes = prepared->config.processes;
    if (set->addresses.size() > 1) fresh->tls_port = set->addresses[1].port();
    if (quic_shared && fresh->tls_port != prepared->tls_port)
      log.warn("reload_partial", "reason=\"the HTTP/3 port changes only on restart\"");
    prepared = fresh;
    main = child_main(prepared, log, flags, quic_shared);
    return true;
  };
  std::string control_path = dir.value() + "/control.sock";
  // The supervisor's services: the worker manager and the control API. The control server is
  // declared after the manager so that it is destroyed first (its routes use the manager).
  struct Services {
    std::unique_ptr<workers::Manager> manager;
    std::shared_ptr<http::Server> control;
  };
  workers::Manager* manager = nullptr;  // owned by the Services run_fanout holds (and destroys
                                        // before its loop)
  auto reports = std::make_shared<workers::ProcessReports>();
  hooks.on_link = [&manager, reports](int slot, core::MessageLink& link) {
    workers::serve_link(link, &manager, slot, reports);
  };
  hooks.on_started = [&](core::EventLoop& loop, fanout::Supervisor& sup) -> std::shared_ptr<void> {
    auto services = std::make_shared<Services>();
    if (!prepared->config.workers.empty()) {
      workers::ManagerOptions mo;
      mo.state_dir = dir.value();
      mo.kinds = cli::kind_configs(prepared->config.workers);
      mo.max_workers = prepared->config.worker_bounds.max_workers;
      mo.max_starting = prepared->config.worker_bounds.max_starting;
      auto m = workers::Manager::create(loop, log, std::move(mo), nullptr);
      if (!m) {
        log.error("workers_failed", "error=\"{}\"", m.error().reason);
      } else {
        services->manager = std::move(m.value());
        manager = services->manager.get();
      }
    }
    auto fd = core::listen_unix(control_path);
    if (!fd) {
      log.error("control_failed", "path={} error=\"{}\"", control_path, fd.error().reason);
      return services;
    }
    http::ServerOptions opts;
    opts.access_log = false;
    services->control = std::make_shared<http::Server>(loop, log, opts);
    http::SiteBuilder site;
    control::add_process_routes(site, sup, [reports](int slot) {
      auto it = reports->by_slot.find(slot);
      return it == reports->by_slot.end() ? nlohmann::json() : it->second;
    });
    if (manager) control::add_worker_routes(site, *manager);
    (void)services->control->adopt_listener(std::move(fd.value()));
    services->control->publish(site.build().value());
    log.info("control_listening", "path={}", control_path);
    return services;
  };
  hooks.on_terminate = [&](std::function<void()> done) {
    if (!manager) return done();
    manager->close([&manager, done] {
      manager = nullptr;
      done();
    });
  };
  // The set is the supervisor's from here: a reload that replaces it lets it go (and its sockets
  // and claims with its last process).
  fanout::ForkLauncher launcher(log);
  int r = fanout::run_fanout(log, launcher, options, std::move(set),
                             child_main(prepared, log, flags, quic_shared), hooks);
  unlink(control_path.c_str());
  return r < 0 ? 1 : r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"corral: an application server (HTTP/1.1, one process per CPU, workers per address)",
               "corral"};
  app.set_version_flag("--version", std::string("corral ") + kVersion);
  app.require_subcommand(1);

  Flags flags;
  auto* serve_cmd = app.add_subcommand("serve", "Serve DIR (default: the embedded welcome site)");
  serve_cmd->add_option("DIR", flags.root, "Directory to serve");
  serve_cmd->add_option("--listen", flags.listen, "Address to listen on (default 127.0.0.1:8080)");
  serve_cmd->add_option("--config", flags.config_path, "TOML configuration file");
  serve_cmd->add_option(
      "--processes", flags.processes,
      "Server processes: 1 (default) runs one, without a supervisor unless workers "
      "are configured (the default demo is a worker kind), 0 one per "
      "CPU, N (at most 64) N under a supervisor");
  serve_cmd->add_flag("--pin", flags.pin, "Pin process i to the i-th CPU this process may use");
  serve_cmd->add_flag("--serve-dotfiles", flags.serve_dotfiles,
                      "Serve files and directories whose name starts with '.' (default: 404)");
  serve_cmd->add_option("--drain-timeout-ms", flags.drain_timeout_ms,
                        "After a reload, how long an old process keeps its WebSockets and relayed "
                        "upgrades (default 300000; 0: closed at once with 1001)");
  serve_cmd->add_option("--max-draining-generations", flags.max_draining,
                        "Older generations draining at once per process slot (0..3, default 3); "
                        "past it the oldest is closed");
  serve_cmd->add_option("--log-level", flags.log_level, "debug, info, warn or error");
  serve_cmd->add_option("--state-dir", flags.state_dir,
                        "State directory (default $XDG_STATE_HOME/corral or ./.corral)");
  serve_cmd->add_flag("--no-access-log", flags.no_access_log, "Do not log one line per request");
  serve_cmd->add_option("--tls-listen", flags.tls_listen,
                        "HTTPS address (e.g. 127.0.0.1:8443; default: none)");
  serve_cmd->add_option("--cert", flags.cert,
                        "TLS certificate chain, PEM (default: the dev certificate)");
  serve_cmd->add_option("--key", flags.key, "TLS private key, PEM");
  serve_cmd->add_option("--steering", flags.steering,
                        "HTTP/3 steering: auto (default), bpf, forward or off");
  serve_cmd->add_option("--retry", flags.retry, "HTTP/3 Retry: auto (default), on or off");
  serve_cmd->add_flag("--no-http3", flags.no_http3, "No HTTP/3 on the TLS listener's port");

  auto* cert_cmd = app.add_subcommand(
      "cert", "Make (or reuse) the dev certificate for localhost, 127.0.0.1 and ::1 and print it");
  std::string cert_dir;
  cert_cmd->add_option("--dir", cert_dir, "Where (default: <state dir>/tls)");
  cert_cmd->add_option("--state-dir", flags.state_dir, "The state directory");

  auto* check =
      app.add_subcommand("check", "Validate a configuration file and print every problem");
  check->add_option("--config", flags.config_path, "TOML configuration file")->required();

  auto* ctl = app.add_subcommand("ctl", "Ask a running supervisor (its control socket)");
  std::string ctl_what = "processes";
  std::string ctl_address;
  ctl->add_option("WHAT", ctl_what, "processes | workers | retry | stop | suspend | resume")
      ->check(CLI::IsMember({"processes", "workers", "retry", "stop", "suspend", "resume"}));
  ctl->add_option("ADDRESS", ctl_address, "The worker address (retry, stop, suspend, resume)");
  ctl->add_option("--state-dir", flags.state_dir, "The state directory of the running corral");

  CLI11_PARSE(app, argc, argv);

  if (ctl->parsed()) {
    auto dir = state_directory(flags.state_dir);
    if (!dir) return state_problem(dir.error());
    auto fd = core::connect_unix(dir.value() + "/control.sock");
    if (!fd) {
      std::cerr << "corral: " << fd.error().reason
                << " (is a supervisor running: --processes N, or workers?)\n";
      return 1;
    }
    std::string req;
    if (ctl_what == "processes" || ctl_what == "workers") {
      req = "GET /" + ctl_what + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    } else {
      if (ctl_address.empty()) {
        std::cerr << "corral: ctl " << ctl_what << " needs an ADDRESS (e.g. doc:42)\n";
        return 2;
      }
      std::string encoded = http::percent_encode_name(ctl_address);  // one path segment
      req = "POST /workers/" + encoded + "/" + ctl_what +
            " HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    }
    if (::write(fd->get(), req.data(), req.size()) != static_cast<ssize_t>(req.size())) return 1;
    std::string resp;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd->get(), buf, sizeof buf)) > 0;)
      resp.append(buf, static_cast<size_t>(n));
    auto body = resp.find("\r\n\r\n");
    std::cout << (body == std::string::npos ? resp : resp.substr(body + 4)) << "\n";
    return resp.rfind("HTTP/1.1 2", 0) == 0 ? 0 : 1;
  }

  if (cert_cmd->parsed()) {
    if (cert_dir.empty()) {
      auto dir = state_directory(flags.state_dir);
      if (!dir) return state_problem(dir.error());
      cert_dir = dir.value() + "/tls";
    }
    auto paths = tls::ensure_dev_cert(cert_dir);
    if (!paths) {
      int status = print_problems({{paths.error().reason}}, "cert");
      return paths.error().code == core::kErrorUnsafePath ? kExitUnsafeState : status;
    }
    auto creds = tls::Credentials::load(paths->cert, paths->key);
    if (!creds) return print_problems({{creds.error().reason}}, "cert");
    std::cout << "cert: " << paths->cert << "\nkey: " << paths->key
              << "\nspki_sha256: " << creds.value()->spki_sha256()
              << "\nnames: localhost 127.0.0.1 ::1\n"
              << "try: curl --cacert " << paths->cert << " https://localhost:8443/\n";
    return 0;
  }

  if (check->parsed()) {
    cli::Config config;
    auto errors = cli::load_config(flags.config_path, config);
    // A configured certificate and key are read as serve would read them (the dev certificate,
    // made by serve when there is none, is not).
    if (errors.empty() && !config.tls.cert.empty() && !config.tls.key.empty())
      if (auto creds = tls::Credentials::load(config.tls.cert, config.tls.key); !creds)
        errors.problems.push_back("tls." + creds.error().reason);
    if (!errors.empty()) return print_problems(errors, flags.config_path);
    std::cout << "corral: " << flags.config_path << ": ok\n";
    return 0;
  }
  return serve(flags);
}
