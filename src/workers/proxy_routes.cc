#include "workers/proxy_routes.h"

#include "core/escape.h"
#include "ws/handshake.h"

namespace corral::workers {

void add_proxy_routes(http::SiteBuilder& site, const std::vector<KindConfig>& kinds,
                      std::shared_ptr<ResolverSlot> slot) {
  for (const auto& kind : kinds) {
    for (const auto& pattern : kind.routes) {
      site.route(pattern, [slot, name = kind.name](http::Request& req) -> http::Response {
        std::string address = name;
        for (const auto& p : req.params) address.append(":").append(p.value);
        if (!slot->resolver) return error_response(503, {{"message", "workers are not available"}});
        // A WebSocket upgrade passes the ws component's checks (Origin above all) before it is
        // relayed to the worker, which answers the handshake itself.
        if (req.header("upgrade")) {
          auto h = ws::check_handshake(req, {});
          if (h.status) return ws::refusal(h);
        }
        proxy::ProxyOptions options;
        options.pool = slot->pool;
        options.target = "/" + req.wildcard;
        if (!req.query.empty()) options.target.append("?").append(req.query);
        options.extra_headers.reserve(96);
        options.add_header("Corral-Remote-Address", req.remote_address)
            .add_header("Corral-Address", core::wire_encode(address));
        if (req.principal) options.add_header("Corral-Principal", req.principal->id);
        // The worker sees the part of the path the route's '*' matched ("/doc/42/edit" with
        // "/doc/{id}/*" -> "/edit"), with the query: its routes are relative to its address.
        LinkResolver* resolver = slot->resolver;
        return proxy::proxy_found(
            req,
            [resolver, address](proxy::UpstreamAnswer answer, bool again) {
              // Again: the socket it gave last time did not answer (a stale cached path to a
              // stopped worker, or one that went away): ask the supervisor, not the cache.
              resolver->resolve(address, std::move(answer), again);
            },
            std::move(options));
      });
    }
  }
}

}  // namespace corral::workers
