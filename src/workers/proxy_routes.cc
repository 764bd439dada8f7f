#include "workers/proxy_routes.h"

#include <cxxabi.h>

#include <cstdlib>
#include <exception>
#include <typeinfo>

#include "core/escape.h"
#include "ws/handshake.h"

namespace corral::workers {

namespace {

// The exception's type as the code names it ("std::runtime_error"): what the log may say of a
// hook's failure (its message may carry what the hook saw, for the application's own log).
std::string type_name(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : type.name();
  std::free(name);
  return out;
}

}  // namespace

bool authorize_request(const KindConfig::Authorize& hook, std::string_view kind,
                       const http::Request& req, std::string_view address, core::Logger& log) {
  if (!hook) return true;
  std::optional<std::string> principal;
  if (req.principal) principal = req.principal->id;
  try {
    return hook(principal, address);
  } catch (const std::exception& e) {
    log.error("authorize_failed", "kind={} address=\"{}\" error_type=\"{}\"", kind,
              core::wire_encode(address), type_name(typeid(e)));
  } catch (...) {
    log.error("authorize_failed", "kind={} address=\"{}\" error_type=\"unknown\"", kind,
              core::wire_encode(address));
  }
  return false;
}

void add_proxy_routes(http::SiteBuilder& site, const std::vector<KindConfig>& kinds,
                      std::shared_ptr<ResolverSlot> slot, core::Logger& log) {
  for (const auto& kind : kinds) {
    for (const auto& pattern : kind.routes) {
      site.route(
          pattern,
          [slot, name = kind.name, authorize = kind.authorize,
           timeout_ms = kind.response_timeout_ms, &log](http::Request& req) -> http::Response {
            auto key = address_of(name, req.params);
            if (!key)
              return error_response(
                  400, {{"message",
                         "This path names no worker: one of the parts that make its address "
                         "holds ':'."},
                        {"code", "bad_address"}});
            std::string address = std::move(*key);
            // Before the resolve message: a refused request starts nothing (the principal is known
            // here, after the site's authenticators; the supervisor never sees it).
            if (!authorize_request(authorize, name, req, address, log))
              return error_response(403, {{"message", "Not allowed."}, {"code", "forbidden"}});
            if (!slot->resolver)
              return error_response(503, {{"message", "workers are not available"}});
            // A WebSocket upgrade passes the ws component's checks (Origin above all) before it is
            // relayed to the worker, which answers the handshake itself.
            if (req.header("upgrade")) {
              auto h = ws::check_handshake(req, {});
              if (h.status) return ws::refusal(h);
            }
            proxy::ProxyOptions options;
            options.pool = slot->pool;
            // A worker that takes the request and never answers (issue 14): the kind's own
            // timeout, then a 504 the client can read and a line that names the address.
            options.response_timeout_ms = timeout_ms;
            options.on_timeout = [&log, timeout_ms](std::string_view method,
                                                    std::string_view worker) {
              log.warn("worker_timeout", "address=\"{}\" method={} response_timeout_ms={}",
                       core::wire_encode(worker), method, timeout_ms);
              return error_response(504, {{"message", "The worker did not answer in time."},
                                          {"code", "worker_timeout"}});
            };
            // A worker whose accept queue stayed full (each connect failed with EAGAIN) until
            // the response timeout: the request never reached it. 503, come back in a second.
            options.on_busy = [&log, timeout_ms](std::string_view method, std::string_view worker) {
              log.warn("worker_busy",
                       "address=\"{}\" method={} waited_ms={} reason=\"accept queue full\"",
                       core::wire_encode(worker), method, timeout_ms);
              return error_response(
                  503,
                  {{"message", "The worker is busy. Try again shortly."}, {"code", "worker_busy"}},
                  1);
            };
            options.target = "/" + req.wildcard;
            if (!req.query.empty()) options.target.append("?").append(req.query);
            options.extra_headers.reserve(96);
            options.add_header("Corral-Remote-Address", req.remote_address)
                .add_header("Corral-Address", core::wire_encode(address));
            if (req.principal) options.add_header("Corral-Principal", req.principal->id);
            req.upstream.proxied = true;
            req.upstream.address.assign(address);  // the access log's (capacity kept)
            options.label = std::move(address);
            // The worker sees the part of the path the route's '*' matched ("/doc/42/edit" with
            // "/doc/{id}/*" -> "/edit"), with the query: its routes are relative to its address.
            // Both closures hold only what every request shares (no allocation per request):
            // the address comes to them as the options' label.
            LinkResolver* resolver = slot->resolver;
            return proxy::proxy_found(
                req,
                [resolver](const std::string& worker, proxy::UpstreamAnswer answer, bool again) {
                  // Again: the socket it gave last time did not answer (a stale cached path to a
                  // stopped worker, or one that went away): ask the supervisor, not the cache.
                  resolver->resolve(worker, std::move(answer), again);
                },
                std::move(options));
          },
          // The body goes to the worker as it comes (proxy.h), under the kind's own limit.
          http::RouteOptions{.stream_body = true, .max_body = kind.max_body});
    }
  }
}

}  // namespace corral::workers
