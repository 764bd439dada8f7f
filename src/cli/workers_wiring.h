// Wiring of workers into `corral serve`: the routes in each server process that proxy a kind's
// paths to the address's worker (resolving the address over the process's link to the
// supervisor), and the supervisor's side of that link (the worker manager answers).
//
// Link messages (JSON, one per SEQPACKET packet). An address is bytes; in a message it is its wire
// form (core::wire_encode: '%' and what is not text as %XX, docs/worker-protocol.md), as it is in
// the Corral-Address header the worker gets. A handler's exception is logged and the message
// dropped: none reaches std::terminate.
//   server -> supervisor  {"type":"resolve","id":N,"address":"doc:42"}
//                         {"type":"report","quic":{...}}, {"type":"report","proxy":{...}}
//                         (every second: the process's own state for the control API's
//                         GET /processes; each report's keys replace the same keys of the last)
//   supervisor -> server  {"type":"resolved","id":N,"socket":"/state/sockets/doc%3A42.sock"}
//                         {"type":"refused","id":N,"status":503,"error":{"message":...}}
//                         (with "retryAfter":S when a bound refused it: Retry-After: S)
//                         {"type":"forget","address":"doc:42"}  (an address this process was
//                         given stopped being a running, unsuspended worker: drop its cached
//                         socket)
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/config.h"
#include "core/message_link.h"
#include "http/response.h"
#include "http/site.h"
#include "proxy/proxy.h"
#include "workers/manager.h"

namespace corral::cli {

// The server process's end of the link: asks the supervisor for an address's worker socket.
class LinkResolver {
 public:
  using Answer = std::function<void(std::string path, std::optional<http::Response> instead)>;
  // A resolved address is remembered this long: requests to a running worker skip the round trip
  // to the supervisor. The supervisor sends "forget" when the worker stops, fails or is
  // suspended, and a connection that fails asks again (fresh), so a stale entry costs at most
  // one failed connect.
  static constexpr uint64_t kCacheMs = 1000;
  static constexpr size_t kCacheMax = 4096;

  LinkResolver(core::EventLoop& loop, core::UniqueFd fd);
  void resolve(const std::string& address, Answer answer, bool fresh = false);
  // A report of this process's state to the supervisor (see ProcessReports).
  void report(std::string message) { link_.send(std::move(message)); }
  // Resolve messages sent to the supervisor so far (the rest were answered from the cache).
  uint64_t sent() const { return sent_; }
  size_t cached() const { return cache_.size(); }

 private:
  void on_message(std::string_view message);
  struct Cached {
    std::string path;
    uint64_t until_ms;
  };
  core::EventLoop& loop_;
  std::map<std::string, Cached> cache_;
  core::MessageLink link_;
  uint64_t next_id_ = 1;
  uint64_t sent_ = 0;
  std::map<uint64_t, std::pair<std::string, Answer>> pending_;  // id -> address, answer
};

// Filled in each server process once its loop exists (the site is built before the fork).
struct ResolverSlot {
  LinkResolver* resolver = nullptr;
  proxy::UpstreamPool* pool = nullptr;  // keep-alive connections to this process's workers
};

// Routes for every kind's patterns: any method; the address is "<kind>:<param>[:<param>...]".
void add_worker_proxy_routes(http::SiteBuilder& site, const std::vector<WorkerKind>& kinds,
                             std::shared_ptr<ResolverSlot> slot);

std::vector<workers::KindConfig> kind_configs(const std::vector<WorkerKind>& kinds);

// The supervisor's end: answers resolve requests from `link` with `manager` (which must outlive
// the link or be null: then requests are refused).
// What each server process last reported over its link, by slot; an entry goes with its link.
struct ProcessReports {
  std::map<int, nlohmann::json> by_slot;
};
void serve_link(core::MessageLink& link, workers::Manager** manager, int slot = -1,
                std::shared_ptr<ProcessReports> reports = nullptr);

// A refusal as the client sees it: the status and {"error":{message, code?, reason?}}, with
// Retry-After when `retry_after_s` > 0 (a bound was reached: the same request may work later).
http::Response error_response(int status, const nlohmann::json& error, uint32_t retry_after_s = 0);

}  // namespace corral::cli
