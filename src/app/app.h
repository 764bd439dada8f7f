// corral::app: what `corral serve` runs, as a library. An embedding application (one built on the
// C++ API, like examples/rooms) fills an Options — its addresses, its Site, its worker kinds, each
// a command line or an in-process function run in the forked child (workers::KindConfig::
// in_process, usually worker::worker_main), with its routes, start-data hook and authorize
// hook — and calls serve(), which runs the same processes `corral serve` runs:
//
//  * one server process and no supervisor, when one process is asked for and there are no worker
//    kinds and no TLS (the address is claimed, fanout/listen_claim.h; SIGHUP re-reads the policy);
//  * otherwise the fan-out supervisor (fanout/) with its server processes (ServerProcess), and the
//    supervisor's services: the worker manager and the control API (SupervisorServices), HTTP/3's
//    sockets and steering (QuicService), SIGHUP generations (Supervision::reload).
//
// `corral` (cli/) only turns its flags and configuration file into Options. Problems before
// anything serves go to stderr as "corral: <where>: <problem>" and serve() returns the exit
// statuses below; once serving, problems are log events.
//
// Lifetime: serve() blocks until the server (or the supervisor) stops, on the calling thread, and
// returns the exit status. What Options holds is shared with the forked processes.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "acme/renewer.h"
#include "control/admin.h"
#include "core/log.h"
#include "core/result.h"
#include "core/socket.h"
#include "http/admission.h"
#include "http/server.h"
#include "http/site.h"
#include "quic/server.h"
#include "tls/acme_board.h"
#include "tls/session.h"
#include "workers/manager.h"
#include "workers/proxy_routes.h"

namespace corral::app {

// Exit statuses, from sysexits.h.
inline constexpr int kExitBadConfig = 78;    // EX_CONFIG: a problem in the options
inline constexpr int kExitUnsafeState = 77;  // EX_NOPERM: the state directory (or a file read
                                             // from it) is not the running user's alone
inline constexpr int kExitAddressHeld = 75;  // EX_TEMPFAIL: another corral or program holds a
                                             // listen address

// `configured`, else $XDG_STATE_HOME/corral, else ./.corral; created 0700. It must be the running
// user's and not writable by group or others (core/owned_path.h): Error::code is then
// core::kErrorUnsafePath.
core::Result<std::string> state_directory(const std::string& configured);

struct Options {
  core::SocketAddress listen;
  // TLS (and HTTP/3 on the same port over UDP): the address and what the handshakes use, loaded
  // before anything forks. `ticket_key` is the one `tls` was made with: HTTP/3 shares it.
  std::optional<core::SocketAddress> tls_listen;
  std::shared_ptr<const tls::ServerConfig> tls;
  std::shared_ptr<tls::Credentials> credentials;
  std::shared_ptr<tls::TicketKey> ticket_key;
  // [tls] acme: the board the supervisor's renewer publishes to (challenge answers, the
  // certificate's version; made once, before anything forks) and the renewer's options. The TLS
  // config (`tls`) was made with the same board. Under a supervisor only.
  std::shared_ptr<tls::AcmeBoard> acme_board;
  std::optional<acme::RenewerOptions> acme;
  bool http3 = true;
  std::string steering = "auto";  // quic::parse_steering_request
  std::string retry = "auto";     // as configured, for the log; the mode is in http3_options
  quic::Http3Options http3_options;

  // What every server process serves (build_site makes both).
  std::shared_ptr<const http::Site> site;
  std::shared_ptr<workers::ResolverSlot> resolver_slot;
  http::ServerOptions server;
  std::shared_ptr<const http::AdmissionPolicy> policy;
  core::LogLevel log_level = core::LogLevel::kInfo;
  core::LogFormat log_format = core::LogFormat::kText;
  std::string access_log_path;  // "": access lines go with the event log (stderr)
  core::AccessFormat access_log_format = core::AccessFormat::kCorral;

  int processes = 1;  // 0: one per CPU this process may use
  bool pin = false;
  int max_draining_generations = 3;

  std::string state_dir;  // state_directory(state_dir): the control socket, the workers' files
  std::vector<workers::KindConfig> kinds;
  size_t max_workers = 0;  // workers::ManagerOptions' bounds (0: the machine's defaults)
  size_t max_starting = 0;
  // --watch (issue 13): roll out every settled change under a kind's code directory
  // (workers::Rollouts::watch). The kinds' code is snapshotted before anything forks: a code
  // directory that cannot be is a startup problem ("corral: workers.<kind>.code: ...").
  bool watch = false;
  // [admin] listen: the control API over TCP too (control/admin.h), with its access rule. Unset:
  // none. Set, it makes serve() run a supervisor (the control API is the supervisor's).
  std::optional<core::SocketAddress> admin_listen;
  control::AdminAccess admin;

  // In each server process under a supervisor, after the fork and before it serves: the slot.
  std::function<void(int slot)> on_process;
  // SIGHUP: fill `fresh` with the options to run next (its own problems logged), or return false
  // to keep the current ones; `fresh` keeps this hook unless it sets its own. Unset: a SIGHUP still
  // starts a new generation of the same options under a supervisor, and changes nothing in a single
  // process.
  std::function<bool(Options& fresh)> reload;
};

// The site every server process serves: the proxy routes of `options.kinds` (any method; a path
// that matches a kind's pattern goes to the worker of "<kind>:<param>..."), with
// `options.acme_board` the HTTP-01 answers on GET /.well-known/acme-challenge/{token} (from the
// board, 404 for a token it does not hold), then what `routes`
// adds (the application's own routes, authenticators, hooks). `log` outlives the site (the proxy
// routes log to it: authorize_failed). Sets options.site and
// options.resolver_slot; the error lists the routes' problems.
core::Result<void> build_site(Options& options, core::Logger& log,
                              const std::function<void(http::SiteBuilder&)>& routes);

// Whether serve() runs a supervisor: more than one process, worker kinds (workers are the
// supervisor's children and outlive a server process's crash) or TLS (a SIGHUP reloads the
// certificate by starting a new generation), or an admin listener (the control API's).
bool supervised(const Options& options);

// Runs until SIGTERM/SIGINT (and, under a supervisor, every process and worker) stopped; returns
// the exit status.
int serve(core::Logger& log, Options options);

}  // namespace corral::app
