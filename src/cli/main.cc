// corral: the program. Wires the components together (STYLE rule 9: cli only wires).
#include <CLI/CLI.hpp>
#include <sys/stat.h>

#include <cstdio>
#include <iostream>

#include "cli/config.h"
#include "cli/sites.h"
#include "http/runner.h"

namespace {

constexpr const char* kVersion = "0.1.0";

int print_problems(const corral::cli::ConfigErrors& errors, const std::string& path) {
  for (const auto& p : errors.problems) std::cerr << "corral: " << path << ": " << p << "\n";
  return corral::cli::kExitBadConfig;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace corral;
  CLI::App app{"corral: an application server (HTTP/1.1, workers per address)", "corral"};
  app.set_version_flag("--version", std::string("corral ") + kVersion);
  app.require_subcommand(1);

  cli::Config config;
  std::string config_path, listen, root, log_level;
  bool no_access_log = false;

  auto* serve = app.add_subcommand("serve", "Serve DIR (default: the embedded welcome site)");
  serve->add_option("DIR", root, "Directory to serve");
  serve->add_option("--listen", listen, "Address to listen on (default 127.0.0.1:8080)");
  serve->add_option("--config", config_path, "TOML configuration file");
  serve->add_option("--log-level", log_level, "debug, info, warn or error");
  serve->add_flag("--no-access-log", no_access_log, "Do not log one line per request");

  auto* check = app.add_subcommand("check", "Validate a configuration file and print every problem");
  check->add_option("--config", config_path, "TOML configuration file")->required();

  CLI11_PARSE(app, argc, argv);

  if (!config_path.empty()) {
    auto errors = cli::load_config(config_path, config);
    if (!errors.empty()) return print_problems(errors, config_path);
  }
  if (check->parsed()) {
    std::cout << "corral: " << config_path << ": ok\n";
    return 0;
  }

  // Flags override the file.
  cli::ConfigErrors flag_errors;
  if (!listen.empty()) config.listen = listen;
  if (!root.empty()) config.root = root;
  if (no_access_log) config.server.access_log = false;
  if (!log_level.empty()) {
    if (log_level == "debug") config.log_level = core::LogLevel::kDebug;
    else if (log_level == "info") config.log_level = core::LogLevel::kInfo;
    else if (log_level == "warn") config.log_level = core::LogLevel::kWarn;
    else if (log_level == "error") config.log_level = core::LogLevel::kError;
    else flag_errors.problems.push_back("--log-level: expected one of debug, info, warn, error");
  }
  auto addr = core::parse_address(config.listen);
  if (!addr) flag_errors.problems.push_back("--listen: " + addr.error().reason);
  if (!config.root.empty()) {
    struct stat st;
    if (stat(config.root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      flag_errors.problems.push_back("DIR: '" + config.root + "' is not a directory");
  }
  auto policy = cli::build_policy(config, flag_errors);
  if (!flag_errors.empty()) return print_problems(flag_errors, "command line");

  core::Logger log(2, config.log_level);
  http::SiteBuilder builder;
  if (config.root.empty()) {
    cli::add_welcome_routes(builder);
  } else {
    cli::add_static_routes(builder, config.root);
  }
  builder.on_error([&log](const http::ErrorEvent& e) {
    log.error("route_error", "pattern=\"{}\" target=\"{}\" error=\"{}\"", e.pattern,
              e.request.target, e.message);
  });
  auto site = builder.build();
  if (!site) {
    std::cerr << "corral: routes: " << site.error().reason << "\n";
    return cli::kExitBadConfig;
  }

  http::RunOptions run;
  run.listen.push_back(addr.value());
  run.server = config.server;
  run.policy = policy;
  run.on_reload = [&]() -> std::shared_ptr<const http::AdmissionPolicy> {
    if (config_path.empty()) return nullptr;
    cli::Config fresh;
    auto errors = cli::load_config(config_path, fresh);
    if (!errors.empty()) {
      for (const auto& p : errors.problems)
        log.error("reload_refused", "file={} problem=\"{}\"", config_path, p);
      return nullptr;
    }
    return cli::build_policy(fresh, errors);
  };
  return http::run_server(log, run, std::move(site.value()));
}
