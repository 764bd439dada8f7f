// run_server: the whole single-process server in one call, for the `corral` program and for
// embedding applications: an event loop, the listeners, the Site, SIGTERM/SIGINT for a graceful
// close, SIGHUP for a reload hook, SIGUSR1 to reopen the log files (core::Logger::reopen) and,
// under a supervisor, a drain signal. Returns the process exit
// status (0 after a graceful close).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/log.h"
#include "core/socket.h"
#include "http/server.h"
#include "http/site.h"

namespace corral::http {

struct RunOptions {
  std::vector<core::SocketAddress> listen;
  std::vector<int> adopt_fds;  // listening sockets made by someone else (the fan-out supervisor)
  // TLS: listeners whose connections are wrapped by `tls` (both need it set), a
  // tls::TlsTransportFactory built by the caller, so http never names the TLS types.
  std::vector<core::SocketAddress> listen_tls;
  std::vector<int> adopt_tls_fds;
  std::shared_ptr<const core::TransportFactory> tls;
  ServerOptions server;
  std::shared_ptr<const AdmissionPolicy> policy;
  // Called once every listener is bound, plain ones first, then TLS ones (tests read the ports).
  std::function<void(Server&, const std::vector<core::SocketAddress>&)> on_listening;
  // Once the loop exists, before listening: per-process services (what it returns is destroyed
  // before the loop).
  std::function<std::shared_ptr<void>(core::EventLoop&)> on_loop;
  // Once the Server exists, before it publishes: services that serve the same site next to it
  // (HTTP/3). What it returns is destroyed before the Server. `close` is called on SIGTERM/SIGINT
  // with the Server's close; the loop stops when both have called their `done`.
  struct Companion {
    std::shared_ptr<void> keep;
    std::function<void(std::function<void()> done)> close;
  };
  std::function<Companion(Server&)> on_server;
  // SIGHUP: return a new policy to apply (or null to keep the current one).
  std::function<std::shared_ptr<const AdmissionPolicy>()> on_reload;
  // SIGTERM/SIGINT: once, as the graceful close begins (not on a drain).
  std::function<void()> on_close;
  // Non-zero: this signal drains (Server::drain, and the companion's close): a process of an
  // older generation whose successor accepts now (fanout::kDrainSignal). SIGTERM after it closes
  // the upgraded connections at once; a third signal stops the loop.
  int drain_signal = 0;
};

int run_server(core::Logger& log, const RunOptions& options, std::shared_ptr<const Site> site);

}  // namespace corral::http
