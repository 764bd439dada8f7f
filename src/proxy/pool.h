// UpstreamPool: idle keep-alive connections to upstreams, per socket path, for one process's
// loop, and the batching of the requests of one loop round (send_soon). A pooled connection that
// the upstream closes is dropped as soon as the loop sees it; one that turns out dead when reused
// (closed before any response byte) is retried once on a fresh connection (proxy.cc).
//
// A connect to a Unix socket whose accept queue is full fails at once (EAGAIN): there is no
// waiting connect to come back to. Such a request waits here (wait_for_room), in order with the
// others for its path, and gets the next connection that can be had: one whose response ended
// (given back), or a connect tried again every kRoomRetryMs while any waits. How long it may wait
// is its caller's (proxy.cc: the response timeout).
//
// Lifetime: owns its idle connections; a busy one owns itself and comes back (give) when its last
// response ends. The pool must outlive the requests proxied through it (one per process, made
// before the server runs). Single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/event_loop.h"
#include "core/timer_wheel.h"
#include "proxy/upstream_connection.h"

namespace corral::proxy {

// A request waiting for room in its upstream's accept queue (UpstreamPool::wait_for_room). It
// leaves the wait by one of the calls below, or by stop_waiting.
class RoomWaiter {
 public:
  // A connection for it: a pooled one given back (`reused`), or a fresh one.
  virtual void on_room(std::unique_ptr<UpstreamConnection> c, bool reused) = 0;
  // A connect failed otherwise (the upstream went away).
  virtual void on_unreachable(std::string_view why) = 0;

 protected:
  ~RoomWaiter() = default;
};

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
  // behind (its upstream echoes Corral-Seq, fewer than kMaxPipeline in flight, its responses
  // faster than kFastMs), or null.
  UpstreamConnection* joinable(std::string_view path);
  // An idle connection saw an event (the upstream closed it, or sent what nobody asked for).
  void drop(UpstreamConnection* c);
  // The next Corral-Seq value (never 0): unique in this process, so an answer that echoes another
  // request's is never taken for this one's.
  uint64_t next_seq() { return ++seq_; }

  static constexpr uint32_t kRoomRetryMs = 10;
  // `w` waits for a connection to `path` (its connect found the accept queue full), behind those
  // already waiting. `w` must stop_waiting before it is destroyed, unless it was answered.
  void wait_for_room(std::string_view path, RoomWaiter& w);
  void stop_waiting(RoomWaiter& w);
  size_t waiting() const;

  struct Stats {
    uint64_t requests = 0;   // proxied through this pool
    uint64_t pipelined = 0;  // requests sent behind another on a connection
    uint64_t rescued = 0;    // of those, sent again elsewhere (behind a stream or a slow answer)
  };
  Stats& stats() { return stats_; }

 private:
  void retry_rooms();  // kRoomRetryMs: a connect for the first waiter of each path

  std::vector<UpstreamConnection*> to_send_, sending_;
  Stats stats_;
  uint64_t seq_ = 0;
  core::EventLoop& loop_;
  std::map<std::string, std::vector<std::unique_ptr<UpstreamConnection>>, std::less<>> idle_;
  std::map<std::string, std::deque<RoomWaiter*>, std::less<>> rooms_;  // waiters, per path
  core::Timer room_timer_;
};

}  // namespace corral::proxy
