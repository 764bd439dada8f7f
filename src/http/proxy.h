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

#include <string>
#include <utility>
#include <vector>

#include "http/request.h"
#include "http/response.h"

namespace corral::http {

struct ProxyOptions {
  std::vector<std::pair<std::string, std::string>> add_headers;  // e.g. Corral-Remote-Address
  uint32_t response_timeout_ms = 60'000;  // until the upstream's response head
};

Response proxy_to(Request& req, std::string unix_path, ProxyOptions options = {});

}  // namespace corral::http
