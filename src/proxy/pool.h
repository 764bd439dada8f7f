// UpstreamPool: idle keep-alive connections to upstreams, per socket path, for one process's
// loop, and the batching of the requests of one loop round (send_soon). A pooled connection that
// the upstream closes is dropped as soon as the loop sees it; one that turns out dead when reused
// (closed before any response byte) is retried once on a fresh connection (proxy.cc).
//
// Lifetime: owns its idle connections; a busy one owns itself and comes back (give) when its last
// response ends. The pool must outlive the requests proxied through it (one per process, made
// before the server runs). Single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/event_loop.h"
#include "proxy/upstream_connection.h"

namespace corral::proxy {

class UpstreamPool {
 public:
  static constexpr size_t kMaxIdlePerPath = 32;
  static constexpr uint32_t kMaxPipeline = UpstreamConnection::kMaxPipeline;
  // Pipelining pays when responses are quick (the system calls saved are most of their cost);
  // behind slow ones a request would only wait, and risk kStallMs.
  static constexpr uint32_t kFastMs = 2;

  explicit UpstreamPool(core::EventLoop& loop);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  // An idle connection to `path` (registered with the loop, interest kIdleEvents), or null.
  std::unique_ptr<UpstreamConnection> take(const std::string& path);
  // `c` is idle and registered with interest kIdleEvents.
  void give(std::unique_ptr<UpstreamConnection> c);
  size_t idle() const;
  // `c` sends its requests after this loop round's dispatch: the requests of one round leave
  // together, and the upstream wakes once for them, not once each.
  void send_soon(UpstreamConnection* c);
  // A connection to `path` whose requests leave this round, that a GET or HEAD may be pipelined
  // behind (fewer than kMaxPipeline in flight, its responses faster than kFastMs), or null.
  UpstreamConnection* joinable(std::string_view path);
  // An idle connection saw an event (the upstream closed it, or sent what nobody asked for).
  void drop(UpstreamConnection* c);

  struct Stats {
    uint64_t requests = 0;   // proxied through this pool
    uint64_t pipelined = 0;  // requests sent behind another on a connection
    uint64_t rescued = 0;    // of those, sent again elsewhere (behind a stream or a slow answer)
  };
  Stats& stats() { return stats_; }

 private:
  std::vector<UpstreamConnection*> to_send_, sending_;
  Stats stats_;
  core::EventLoop& loop_;
  std::map<std::string, std::vector<std::unique_ptr<UpstreamConnection>>, std::less<>> idle_;
};

}  // namespace corral::proxy
