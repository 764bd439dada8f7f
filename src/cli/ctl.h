// `corral ctl`: a person's (or a script's) view of a running corral through its control socket,
// <state_dir>/control.sock (control/control_site.h, control/worker_routes.h). The state directory
// is found as `corral serve` finds it: --state-dir, else the `state_dir` of --config FILE, else
// $XDG_STATE_HOME/corral or ./.corral. Each verb is one request (logs -f and top hold theirs or
// repeat them); what it prints is for a person by default (cli/ctl_format.h) and the control
// API's JSON with --json. A refusal or a failure is one line on stderr naming what failed and
// what to do, and a distinct exit status (kCtl* below, documented in docs/operate.md).
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>

namespace corral::cli {

// Exit statuses of `corral ctl` besides 0 (sysexits.h where one fits).
inline constexpr int kCtlRefused = 1;       // the control API said no (404, 409, a failed rollout)
inline constexpr int kCtlUsage = 2;         // a missing ADDRESS or KIND
inline constexpr int kCtlUnavailable = 69;  // EX_UNAVAILABLE: no corral runs on that state dir
inline constexpr int kCtlNoAnswer = 75;     // EX_TEMPFAIL: connected, no answer in time
inline constexpr int kCtlNotAllowed = 77;   // EX_NOPERM: the socket refused this user (or the
                                            // state directory is unsafe)
inline constexpr int kCtlBadConfig = 78;    // EX_CONFIG: --config FILE has problems

struct CtlOptions {
  std::string what = "processes";
  std::string address;  // ADDRESS (retry, stop, suspend, resume, logs) or KIND (rollout)
  std::string to;       // rollout --to VERSION
  std::string config_path, state_dir;
  bool json = false;
  size_t lines = 100;     // logs -n
  bool follow = false;    // logs -f
  int count = 0;          // top --count (0: until q or Ctrl-C)
  double interval = 1.0;  // top --interval seconds
};

// The `ctl` subcommand and its options, into `options`.
CLI::App* add_ctl_command(CLI::App& app, CtlOptions& options);
int run_ctl(const CtlOptions& options);

}  // namespace corral::cli
