// A reverse proxy to an HTTP/1.1 upstream on a Unix socket (a worker's socket): the route returns
// proxy_to(req, path) and the response is the upstream's, streamed back with backpressure (the
// upstream is not read while the client's queue is full). Hop-by-hop headers are dropped both
// ways; `Corral-*` headers from the client are removed and the proxy's own are added, so the
// upstream can trust them (only the proxy reaches its socket).
//
// Today: one upstream connection per request (`Connection: close`), the request body sent from the
// parser's buffer. Errors: the upstream cannot be reached or closes before its head: 502; no head
// within response_timeout: 504.
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
  explicit UpstreamPool(core::EventLoop& loop);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  // An idle connection to `path`, or an invalid fd. A connection stays registered with the loop
  // while it moves between the pool and its users (they modify() it: one epoll_ctl, not two).
  core::UniqueFd take(const std::string& path);
  // `fd` is registered with the loop (by its user).
  void give(const std::string& path, core::UniqueFd fd);
  size_t idle() const;

 private:
  struct Idle;
  void drop(Idle* i);
  core::EventLoop& loop_;
  std::map<std::string, std::vector<std::unique_ptr<Idle>>> idle_;
};

struct ProxyOptions {
  UpstreamPool* pool = nullptr;  // null: one connection per request (Connection: close)
  std::vector<std::pair<std::string, std::string>> add_headers;  // e.g. Corral-Remote-Address
  uint32_t response_timeout_ms = 60'000;  // until the upstream's response head
  std::string target;  // the request target the upstream sees; empty: the client's
};

Response proxy_to(Request& req, std::string unix_path, ProxyOptions options = {});

// The upstream is found asynchronously (a worker that may have to start first): `find` is called
// when the response starts and answers once, with the upstream's socket path, or with the
// response to send instead (503 for a failed worker, 403, ...). The request is prepared at once
// (its bytes copied), so the route's Request may be gone by the time `find` answers.
using UpstreamAnswer = std::function<void(std::string path, std::optional<Response> instead)>;
using UpstreamFinder = std::function<void(UpstreamAnswer answer)>;
Response proxy_found(Request& req, UpstreamFinder find, ProxyOptions options = {});

}  // namespace corral::http
