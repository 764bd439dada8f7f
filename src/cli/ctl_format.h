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
//   corral ctl workers: one row per address (issue 14: what holds a worker, and when its idle
//   stop comes)
//     ADDRESS  STATUS   PID   HOLDS                          IDLE STOP             DETAIL
//     doc:1    running  4242  requests=2 upgraded=1 busy=0   -
//     doc:2    running  4243  requests=0 upgraded=0 busy=0   2026-12-03T16:05:00Z
//     doc:3    failed   -     -                              -                     worker_exited:
//     ...
//   (IDLE STOP "-" while not idle; "(delayed)" after it when a connection waiting in the
//   worker's accept queue holds it past that time; HOLDS "-" for a worker that sends no counts;
//   DETAIL the version, the error of a failed address, "suspended", or when a start was queued).
#pragma once

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

}  // namespace corral::cli
