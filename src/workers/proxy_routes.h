// The routes in each server process that proxy a worker kind's paths to the address's worker:
// for every kind's route pattern, any method; the address is "<kind>:<param>[:<param>...]" (the
// pattern's parameters, percent-decoded by the router). The worker socket comes from the
// process's LinkResolver, the connection from its upstream pool (proxy/proxy.h).
//
// Lifetime: the routes are built into the site before the fork and hold the ResolverSlot; each
// server process's ProcessServices fills the slot once its loop exists. Single-threaded.
#pragma once

#include <memory>
#include <vector>

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

// Routes for every kind's patterns (KindConfig::routes).
void add_proxy_routes(http::SiteBuilder& site, const std::vector<KindConfig>& kinds,
                      std::shared_ptr<ResolverSlot> slot);

}  // namespace corral::workers
