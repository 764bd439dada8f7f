// A reverse proxy to an HTTP/1.1 upstream on a Unix socket (a worker's socket): the route returns
// proxy_to(req, path) and the response is the upstream's, streamed back with backpressure (the
// upstream is not read while the client's queue is full). Hop-by-hop headers are dropped both
// ways; `Corral-*` headers from the client are removed and the proxy's own are added, so the
// upstream can trust them (only the proxy reaches its socket). `Expect` is not passed on (the
// front answers the client's 100-continue itself and has the whole body before the route runs),
// and an upstream's interim responses (1xx other than a requested 101) are read past: the client
// gets the final response.
//
// Without a pool: one upstream connection per request (`Connection: close`). With one
// (ProxyOptions::pool): keep-alive connections, the requests of one loop round written together,
// and GET/HEAD pipelined behind each other (see Upstream in proxy.cc and docs/worker-protocol.md).
// Errors: the upstream cannot be reached or closes before its head: 502; no head within
// response_timeout: 504.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/event_loop.h"
#include "core/unique_fd.h"
#include "http/request.h"
#include "http/response.h"

namespace corral::http {

// Idle keep-alive connections to upstreams, per socket path, for one process's loop. A pooled
// connection that the upstream closes is dropped as soon as the loop sees it; one that turns out
// dead when reused (closed before any response byte) is retried once on a fresh connection.
class UpstreamPool {
 public:
  static constexpr size_t kMaxIdlePerPath = 32;
  static constexpr uint32_t kIdleEvents = EPOLLIN | EPOLLRDHUP;

  // One connection to an upstream socket. It is registered with the loop for its whole life with
  // itself as the handler: events go to its current user (the request in flight on it) or, while
  // it is idle in the pool, drop it. Moving between the pool and its users costs no epoll_ctl.
  struct Conn final : core::IoHandler {
    core::UniqueFd fd;
    core::IoHandler* user = nullptr;  // the request reading from it (the first in flight)
    UpstreamPool* pool = nullptr;     // set while idle in the pool
    std::string path;
    uint32_t interest = 0;  // as registered with the loop
    std::string out;        // requests not sent yet (from out_sent)
    size_t out_sent = 0;
    // Pipelining: requests in flight on it, in order; the last one (tail) is where another
    // joins. Only while `scheduled` (its requests not yet sent this round) and `pipelinable`
    // (every request on it is a GET or HEAD without a body).
    void* tail = nullptr;
    uint32_t depth = 0;
    bool pipelinable = false;
    bool scheduled = false;
    bool reusable = true;     // false: closed once its current response ends (after a rescue)
    uint32_t latency_x8 = 0;  // response times on it (request sent -> response ended), EWMA, ms*8
    void on_io(uint32_t events) override;
  };

  explicit UpstreamPool(core::EventLoop& loop);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  // An idle connection to `path` (registered with the loop, interest kIdleEvents), or null.
  std::unique_ptr<Conn> take(const std::string& path);
  // `c` is registered with the loop with interest kIdleEvents and has no user.
  void give(std::unique_ptr<Conn> c);
  size_t idle() const;
  // `c`'s user sends its request after this loop round's dispatch (its on_io(EPOLLOUT)): the
  // requests of one round leave together, and the upstream wakes once for them, not once each.
  void send_soon(Conn* c);
  // A connection to `path` whose requests leave this round, that a GET or HEAD may be pipelined
  // behind (fewer than kMaxPipeline in flight, its responses faster than kFastMs), or null.
  Conn* joinable(std::string_view path);
  static constexpr uint32_t kMaxPipeline = 8;
  // Pipelining pays when responses are quick (the system calls saved are most of their cost);
  // behind slow ones a request would only wait, and risk kStallMs.
  static constexpr uint32_t kFastMs = 2;
  // Requests pipelined behind a response that has not ended after this long are sent again on
  // other connections (they are GET or HEAD: safe to repeat), and that connection is not reused.
  static constexpr uint32_t kStallMs = 20;

  struct Stats {
    uint64_t requests = 0;   // proxied through this pool
    uint64_t pipelined = 0;  // requests sent behind another on a connection
    uint64_t rescued = 0;    // of those, sent again elsewhere (behind a stream or a slow answer)
  };
  Stats& stats() { return stats_; }

 private:
  void drop(Conn* c);
  std::vector<Conn*> to_send_, sending_;
  Stats stats_;
  core::EventLoop& loop_;
  std::map<std::string, std::vector<std::unique_ptr<Conn>>, std::less<>> idle_;
};

struct ProxyOptions {
  // null: one connection per request (Connection: close). Else keep-alive connections, and a
  // GET or HEAD without a body may be pipelined behind others of the same loop round.
  UpstreamPool* pool = nullptr;
  std::string extra_headers;  // added to the request: "Name: value\r\n" lines (add_header)
  ProxyOptions& add_header(std::string_view name, std::string_view value) {
    extra_headers.append(name).append(": ").append(value).append("\r\n");
    return *this;
  }
  uint32_t response_timeout_ms = 60'000;  // until the upstream's response head
  std::string target;  // the request target the upstream sees; empty: the client's
};

Response proxy_to(Request& req, std::string unix_path, ProxyOptions options = {});

// The upstream is found asynchronously (a worker that may have to start first): `find` is called
// when the response starts and answers once, with the upstream's socket path, or with the
// response to send instead (503 for a failed worker, 403, ...). The request is prepared at once
// (its bytes copied), so the route's Request may be gone by the time `find` answers.
using UpstreamAnswer = std::function<void(std::string path, std::optional<Response> instead)>;
// `again`: this request's previous upstream could not be reached or went away before answering
// (then a finder that caches should look afresh).
using UpstreamFinder = std::function<void(UpstreamAnswer answer, bool again)>;
Response proxy_found(Request& req, UpstreamFinder find, ProxyOptions options = {});

}  // namespace corral::http
