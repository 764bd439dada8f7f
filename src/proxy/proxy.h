// A reverse proxy to an HTTP/1.1 upstream on a Unix socket (a worker's socket): the route returns
// proxy_to(req, path) and the response is the upstream's, streamed back with backpressure (the
// upstream is not read while the client's queue is full). Hop-by-hop headers are dropped both
// ways; `Corral-*` headers from the client are removed and the proxy's own are added, so the
// upstream can trust them (only the proxy reaches its socket). `Expect` is not passed on (the
// front answers the client's 100-continue itself: before reading a buffered body, or when a
// streamed body is first asked for), and an upstream's interim responses (1xx other than a
// requested 101) are read past: the client gets the final response.
//
// A streamed request body (Request::body_stream, a route with RouteOptions::stream_body): the
// head goes upstream with the client's Content-Length, or `Transfer-Encoding: chunked` (the body
// re-chunked piece by piece), then the body as it comes, with backpressure both ways (the client
// is not read while the upstream socket has kBodyHighWater unsent; the response side has its
// own). Its end is passed on; the client's departure (or a refused body) closes the upstream
// connection, so the upstream sees its request cut. Such a request is never pipelined, its
// connection never reused before the body ended, and it is never sent again once a body byte
// left (a body cannot be replayed); the response timeout runs from the last body byte.
//
// Without a pool: one upstream connection per request (`Connection: close`). With one
// (ProxyOptions::pool): keep-alive connections, the requests of one loop round written together,
// and GET/HEAD pipelined behind each other (UpstreamConnection, docs/worker-protocol.md).
// A response is only ever matched to the request it answers (upstream_connection.h): a byte
// read before a request left, or after the last response on a connection, is nobody's answer
// and closes that connection; a response to HEAD, a 204 and a 304 end at their head, whatever
// follows; a pipelined request's answer must echo its Corral-Seq. The requests not yet answered
// on a connection closed so are sent again under the rules below (those pipelined are GET or
// HEAD). A body the upstream cuts short (it closes mid-chunk, before the last chunk, or short of
// its Content-Length; or sends what is no body) is cut for the client too
// (http::StreamWriter::abort): never a complete message. Fields a Connection field names are
// hop-by-hop both ways; a transfer coding other than chunked is a 502 (decoded by nobody).
// A connect that finds the upstream's accept queue full waits for room (pool.h) until the
// response timeout, then 503 with Retry-After (ProxyOptions::on_busy).
// Errors: the upstream cannot be reached or closes before its head: 502; no head within
// response_timeout: 504. Sent again before that, once: a GET, HEAD or OPTIONS, and any request
// the upstream provably did not read (the connect failed, EPIPE on the write, ECONNRESET on the
// read: Exchange::unread); never a request it may have acted on (docs/worker-protocol.md). The
// parts: pool.h (idle connections, the round's batch), upstream_connection.h (a connection and its
// queue of exchanges), response_reader.h (the sans-IO response reader), relay.h (upgraded
// connections); this file rewrites the request, retries and answers.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "http/request.h"
#include "http/response.h"
#include "proxy/pool.h"

namespace corral::proxy {

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
  // No head within response_timeout_ms: the response the client gets instead of the bare 504
  // (called once, on the loop, with the request's method and `label`; a caller logs there).
  // Unset: 504 with Corral-Proxy-Error. The request's own facts come as arguments so that a
  // caller's closure holds only what is the same for every request: one of a reference and an
  // integer is kept inside the std::function, with no allocation per request.
  std::function<http::Response(std::string_view method, std::string_view label)> on_timeout;
  // The upstream's accept queue stayed full until the response timeout (the request never left):
  // the response instead of the bare 503 with Retry-After: 1 (as on_timeout, called once).
  std::function<http::Response(std::string_view method, std::string_view label)> on_busy;
  std::string target;  // the request target the upstream sees; empty: the client's
  // What the caller names this request's upstream by (a worker's address): given to the finder
  // (proxy_found) and to on_timeout, so neither has to carry a copy of its own.
  std::string label;
};

http::Response proxy_to(http::Request& req, std::string unix_path, ProxyOptions options = {});

// What a finder may say of the process behind the socket it found, for the access log: its pid
// (0: unknown) and whether the request waited for it to start.
struct UpstreamProcess {
  int64_t pid = 0;
  bool cold = false;
};

// The upstream is found asynchronously (a worker that may have to start first): `find` is called
// when the response starts and answers once, with the upstream's socket path, or with the
// response to send instead (503 for a failed worker, 403, ...). The request is prepared at once
// (its bytes copied), so the route's Request may be gone by the time `find` answers, all but its
// `upstream`: the process the answer names is written there (worker_pid; cold once any answer
// for the request was cold) while the response has not started, so that Request must live until
// the response ends (a server's connection and stream keep theirs).
// The answer is a handle to the request waiting for it: copying one copies a reference (no
// allocation per request), calling one after its request is gone does nothing.
class UpstreamAnswer {
 public:
  struct Waiting;  // the request's side (proxy.cc)
  UpstreamAnswer() = default;
  explicit UpstreamAnswer(std::shared_ptr<Waiting> waiting) : waiting_(std::move(waiting)) {}
  void operator()(std::string path, std::optional<http::Response> instead,
                  UpstreamProcess process = {}) const;
  explicit operator bool() const { return waiting_ != nullptr; }

 private:
  std::shared_ptr<Waiting> waiting_;
};
// `label`: ProxyOptions::label. `again`: this request's previous upstream could not be reached or
// went away before answering (then a finder that caches should look afresh).
using UpstreamFinder =
    std::function<void(const std::string& label, UpstreamAnswer answer, bool again)>;
http::Response proxy_found(http::Request& req, UpstreamFinder find, ProxyOptions options = {});

}  // namespace corral::proxy
