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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "http/request.h"
#include "http/response.h"

namespace corral::http {

struct ProxyOptions {
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
