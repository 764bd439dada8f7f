// What `corral ctl rollout` and `corral ctl kinds` print (issue 13): the control API's JSON
// (control/rollout_routes.h) as tables a person reads. Pure functions, no I/O.
//
//   corral ctl rollout KIND: one row per worker, then a summary line
//     ADDRESS  RESULT     DETAIL
//     doc:1    reloaded   {"hello":"v2"}
//     doc:2    restarted
//     doc:3    stopped
//     doc:4    error      reload_failed: The reload failed.
//     doc: 3a4f5e6d7c8b (was 1a2b3c4d5e6f): 4 workers: 1 reloaded, 1 restarted, 1 stopped,
//     1 failed; 0 cleared; 35 ms
//   (the summary is one line; "(was none)" for a kind's first version, "no live worker was on
//   another version" when the table is empty).
//
//   corral ctl kinds: one row per kind
//     KIND  VERSION       DIRTY  ROLLING  WORKERS  STALE  KEPT
//     doc   3a4f5e6d7c8b  no     no       4        0      3a4f5e6d7c8b* 1a2b3c4d5e6f
//   (VERSION and KEPT "-" for a kind without code; '*' marks the current version in KEPT, newest
//   first).
//
//   corral ctl workers: one row per address (what holds a worker, and when its idle stop
//   comes)
//     ADDRESS  STATUS   PID   HOLDS                          IDLE STOP             DETAIL
//     doc:1    running  4242  requests=2 upgraded=1 busy=0   -
//     doc:2    running  4243  requests=0 upgraded=0 busy=0   2026-12-03T16:05:00Z
//     doc:3    failed   -     -                              -                     worker_exited:
//     ...
//   (IDLE STOP "-" while not idle; "(delayed)" after it when a connection waiting in the
//   worker's accept queue holds it past that time; HOLDS "-" for a worker that sends no counts;
//   DETAIL the version, the error of a failed address and where its output is, "suspended", or
//   when a start was queued).
//
//   corral ctl processes: the generation, one row per server process, then the draining ones
//     generation 3
//     SLOT  PID   CPU  GEN  STATUS   UPTIME  RESTARTS  LAST EXIT  BACKOFF
//     0     4242  0    3    running  1h02m   0         -          -
//     1     -     1    3    backoff  -       4         exit 3     800 ms
//
//     DRAINING  PID   GEN  STATUS    SINCE
//     0         4100  2    draining  12s
//
//   corral ctl retry|stop|suspend|resume ADDRESS: one line saying what happened, e.g.
//     doc:7: failure cleared; the next request starts its worker
//   and a refusal, on stderr, one line naming what failed and what to do:
//     corral: ctl retry doc:7: The address is neither failed nor suspended. (not_found, 404);
//     see: corral ctl workers
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace corral::cli {

// RESULT of one report entry: reloaded | restarted | stopped | error.
std::string rollout_result(const nlohmann::json& entry);
// The table and the summary line of a rollout report (POST /workers/kinds/{kind}/rollout).
std::string format_rollout(const nlohmann::json& report);
// The table of GET /workers/kinds.
std::string format_kinds(const nlohmann::json& kinds);
// The table of GET /workers.
std::string format_workers(const nlohmann::json& state);
// GET /processes: the generation line, the processes' table, the draining ones'; `now` (unix
// seconds) gives the uptimes.
std::string format_processes(const nlohmann::json& processes, int64_t now);
// A duration as a person reads it: 42s, 3m05s, 2h03m, 4d02h.
std::string format_duration(int64_t seconds);
// The line of an accepted retry|stop|suspend|resume ({address, entry}), with its newline.
std::string format_action(const std::string& verb, const nlohmann::json& answer);
// The one line (no newline) saying why the control API refused `what` (e.g. "ctl retry doc:7"):
// its {"error": {message, code}} (or the body as is), the status, and what to do next.
std::string format_refusal(const std::string& what, int status, const std::string& body);

}  // namespace corral::cli
