// worker_main: the child side of the worker protocol (docs/worker-protocol.md) for C++ workers.
// A worker is a process that serves one address (`kind:key`) over HTTP/1.1 on a Unix socket the
// manager created; this library does everything the protocol asks so the application only
// registers routes:
//
//   1. reads CORRAL_CONTROL_FD (3) and CORRAL_LISTEN_FD (4), arms PR_SET_PDEATHSIG, runs the
//      application's prepare hook (WorkerOptions::prepare: what does not depend on the address;
//      a throw is a `fatal`), and, as a warm spare (no CORRAL_ADDRESS: launched before any
//      request, docs/worker-protocol.md "Warm spares"), sends `standby`;
//   2. waits for `start` on the control socket, takes the address's lock (flock, blocking — in a
//      helper thread, so the loop still sees `shutdown`, SIGTERM and a lost link meanwhile),
//      sends `started`;
//   3. calls the application's setup function with a WorkerContext and a SiteBuilder (a throw, or
//      routes that do not build, is a `fatal` with the redacted error and exit status 1);
//   4. publishes the site on the listening socket, sends `ready {idle, reload, ping, requests,
//      upgraded, busy}` (`reload: true` when setup registered a reload hook), then `idle {idle,
//      requests, upgraded, busy}` on every flip of (no request in flight, no upgraded
//      connection, busy count zero), and while not idle at most once a second when a count
//      changed (the manager shows them as what holds the worker);
//   4b. answers each `ping {id}` with `pong {id}` from the loop (issue 14): a loop stuck in a
//      handler stops answering, and the manager stops the worker as unresponsive;
//   5. applies each `reload {id, code}` (below) and answers `reloaded`;
//   6. stops on `shutdown`, SIGTERM/SIGINT, parent death or a lost control link (EOF on fd 3):
//      stops accepting, lets running requests finish for at most half of force_exit_ms, runs the
//      closers in reverse order of registration, and returns 0. If any of that hangs, the process
//      _exits(0) force_exit_ms after the stop began (a SIGALRM timer, so a closer stuck outside
//      the loop cannot hold it).
//
// Reloading in place (docs/worker-protocol.md, "Code and reload"): a rollout sends the kind's new
// set of code (by reference: the library reads its manifest first; one it cannot read is the
// error `code_manifest_failed`). The library runs the application's reload hook with it on the
// loop, between two events: requests in flight continue around it (none progresses while the
// hook itself runs, so a hook should be quick: read the new files, swap what the routes use), and
// the worker counts as busy meanwhile. Its return value is the `report` of `reloaded {id,
// version, report}`; a throw is `reloaded {id, version, error: redact(e)}` (the original to
// stderr) and the worker keeps its old code; without a hook the answer is the error `no_reload`.
// Reloads are applied one at a time in arrival order; one that arrives before `ready` waits until
// `ready` was sent; during a stop they are ignored. After a hook returns, code_version(),
// code_dir() and scripts() are the new set's.
//
// WorkerContext::fatal() reports a redacted error and stops the same way with status 1: the
// closers still run (they release what setup took), but nothing is served any more.
//
// The lock descriptor stays open until worker_main returns, after the closers: a successor worker
// for the same address cannot start before this one's state is written.
//
// Lifetime and threading: one worker_main per process, on the calling thread; the context and
// everything it hands out live until worker_main returns. Only the lock wait uses a second thread;
// setup, routes, closers and the reload hook all run on the loop's thread.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/event_loop.h"
#include "core/log.h"
#include "http/server.h"
#include "http/site.h"
#include "worker/control.h"

namespace corral::worker {

class Worker;  // worker.cc

// A reload hook: the new set (CodeUpdate, worker/control.h: version, dir, scripts) in, the report
// out.
using ReloadHook = std::function<nlohmann::json(const CodeUpdate&)>;

// What the application's setup function (and its routes) may use. Borrowed: valid until
// worker_main returns.
class WorkerContext {
 public:
  WorkerContext(const WorkerContext&) = delete;
  WorkerContext& operator=(const WorkerContext&) = delete;

  std::string_view address() const;          // "doc:42", from `start` (else CORRAL_ADDRESS)
  std::string_view state_dir() const;        // CORRAL_STATE_DIR ("" when unset)
  const nlohmann::json& start_data() const;  // `start.start`; null when the kind has none
  // The code the worker runs: `start`'s `code` (its files read from `code.manifest`), then each
  // reload's after its hook returned. Empty version and dir (and no scripts) for a kind without
  // code.
  const nlohmann::json& scripts() const;  // [{"path","digest"}, ...]; an array, maybe empty
  std::string_view code_version() const;  // hex SHA-256 of the set
  std::string_view code_dir() const;      // the snapshot: read-only files, never the live dir
  core::EventLoop& loop();
  core::Logger& log();  // stderr, which the manager prefixes with the address

  // Runs at shutdown, in reverse order of registration. A throwing closer is logged; the others
  // still run.
  void on_close(std::function<void()> closer);
  // The application's own work (a timer, a background job) holds the worker busy, so it is not
  // reported idle and not stopped for idleness. Every +1 needs its -1.
  void busy_add(int delta);
  // The worker can load a new set of its kind's code in place: `hook` runs on the loop with the
  // new set and returns the report (any JSON; null becomes {}), or throws if the set cannot be
  // used (the worker then keeps its old code). Register it in setup: `ready` tells the manager
  // whether there is one. A second call replaces the hook.
  void on_reload(ReloadHook hook);
  // The worker cannot go on: sends `fatal` with redact(e) (the original goes to stderr only),
  // then stops (closers run) and worker_main returns 1. Returns to the caller; a route that calls
  // it still returns a response, which the client may or may not receive.
  void fatal(const std::exception& e);

 private:
  friend class Worker;
  explicit WorkerContext(Worker& worker) : worker_(worker) {}
  Worker& worker_;
};

// Only `message` is meant for strangers: code and reason should be stable, static words.
PublicError default_redact(const std::exception& e);  // {"internal error"}

struct WorkerOptions {
  std::function<PublicError(const std::exception&)> redact = default_redact;
  // Runs once before `start` is read, on the loop's thread: the setup that does not depend on the
  // address (load a model, open a shared cache, warm the code), so that a warm spare has done it
  // before any request binds it. There is no address yet (address(), start_data() and the code
  // are empty: a spare has none); closers registered here run at the stop as others do. A throw
  // is a `fatal` (redacted) and worker_main returns 1.
  std::function<void(WorkerContext&)> prepare;
  // From the start of a stop to a forced _exit(0). The protocol says 3 s; the manager kills the
  // process group after its stop_grace (5 s).
  uint32_t force_exit_ms = 3000;
  // The worker's HTTP server. close_timeout_ms is capped at force_exit_ms / 2 so that closers run
  // before the forced exit. The access log is off by default: the proxy in front logs requests.
  http::ServerOptions server = default_server_options();

  static http::ServerOptions default_server_options() {
    http::ServerOptions o;
    o.access_log = false;
    o.behind_corral = true;  // its socket is reached only through the proxy
    return o;
  }
};

// Exit statuses worker_main returns.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFatal = 1;            // fatal(), a throwing setup, the lock not taken
inline constexpr int kExitBadEnvironment = 78;  // EX_CONFIG: not started by a worker manager

using SetupFunction = std::function<void(WorkerContext&, http::SiteBuilder&)>;

// Runs the worker until it stops; returns the process exit status (return it from main()).
int worker_main(SetupFunction setup, WorkerOptions options = {});

}  // namespace corral::worker
