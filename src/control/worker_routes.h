// The control API's worker routes (issue 4), served by the supervisor beside add_process_routes:
//   GET  /workers                     the manager's state: {address: entry}
//   GET  /workers/watch               chunked JSON lines: {"state": {...}} first, then one
//                                     {"address": ..., "entry": ... | null} per change
//   POST /workers/{address}/retry     202 {address, entry}; 404 if neither failed nor suspended;
//                                     ?start=1 starts its worker at once (as a request would)
//   POST /workers/{address}/stop      202; 404 if there is no worker nor a queued start
//   POST /workers/{address}/suspend   202; 404 for an unknown kind
//   POST /workers/{address}/resume    202; 404 if not suspended
//   GET  /workers/{address}/log       text: the last ?lines=N (default 100) lines of the address
//                                     in its kind's log; follow=1 streams each new one after
//                                     them (`corral ctl logs [-n N] [-f]`); 404 for no kind
// Addresses appear in their wire form (core::wire_encode: '%' and bytes that are not text as %XX),
// in the JSON and in {address}, which is that form percent-encoded once more as a path segment;
// an {address} that is not a wire form is 400 bad_address.
// The routes borrow the Manager: the control server must be closed before it is destroyed. A
// watcher that does not read is cut off once 1 MiB is queued for it.
// The kinds' routes, GET /workers/kinds and POST /workers/kinds/{kind}/rollout (issue 13), are
// control/rollout_routes.h's: "kinds" is never an {address} (an address has a ':'), and the
// router prefers the literal segment anyway.
#pragma once

#include "http/site.h"
#include "workers/manager.h"

namespace corral::control {

void add_worker_routes(http::SiteBuilder& site, workers::Manager& manager);

}  // namespace corral::control
