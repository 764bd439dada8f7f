// corral: the program. Wires the components together (STYLE rule 9: cli only wires).
#include <sys/stat.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <fmt/format.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>

#include "app/app.h"
#include "cli/config.h"
#include "cli/ctl.h"
#include "cli/demo.h"
#include "cli/flag_docs.h"
#include "cli/sites.h"
#include "cli/worker_kinds.h"
#include "core/owned_path.h"
#include "http/percent.h"
#include "tls/session.h"

namespace {

using namespace corral;

constexpr const char* kVersion = "0.1.0";
// Exit statuses besides cli::kExitBadConfig (78): app/app.h's.
using app::kExitUnsafeState;
static_assert(app::kExitBadConfig == cli::kExitBadConfig);

// What the command line said; applied over the file on every (re)load.
struct Flags {
  std::string config_path, listen, root, log_level, state_dir;
  std::string tls_listen, cert, key;
  std::string admin_listen;     // --admin-listen ("off": none)
  std::string steering, retry;  // [http3] overrides
  bool no_http3 = false;
  bool no_access_log = false;
  std::string log_format, access_log;  // --log-format text|json, --access-log PATH
  int processes = -1;                  // -1: not given
  bool pin = false;
  bool serve_dotfiles = false;
  bool watch = false;             // --watch: roll out each saved change of a kind's code
  int64_t drain_timeout_ms = -1;  // -1: not given
  int max_draining = -1;          // -1: not given
  std::vector<std::string> allowed_hosts, relays;  // added to the file's lists
};

// Everything the app needs, built and validated before any process starts.
struct Prepared {
  cli::Config config;
  app::Options options;
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

// The state directory (app/app.h): --state-dir or the file's, else the defaults.
using app::state_directory;

// A state directory problem on stderr; its exit status.
int state_problem(const core::Error& e) {
  std::cerr << "corral: state-dir: " << e.reason << "\n";
  return e.code == core::kErrorUnsafePath ? kExitUnsafeState : cli::kExitBadConfig;
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
  bool dev = cert.empty() && key.empty();  // also with [tls] acme, until it has a certificate
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
  auto& board = out.options.acme_board;
  if (board) {
    // [tls] acme: the certificate a previous run obtained, if it loads; else the dev one until
    // the renewer publishes one (or no handshake at all, with until_issued = "refuse").
    if (auto stored = tls::Credentials::load(board->cert_path(), board->key_path())) {
      cert = board->cert_path();
      key = board->key_path();
      dev = false;
    }
  }
  auto creds = tls::Credentials::load(cert, key);
  if (!creds) {
    errors.problems.push_back("tls." + creds.error().reason);  // "tls.cert: <file>: ..."
    return;
  }
  auto config_tls =
      tls::ServerConfig::create(creds.value(), ticket_key, tls::kDefaultPriority, board);
  if (!config_tls) {
    errors.problems.push_back(config_tls.error().reason);
    return;
  }
  log.info("tls_credentials", "cert={} key={} dev={} spki_sha256={}", cert, key, dev,
           creds.value()->spki_sha256());
  out.options.tls_listen = addr.value();
  out.options.tls = std::move(config_tls.value());
  out.options.credentials = creds.value();
  out.options.ticket_key = ticket_key;
}

// [tls] acme: <state_dir>/acme (0700, the running user's), the board (made once per supervisor
// start: `board` outlives SIGHUPs, whose generations share it) and the renewer's options.
void prepare_acme(const Flags& flags, const cli::Config& config,
                  std::shared_ptr<tls::AcmeBoard>& board, cli::ConfigErrors& errors,
                  Prepared& out) {
  const cli::AcmeConfig& a = *config.tls.acme;
  auto dir = state_directory(flags.state_dir.empty() ? config.state_dir : flags.state_dir);
  core::Result<void> owned =
      dir ? core::ensure_owned_dir(dir.value() + "/acme") : core::Result<void>(dir.error());
  if (!owned) {
    errors.problems.push_back("state-dir: " + owned.error().reason);
    out.unsafe_state = owned.error().code == core::kErrorUnsafePath;
    return;
  }
  if (!board) {
    auto made = tls::AcmeBoard::create(dir.value() + "/acme", a.until_issued == "refuse");
    if (!made) {
      errors.problems.push_back("tls.acme: " + made.error().reason);
      return;
    }
    board = std::move(made.value());
  }
  acme::RenewerOptions r;
  r.directory_url = a.directory;
  r.email = a.email;
  r.domains = a.domains;
  r.ca_file = a.ca_file;
  r.challenge_types = a.challenges;
  r.log_level = config.log_level;
  r.log_format = config.log_format;
  out.options.acme = std::move(r);
  out.options.acme_board = board;
}

cli::ConfigErrors prepare(const Flags& flags, core::Logger& log, Prepared& out,
                          const std::shared_ptr<tls::TicketKey>& ticket_key,
                          std::shared_ptr<tls::AcmeBoard>* acme_board = nullptr) {
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
  if (flags.watch) config.watch = true;
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
  if (flags.log_format == "json" || flags.log_format == "text")
    config.log_format =
        flags.log_format == "json" ? core::LogFormat::kJson : core::LogFormat::kText;
  else if (!flags.log_format.empty())
    errors.problems.push_back("--log-format: expected text or json");
  if (!flags.access_log.empty()) {
    config.access_log_path = flags.access_log;
    config.server.access_log = true;
  }
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
  config.allowed_hosts.insert(config.allowed_hosts.end(), flags.allowed_hosts.begin(),
                              flags.allowed_hosts.end());
  config.relays.insert(config.relays.end(), flags.relays.begin(), flags.relays.end());
  auto policy = cli::build_policy(config, errors);
  app::Options& o = out.options;
  // The admin listener (control/admin.h): on by default only in the embedded default (no file,
  // no DIR, no --listen), where the operator is trying corral on their own machine.
  if (flags.config_path.empty() && flags.root.empty() && flags.listen.empty())
    config.admin.listen = "127.0.0.1:8081";
  if (!flags.admin_listen.empty())
    config.admin.listen = flags.admin_listen == "off" ? "" : flags.admin_listen;
  if (!config.admin.listen.empty()) {
    if (auto a = core::parse_address(config.admin.listen); a)
      o.admin_listen = a.value();
    else
      errors.problems.push_back("admin.listen: " + a.error().reason);
    for (const auto& cidr : config.admin.allow)
      if (auto r = http::parse_relay(cidr); r) o.admin.allow.push_back(r.value());
    o.admin.token = config.admin.token;
  }
  o.kinds = cli::kind_configs(config.workers);
  if (errors.empty() && config.tls.acme && acme_board)
    prepare_acme(flags, config, *acme_board, errors, out);
  auto site = app::build_site(o, log, [&](http::SiteBuilder& builder) {
    if (config.root.empty()) {
      cli::add_welcome_routes(builder, cli::demo_welcome_item(demo), kVersion);
      cli::add_welcome_sockets(builder);
    } else {
      cli::add_static_routes(builder, config.root, config.serve_dotfiles);
    }
    if (config.process_header) cli::add_process_header(builder);
    builder.on_error([&log](const http::ErrorEvent& e) {
      log.error("route_error", "pattern=\"{}\" target=\"{}\" error=\"{}\"", e.pattern,
                e.request.target, e.message);
    });
  });
  if (!site) errors.problems.push_back("routes: " + site.error().reason);
  if (errors.empty() && !config.tls.listen.empty())
    prepare_tls(flags, config, ticket_key, log, errors, out);
  if (!errors.empty()) return errors;
  o.http3 = config.http3.enabled;
  o.steering = config.http3.steering;
  o.retry = config.http3.retry;
  o.http3_options.idle_timeout_ms = config.http3.idle_ms;
  o.http3_options.retry = config.http3.retry == "on"    ? quic::RetryMode::kOn
                          : config.http3.retry == "off" ? quic::RetryMode::kOff
                                                        : quic::RetryMode::kAuto;
  o.http3_options.max_connections = config.server.max_connections;
  o.listen = addr.value();
  o.server = config.server;
  o.policy = std::move(policy);
  o.log_level = config.log_level;
  o.log_format = config.log_format;
  o.access_log_path = config.access_log_path;
  o.access_log_format = config.access_log_format;
  o.processes = config.processes;
  o.pin = config.pin;
  o.max_draining_generations = config.max_draining_generations;
  o.state_dir = flags.state_dir.empty() ? config.state_dir : flags.state_dir;
  o.max_workers = config.worker_bounds.max_workers;
  o.max_starting = config.worker_bounds.max_starting;
  o.watch = config.watch;
  o.on_process = cli::set_process_slot;
  out.config = std::move(config);
  return errors;
}

int print_problems(const cli::ConfigErrors& errors, const std::string& where) {
  for (const auto& p : errors.problems) std::cerr << "corral: " << where << ": " << p << "\n";
  return cli::kExitBadConfig;
}

// `corral serve`: the flags and the file as app::Options, run by the app (app/app.h). SIGHUP reads
// them again: under a supervisor a new generation, in a single process the admission policy (and
// only with a file).
int serve(const Flags& flags) {
  core::Logger log(2);
  // One session-ticket key per supervisor start, kept across SIGHUP generations: every process of
  // every generation resumes every other's tickets.
  auto ticket_key = tls::TicketKey::generate();
  if (!ticket_key) return print_problems({{ticket_key.error().reason}}, "tls");
  Prepared prepared;
  std::shared_ptr<tls::AcmeBoard> acme_board;  // [tls] acme: one per supervisor start
  if (auto errors = prepare(flags, log, prepared, ticket_key.value(), &acme_board);
      !errors.empty()) {
    int status =
        print_problems(errors, flags.config_path.empty() ? "command line" : flags.config_path);
    return prepared.unsafe_state ? kExitUnsafeState : status;
  }
  bool supervised = app::supervised(prepared.options);
  prepared.options.reload = [&flags, &log, supervised, &acme_board,
                             key = ticket_key.value()](app::Options& fresh) {
    if (!supervised && flags.config_path.empty()) return false;
    Prepared p;
    auto errors = prepare(flags, log, p, supervised ? key : nullptr, &acme_board);
    if (!errors.empty()) {
      for (const auto& problem : errors.problems)
        log.error("reload_refused", "file={} problem=\"{}\"", flags.config_path, problem);
      return false;
    }
    fresh = std::move(p.options);
    return true;
  };
  return app::serve(log, std::move(prepared.options));
}

// `corral serve`: its options, into `flags`.
void add_serve_options(CLI::App& app, Flags& flags) {
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
  serve_cmd->add_option("--admin-listen", flags.admin_listen,
                        "The admin listener: the control API, /healthz and /readyz over HTTP "
                        "(\"off\": none; default none, 127.0.0.1:8081 with no config, DIR "
                        "or --listen)");
  serve_cmd->add_flag("--watch", flags.watch,
                      "Roll out every saved change under a worker kind's code directory "
                      "(as [workers] watch = true)");
  serve_cmd->add_flag("--no-access-log", flags.no_access_log, "Do not log one line per request");
  serve_cmd->add_option("--log-format", flags.log_format,
                        "Event and access log lines: text (default) or json (one object a line)");
  serve_cmd->add_option("--access-log", flags.access_log,
                        "Write the access log to this file (default: with the event log, stderr)");
  serve_cmd->add_option("--tls-listen", flags.tls_listen,
                        "HTTPS address (e.g. 127.0.0.1:8443; default: none)");
  serve_cmd->add_option("--cert", flags.cert,
                        "TLS certificate chain, PEM (default: the dev certificate)");
  serve_cmd->add_option("--key", flags.key, "TLS private key, PEM");
  serve_cmd->add_option("--steering", flags.steering,
                        "HTTP/3 steering: auto (default), bpf, forward or off");
  serve_cmd->add_option("--retry", flags.retry, "HTTP/3 Retry: auto (default), on or off");
  serve_cmd->add_flag("--no-http3", flags.no_http3, "No HTTP/3 on the TLS listener's port");
  serve_cmd
      ->add_option("--allowed-host", flags.allowed_hosts,
                   "A Host to serve besides the loopback names (repeatable; added to "
                   "allowed_hosts)")
      ->allow_extra_args(false);
  serve_cmd
      ->add_option("--relay", flags.relays,
                   "A reverse proxy (address or CIDR) whose forwarding headers are believed "
                   "(repeatable; added to relays)")
      ->allow_extra_args(false);
}

// `corral cert`: makes (or reuses) the dev certificate in `cert_dir` (default: the state
// directory's tls/) and prints where it is.
int run_cert(const Flags& flags, std::string cert_dir) {
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

// `corral check`: loads flags.config_path and prints every problem, or ok.
int run_check(const Flags& flags) {
  cli::Config config;
  auto errors = cli::load_config(flags.config_path, config);
  // A configured certificate and key are read as serve would read them (the dev certificate,
  // made by serve when there is none, is not).
  if (errors.empty() && !config.tls.cert.empty() && !config.tls.key.empty())
    if (auto creds = tls::Credentials::load(config.tls.cert, config.tls.key); !creds)
      errors.problems.push_back("tls." + creds.error().reason);
  // The code directories as a snapshot would read them (serve refuses what this reports).
  if (errors.empty()) cli::check_code_dirs(config.workers, errors.problems);
  if (!errors.empty()) return print_problems(errors, flags.config_path);
  std::cout << "corral: " << flags.config_path << ": ok\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"corral: an application server (HTTP/1.1, one process per CPU, workers per address)",
               "corral"};
  app.set_version_flag("--version", std::string("corral ") + kVersion);
  app.require_subcommand(1);

  Flags flags;
  add_serve_options(app, flags);

  auto* cert_cmd = app.add_subcommand(
      "cert", "Make (or reuse) the dev certificate for localhost, 127.0.0.1 and ::1 and print it");
  std::string cert_dir;
  cert_cmd->add_option("--dir", cert_dir, "Where (default: <state dir>/tls)");
  cert_cmd->add_option("--state-dir", flags.state_dir, "The state directory");

  auto* check =
      app.add_subcommand("check", "Validate a configuration file and print every problem");
  check->add_option("--config", flags.config_path, "TOML configuration file")->required();

  cli::CtlOptions ctl_options;
  auto* ctl = cli::add_ctl_command(app, ctl_options);

  // Hidden: the flag tables of docs/config.md, from the definitions above (scripts/gen-flag-docs).
  if (argc == 2 && std::string_view(argv[1]) == "--help-flags-markdown") {
    std::cout << cli::flag_tables_markdown(app);
    return 0;
  }
  CLI11_PARSE(app, argc, argv);

  if (ctl->parsed()) return cli::run_ctl(ctl_options);
  if (cert_cmd->parsed()) return run_cert(flags, std::move(cert_dir));
  if (check->parsed()) return run_check(flags);
  return serve(flags);
}
