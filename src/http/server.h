// Server: HTTP/1.1 over TCP for one process. It owns the listening sockets it was given, the
// connections accepted from them, the published Site and the admission policy. Everything runs on
// one EventLoop; nothing here knows about other processes (the fan-out adopts listeners into it).
//
// Lifecycle: listen (or adopt_listener) -> publish(site) -> ... -> close(done). Requests that
// arrive before the first publish() wait and are served once a site is published, or get 503 after
// ready_timeout. publish() again swaps the site: requests in flight finish on the site they
// started on. close() stops accepting, closes idle keep-alive connections, lets running requests
// finish up to close_timeout, then closes the rest and calls `done`; upgraded connections
// (WebSockets get 1001) are told to close at once. drain() (a reload: a newer generation accepts)
// does the same for HTTP connections but keeps upgraded ones until they close or drain_timeout
// passes, and only then closes them as close() does; close() during a drain does that at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/socket.h"
#include "core/transport.h"
#include "http/admission.h"
#include "http/http_date.h"
#include "http/parser.h"
#include "http/site.h"
#include "http/trace_context.h"

namespace corral::http {

struct ServerOptions {
  ParserLimits limits;
  uint32_t header_timeout_ms = 10'000;  // from the first byte of a request (or accept) to its head
  uint32_t body_timeout_ms = 30'000;    // between body bytes
  uint32_t keepalive_timeout_ms = 60'000;  // idle between requests
  uint32_t write_timeout_ms = 30'000;      // no write progress to a client that stopped reading
  uint32_t ready_timeout_ms = 10'000;      // waiting for the first publish()
  uint32_t close_timeout_ms = 10'000;      // graceful close: running requests get this long
  // drain(): upgraded connections get this long (5 min: a chat or a live view outlives a
  // config reload, and the default bound of 3 draining generations keeps reloads as often as
  // every 100 s from cutting them early; 0: closed at once, as close()).
  uint32_t drain_timeout_ms = 300'000;
  uint32_t linger_timeout_ms = 2'000;  // reading (and dropping) after a final response
  size_t max_connections = 10'000;     // per process; above it new connections get 503
  bool access_log = true;
  std::string server_name = "corral";
  std::string referrer_policy = "strict-origin-when-cross-origin";
  // Non-empty: an Alt-Svc header with this value on every response (advertises HTTP/3, e.g.
  // `h3=":8443"; ma=86400`).
  std::string alt_svc;
  // The listener is a worker's socket, reached only through corral's proxy (the worker library
  // sets this): a request's Corral-Host and Corral-Scheme, which only the proxy sets (a client's
  // own Corral-* fields are dropped at the front), become its host and scheme after admission.
  // What the worker builds from them, a WebSocket Origin check or a Location, is then the
  // client's view, not the proxy's `Host: localhost`.
  bool behind_corral = false;
  // Asked about each accepted socket before it is served: false closes it at once, unanswered
  // (the control socket refuses a peer of another user this way, by SO_PEERCRED).
  std::function<bool(int fd)> admit_socket;
};

struct ServerStats {
  uint64_t accepted = 0;
  uint64_t refused = 0;  // over max_connections
  uint64_t requests = 0;
  uint64_t errors = 0;  // requests answered by the connection itself (4xx/5xx before a route)
  size_t active = 0;
};

class Connection;

class Server {
 public:
  Server(core::EventLoop& loop, core::Logger& log, ServerOptions options);
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  ~Server();

  // With a `transport` factory, each connection accepted on the listener is wrapped by it (TLS:
  // tls::TlsTransportFactory, handshake first, then HTTP/1.1; Request::scheme "https" when the
  // transport is secure()); without one, it is plain TCP. The factory is shared by every
  // connection of the listener.
  core::Result<core::SocketAddress> listen(
      const core::SocketAddress& addr, bool reuse_port = false,
      std::shared_ptr<const core::TransportFactory> transport = nullptr);
  // Serves an already listening socket (the fan-out supervisor creates them before forking).
  core::Result<void> adopt_listener(
      core::UniqueFd fd, std::shared_ptr<const core::TransportFactory> transport = nullptr);

  void publish(std::shared_ptr<const Site> site);
  // Swaps the admission policy; connections admitted under a host no longer allowed are closed
  // (idle ones at once, busy ones after their current response).
  void set_policy(std::shared_ptr<const AdmissionPolicy> policy);
  void close(std::function<void()> done);
  void drain(std::function<void()> done);
  bool closing() const { return closing_; }    // close() or drain(): not accepting
  bool draining() const { return draining_; }  // drain(), upgraded connections still kept

  // Upgraded connections (WebSocket) stay known to the server: they count as connections, are
  // told when the server closes and when a new site is published, and close() waits for them.
  void attach(Upgraded* u);
  void detach(Upgraded* u);

  // Idle: no request in flight and no upgraded connection open. A worker reports the flips.
  bool idle() const { return inflight_ == 0 && upgraded_ == nullptr; }
  // What keeps it from idle (a worker reports them: "why alive").
  size_t requests_in_flight() const { return inflight_; }
  size_t upgraded_connections() const { return upgraded_count_; }
  std::function<void(bool idle)> on_idle_change;
  void request_started();
  void request_finished();

  const ServerStats& stats() const { return stats_; }
  const ServerOptions& options() const { return options_; }
  core::EventLoop& loop() { return loop_; }
  core::Logger& log() { return log_; }
  const std::shared_ptr<const Site>& site() const { return site_; }
  const AdmissionPolicy& policy() const { return *policy_; }
  std::string_view date();      // the Date header value, formatted once per second
  std::string_view log_time();  // ISO-8601, once per second
  // Gives `req` its traceparent (http/trace_context.h): the client's one when it sent exactly one
  // valid field, else a new one.
  void assign_trace(Request& req);

 private:
  friend class Connection;
  class Listener;
  void on_accept(int listen_fd, const core::TransportFactory* transport);
  void connection_closed(Connection* c);
  void park(Connection* c) { parked_.push_back(c); }
  void unpark(Connection* c);
  void maybe_finish_close();
  void stop_accepting(std::function<void()> done);
  void close_upgraded();
  // Tells every upgraded connection the server closes (WebSockets send 1001), then arms the
  // close timer for what does not finish.
  void close_upgraded_now();
  void resume_accepting();

  core::EventLoop& loop_;
  core::Logger& log_;
  ServerOptions options_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::shared_ptr<const Site> site_;
  std::shared_ptr<const AdmissionPolicy> policy_;
  Connection* head_ = nullptr;    // intrusive list of live connections
  Upgraded* upgraded_ = nullptr;  // intrusive list of upgraded connections
  size_t upgraded_count_ = 0;     // its length
  size_t inflight_ = 0;           // requests between their first byte and their response
  bool was_idle_ = true;
  void notify_idle();
  std::vector<Connection*> parked_;
  ServerStats stats_;
  DateCache date_;
  time_t log_time_s_ = 0;
  TraceIds trace_ids_;
  char log_time_[32] = {};
  bool closing_ = false;
  bool draining_ = false;
  std::function<void()> close_done_;
  core::Timer close_timer_;
  core::Timer drain_timer_;
  core::Timer accept_pause_;
};

}  // namespace corral::http
