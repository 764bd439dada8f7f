// The admin listener: the control API (the same Site the supervisor serves on control.sock) over
// TCP, for a browser, a load balancer's health checks and a Prometheus scraper. Who may use it:
//
//  * `allow` empty (the default): loopback peers only (127.0.0.0/8, ::1). GET and HEAD need
//    nothing more; a mutating request (POST, PUT, PATCH, DELETE) needs the bearer token or a
//    same-origin check: an Origin equal to the listener's own origin ("http://" + the Host the
//    request was admitted with), or, without an Origin, `Sec-Fetch-Site: same-origin`. A form
//    or fetch() on another site in the operator's browser sends neither: refused (CSRF).
//  * `allow` set: only peers inside those CIDRs (loopback is not implied: list 127.0.0.1/32 to
//    keep it), and every request carries `Authorization: Bearer <token>`.
//
// A refused request gets 403 (the peer, the origin) or 401 (the token) with a one-line body and a
// log line `admin_refused peer=... reason=...`. Tokens are compared in constant time. The guard
// is a wrap on the control Site: a request with no peer address (the Unix socket, whose 0600 mode
// is its access rule) passes it untouched. The Host check is the admission policy's: loopback
// names, the listener's own address and the main `allowed_hosts` (a DNS-rebinding page names
// another host and is refused before the guard).
//
// Lifetime: the AdminListener and its Server live on the supervisor's loop, owned by
// SupervisorServices, destroyed before the routes' objects.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.h"
#include "core/result.h"
#include "core/socket.h"
#include "fanout/supervisor.h"
#include "http/admission.h"
#include "http/server.h"
#include "http/site.h"

namespace corral::control {

struct AdminAccess {
  std::vector<http::Relay> allow;  // empty: loopback peers only
  std::string token;               // empty: none (then `allow` must be empty)
};

struct AdminVerdict {
  int status = 0;           // 0: allowed; else 401 or 403
  std::string_view reason;  // static text: the log's reason and the body
};

// The decision for one request from `peer` (sans-IO: the unit tests give it any address).
AdminVerdict admin_check(const AdminAccess& access, const http::IpAddress& peer,
                         const http::Request& req);

// Equal in time independent of where they differ (the length is not secret).
bool tokens_equal(std::string_view a, std::string_view b);

// The token in `path`: its content without surrounding whitespace. Missing, unreadable or empty
// is an error naming the file.
core::Result<std::string> read_token_file(const std::string& path);

// The guard as a wrap over every path of `site`.
void add_admin_guard(http::SiteBuilder& site, std::shared_ptr<const AdminAccess> access,
                     core::Logger& log);

// GET /healthz: 200 "ok". GET /readyz: 200 "ready" when every slot of the current generation is
// running and the supervisor is not terminating, else 503 naming the first slot that is not (or
// "draining").
void add_health_routes(http::SiteBuilder& site, const fanout::Supervisor& supervisor);

// The Host names the admin listener admits: `main`'s allowed hosts and the listener's own IP
// (loopback names always are).
std::shared_ptr<const http::AdmissionPolicy> admin_policy(const http::AdmissionPolicy* main,
                                                          const core::SocketAddress& listen);

class AdminListener {
 public:
  // Binds `listen` (port 0: the kernel's) and serves `site` on it.
  static core::Result<std::unique_ptr<AdminListener>> start(
      core::EventLoop& loop, core::Logger& log, const core::SocketAddress& listen,
      std::shared_ptr<const http::AdmissionPolicy> policy, std::shared_ptr<const http::Site> site);
  const core::SocketAddress& address() const { return address_; }
  std::string url() const;  // "http://127.0.0.1:8081/"

 private:
  explicit AdminListener(std::unique_ptr<http::Server> server) : server_(std::move(server)) {}
  std::unique_ptr<http::Server> server_;
  core::SocketAddress address_;
};

}  // namespace corral::control
