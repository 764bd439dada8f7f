// The routes in each server process that proxy a worker kind's paths to the address's worker:
// for every kind's route pattern, any method; the address is "<kind>:<param>[:<param>...]" (the
// pattern's parameters, percent-decoded by the router; workers::address_of, which refuses a ':'
// inside one of several: 400 {"error":{"message","code":"bad_address"}}). The worker socket comes
// from the process's LinkResolver, the connection from its upstream pool (proxy/proxy.h). A kind's
// authorize hook decides here, where the request's principal is known. A worker that sends no
// response head within the kind's response_timeout_ms is answered 504 {"error":{"message",
// "code":"worker_timeout"}} and logged (`worker_timeout`, with the address and the timeout). A
// request that found the worker's accept queue full waits for room as long (proxy/pool.h), then
// is answered 503 {"error":{"message","code":"worker_busy"}} with Retry-After: 1, logged as
// `worker_busy`.
// Request bodies are streamed to the worker (http::RouteOptions::stream_body), under the kind's
// max_body.
//
// Lifetime: the routes are built into the site before the fork and hold the ResolverSlot; each
// server process's ProcessServices fills the slot once its loop exists. Single-threaded.
#pragma once

#include <memory>
#include <vector>

#include "core/log.h"
#include "http/request.h"
#include "http/site.h"
#include "proxy/proxy.h"
#include "workers/manager.h"
#include "workers/resolver.h"

namespace corral::workers {

// Filled in each server process once its loop exists (the site is built before the fork); null
// members answer 503 "workers are not available".
struct ResolverSlot {
  LinkResolver* resolver = nullptr;
  proxy::UpstreamPool* pool = nullptr;  // keep-alive connections to this process's workers
};

// Routes for every kind's patterns (KindConfig::routes). Each route keeps its kind's authorize
// hook: a request it refuses (or that makes it throw) is answered 403 {"error":{"message",
// "code":"forbidden"}} before anything is resolved. `log` (authorize_failed lines) outlives the
// site.
void add_proxy_routes(http::SiteBuilder& site, const std::vector<KindConfig>& kinds,
                      std::shared_ptr<ResolverSlot> slot, core::Logger& log);

// `hook` (the kind's KindConfig::authorize; empty: everyone may) for the request's principal and
// `address`. A throwing hook refuses: logged as `authorize_failed` with the kind, the address (its
// wire form) and the exception's type, never its text, which may carry what the hook saw.
bool authorize_request(const KindConfig::Authorize& hook, std::string_view kind,
                       const http::Request& req, std::string_view address, core::Logger& log);

}  // namespace corral::workers
