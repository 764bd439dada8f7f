#include "control/admin.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace corral::control {

namespace {

bool is_loopback(const http::IpAddress& ip) {
  if (ip.family == AF_INET) return ip.bytes[0] == 127;
  if (ip.family == AF_INET6) {
    static constexpr uint8_t kOne[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return std::memcmp(ip.bytes, kOne, 16) == 0;
  }
  return false;
}

// The token of `Authorization: Bearer <token>`; nullopt without one.
std::optional<std::string_view> bearer(const http::Request& req) {
  auto h = req.header("authorization");
  if (!h) return std::nullopt;
  std::string_view v = *h;
  if (v.size() < 7 || !http::iequals(v.substr(0, 7), "bearer ")) return std::nullopt;
  v.remove_prefix(7);
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return v;
}

// The listener's own origin is "http://" + the Host the request was admitted with (the admission
// policy only admits the listener's own names).
bool same_origin(const http::Request& req) {
  if (auto origin = req.header("origin")) {
    std::string_view o = *origin;
    return o.size() > 7 && http::iequals(o.substr(0, 7), "http://") && !req.host.empty() &&
           http::iequals(o.substr(7), req.host);
  }
  auto site = req.header("sec-fetch-site");
  return site && http::iequals(*site, "same-origin");
}

bool mutating(http::Method m) {
  return m != http::Method::kGet && m != http::Method::kHead;
}

}  // namespace

bool tokens_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff = static_cast<uint8_t>(diff | (static_cast<uint8_t>(a[i]) ^ static_cast<uint8_t>(b[i])));
  return diff == 0;
}

AdminVerdict admin_check(const AdminAccess& access, const http::IpAddress& peer,
                         const http::Request& req) {
  if (access.allow.empty()) {
    if (!is_loopback(peer)) return {403, "peer is not loopback (set [admin] allow)"};
  } else {
    bool inside = false;
    for (const auto& cidr : access.allow) inside = inside || cidr.contains(peer);
    if (!inside) return {403, "peer is outside [admin] allow"};
  }
  auto token = bearer(req);
  bool token_ok = token && !access.token.empty() && tokens_equal(*token, access.token);
  if (token && !token_ok) return {401, "wrong bearer token"};
  if (!access.allow.empty() && !token_ok) return {401, "bearer token required"};
  if (mutating(req.method) && !token_ok && !same_origin(req))
    return {403, "cross-origin request (send the bearer token, or Origin of this listener)"};
  return {};
}

core::Result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return core::Error{errno ? errno : ENOENT, path + ": " + std::strerror(errno)};
  std::ostringstream s;
  s << in.rdbuf();
  std::string token = s.str();
  size_t b = token.find_first_not_of(" \t\r\n");
  size_t e = token.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return core::Error{EINVAL, path + ": the token file is empty"};
  return token.substr(b, e - b + 1);
}

void add_admin_guard(http::SiteBuilder& site, std::shared_ptr<const AdminAccess> access,
                     core::Logger& log) {
  http::Wrap guard;
  guard.before = [access = std::move(access),
                  &log](http::Request& req) -> std::optional<http::Response> {
    if (req.remote_address.empty()) return std::nullopt;  // the Unix socket
    auto peer = http::IpAddress::parse(req.remote_address);
    AdminVerdict v =
        peer ? admin_check(*access, *peer, req) : AdminVerdict{403, "peer address not understood"};
    if (v.status == 0) return std::nullopt;
    log.warn("admin_refused", "peer={} status={} reason=\"{}\"", req.remote_address, v.status,
             v.reason);
    auto r = http::Response::text(std::string(v.reason) + "\n", v.status);
    if (v.status == 401) r.header("WWW-Authenticate", "Bearer");
    return r;
  };
  site.wrap("/*", std::move(guard));
}

void add_health_routes(http::SiteBuilder& site, const fanout::Supervisor& supervisor) {
  site.route("GET /healthz", [](http::Request&) { return http::Response::text("ok\n"); });
  site.route("GET /readyz", [&supervisor](http::Request&) {
    if (supervisor.terminating()) return http::Response::text("draining\n", 503);
    for (const auto& s : supervisor.state())
      if (s.status != "running")
        return http::Response::text(fmt::format("slot {} is {}\n", s.index, s.status), 503);
    return http::Response::text("ready\n");
  });
}

std::shared_ptr<const http::AdmissionPolicy> admin_policy(const http::AdmissionPolicy* main,
                                                          const core::SocketAddress& listen) {
  auto p = std::make_shared<http::AdmissionPolicy>();
  if (main) p->allowed_hosts = main->allowed_hosts;
  auto self = http::normalize_allowed_host(listen.ip());
  if (self) p->allowed_hosts.push_back(std::move(self.value()));
  return p;
}

core::Result<std::unique_ptr<AdminListener>> AdminListener::start(
    core::EventLoop& loop, core::Logger& log, const core::SocketAddress& listen,
    std::shared_ptr<const http::AdmissionPolicy> policy, std::shared_ptr<const http::Site> site) {
  http::ServerOptions opts;
  opts.access_log = false;
  opts.max_connections = 256;  // operators, probes and scrapers, not the public
  auto server = std::make_unique<http::Server>(loop, log, opts);
  auto bound = server->listen(listen);
  if (!bound) return bound.error();
  server->set_policy(std::move(policy));
  server->publish(std::move(site));
  std::unique_ptr<AdminListener> a(new AdminListener(std::move(server)));
  a->address_ = bound.value();
  return a;
}

std::string AdminListener::url() const {
  return "http://" + address_.to_string() + "/";
}

}  // namespace corral::control
