// The status page: a live view of the supervisor, its server processes, the worker kinds and the
// addresses, served at `/` of the control site (the control socket, and the admin listener over
// TCP), for an operator's browser (docs/operate.md, "The status page").
//   GET /                 the page: HTML, CSS and a little JavaScript (src/control/status/,
//                         embedded at build time), its inline style and script under the
//                         response's CSP nonce; it draws what /events sends and calls the control
//                         API's POST routes for its buttons (retry, stop, suspend, resume, rollout)
//   GET /events           Server-Sent Events: one `view` event at once, then one per change,
//                         at most every kMinPushMs; query: q (a substring of the address's wire
//                         form), kind, status, page (from 0), per (addresses a page, 1..200,
//                         default 50). A view is {supervisor, processes (GET /processes' object),
//                         kinds: [summary], addresses: {total, all, page, per, items: [{address,
//                         kind, entry}]}}: the kinds' summaries and one page of addresses, never
//                         every address, so its cost is bounded whatever the number of addresses.
//   GET /status/tail      ?address=WIRE: the last 8 KiB of the address's stderr (text)
// The events share one StatusHub: one subscription to the manager (only while a client is
// connected), one coalescing timer, the common part of the view made once per push and the page
// of each client made again only when an address changed. A client that does not read is cut off
// once 1 MiB is queued for it (its EventSource connects again).
//
// Lifetime: the routes borrow the Supervisor, the Manager and the Rollouts (as the other control
// routes do): the control server must be closed before they are destroyed. Loop thread only.
#pragma once

#include "control/control_site.h"
#include "core/event_loop.h"
#include "http/site.h"
#include "workers/manager.h"

namespace corral::control {

struct StatusSources {
  const fanout::Supervisor* supervisor = nullptr;
  ProcessReport reported;               // what each server process last reported (may be empty)
  workers::Manager* manager = nullptr;  // null without worker kinds
};

// The minimum time between two pushes to a client: at most 4 views a second.
constexpr uint64_t kMinPushMs = 250;

void add_status_routes(http::SiteBuilder& site, core::EventLoop& loop, StatusSources sources);

}  // namespace corral::control
