// The control API's rollout routes (issue 13, docs/deploying.md), served beside the worker routes:
//   GET  /workers/kinds                 workers::Rollouts::state(): {kind: {version (current, null
//                                       without code), dirty, workers, stale, rolling, code,
//                                       reload, rollout_timeout_ms, versions: [{version,
//                                       current}] newest first}}
//   POST /workers/kinds/{kind}/rollout  body empty (snapshot the kind's code directory) or
//                                       {"to": "VERSION"} (a kept version: full hex or a unique
//                                       prefix of at least 8 digits). Answered once the rollout is
//                                       done (a deferred response: it may take the kind's
//                                       rollout_timeout_ms): 200 with the report {kind, version,
//                                       previous, workers: [{address, report | stopped | error}],
//                                       cleared, failed, took_ms}; refused with {"error":
//                                       {message, code}}: 404 unknown_kind, 409 no_code, 404
//                                       unknown_version, 500 snapshot_failed, 400 bad_request (a
//                                       body that is not {"to": string}).
// "kinds" is never an address (an address always has a ':'), and the router prefers a literal
// segment to a {param}: these paths never reach the worker routes' /workers/{address}/...
// The routes borrow the Rollouts: the control server must be closed before it is destroyed. A
// client that goes away before the answer leaves the rollout running; nobody is answered.
#pragma once

#include "http/site.h"
#include "workers/rollouts.h"

namespace corral::control {

void add_rollout_routes(http::SiteBuilder& site, workers::Rollouts& rollouts);

}  // namespace corral::control
