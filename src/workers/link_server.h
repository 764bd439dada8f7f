// The supervisor's end of each server process's link: resolve requests are answered with the
// worker manager, reports are kept for the control API's GET /processes, and a process is told
// to forget an address whose socket it may have cached once that address stops being a running,
// unsuspended worker.
//
// Link messages (JSON, one per SEQPACKET packet). An address is bytes; in a message it is its wire
// form (core::wire_encode: '%' and what is not text as %XX, docs/worker-protocol.md), as it is in
// the Corral-Address header the worker gets. A handler's exception is logged and the message
// dropped: none reaches std::terminate.
//   server -> supervisor  {"type":"resolve","id":N,"address":"doc:42"}
//                         {"type":"report","quic":{...}}, {"type":"report","proxy":{...}}
//                         (every second: the process's own state for the control API's
//                         GET /processes; each report's keys replace the same keys of the last)
//   supervisor -> server  {"type":"resolved","id":N,"socket":"/state/sockets/doc%3A42.sock",
//                          "pid":P,"cold":true}  (the worker's pid; cold: the request waited
//                         for its start; link_codec.h)
//                         {"type":"refused","id":N,"status":503,"error":{"message":...}}
//                         (with "retryAfter":S when a bound refused it: Retry-After: S)
//                         {"type":"forget","address":"doc:42"}  (an address this process was
//                         given stopped being a running, unsuspended worker: drop its cached
//                         socket)
//
// Lifetime: serve_link sets the link's callbacks; what they share lives until the link closes.
// Single-threaded (the supervisor's loop).
#pragma once

#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/message_link.h"
#include "workers/manager.h"

namespace corral::workers {

// What each server process last reported over its link, by slot; an entry goes with its link.
struct ProcessReports {
  std::map<int, nlohmann::json> by_slot;
};

// Answers resolve requests from `link` with `*manager` (which must outlive the link or be null:
// then requests are refused).
void serve_link(core::MessageLink& link, Manager** manager, int slot = -1,
                std::shared_ptr<ProcessReports> reports = nullptr);

}  // namespace corral::workers
