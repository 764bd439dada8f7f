// Request: what a route sees. The connection parses a request head into views of its own input
// buffer (no copy, no allocation on the common path); the views live until the response to this
// request has been produced. Fields set by later stages are marked: admission (remote address,
// scheme, host), dispatch (params, principal, pattern). Reused per connection: reset() keeps the
// capacity of every vector and string.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace corral::core {
class EventLoop;
}

namespace corral::http {

class BodyStream;

enum class Method : uint8_t {
  kGet,
  kHead,
  kPost,
  kPut,
  kDelete,
  kPatch,
  kOptions,
  kTrace,
  kTrack,
  kConnect,
  kOther,
};
std::string_view method_name(Method m);
Method parse_method(std::string_view name);

bool iequals(std::string_view a, std::string_view b);

struct Header {
  std::string_view name;
  std::string_view value;
};

class Headers {
 public:
  void add(std::string_view name, std::string_view value) { list_.push_back({name, value}); }
  // The first value of `name` (case-insensitive), if any.
  std::optional<std::string_view> get(std::string_view name) const;
  size_t count(std::string_view name) const;
  // Whether the comma-separated values of `name` (every field of that name) list `token`,
  // compared case-insensitively, whole (RFC 9110 §5.6.1): "Connection: keep-alive, Upgrade" has
  // "upgrade"; "Connection: x-upgrade" does not.
  bool has_token(std::string_view name, std::string_view token) const;
  size_t size() const { return list_.size(); }
  bool empty() const { return list_.empty(); }
  void clear() { list_.clear(); }
  auto begin() const { return list_.begin(); }
  auto end() const { return list_.end(); }
  std::vector<Header>& list() { return list_; }

 private:
  std::vector<Header> list_;
};

struct Param {
  std::string_view name;  // points into the route pattern (lives as long as the router)
  std::string value;      // percent-decoded
};

// Who is making the request, as an authenticator decided. Anonymous requests have none.
struct Principal {
  std::string id;
  std::map<std::string, std::string> attributes;
};

struct Request {
  Method method = Method::kGet;
  std::string_view method_name;
  std::string_view target;  // as received, origin-form "/path?query"
  std::string_view path;    // raw path (still percent-encoded), the target before '?'
  std::string_view query;   // after '?', without it; empty if none
  uint8_t version_major = 1;
  uint8_t version_minor = 1;
  Headers headers;
  std::string_view body;  // the whole request body (bounded by the body limit)
  // A route with RouteOptions::stream_body (site.h), on an HTTP/1.1 connection, for a request that
  // has a body: the body in pieces (body_stream.h), and `body` stays empty. Null otherwise (no
  // body, a buffered route, HTTP/3, in-process calls): the body is whole in `body`.
  BodyStream* body_stream = nullptr;

  // Admission.
  std::string_view host;       // the Host header's value (or :authority), validated
  std::string remote_address;  // the peer's IP, or the client's IP a relay forwarded
  std::string_view scheme = "http";

  // Dispatch.
  std::string_view pattern;   // the matched route's pattern, "" if none matched
  std::vector<Param> params;  // from {name} segments, decoded
  std::string wildcard;       // what '*' matched, decoded per segment ("a/b%2Fc" -> "a/b/c" is
                              // never produced: a decoded "/" inside a segment is refused)
  std::optional<Principal> principal;

  // The event loop serving this request, for routes that produce a response asynchronously
  // (streams); null when the core function is called without a server.
  core::EventLoop* loop = nullptr;

  // This request's W3C traceparent (http/trace_context.h): the client's when valid, else one the
  // server made; "" before dispatch. trace_id() is its 32 hex digits.
  std::string_view traceparent() const { return {trace_, trace_len_}; }
  std::string_view trace_id() const { return trace_len_ ? traceparent().substr(3, 32) : ""; }
  void set_traceparent(std::string_view value);

  // What the access log says of a proxied request, beyond the request itself: set by the route
  // that proxies it (the worker's address) and by the proxy once a worker answered for it (its
  // pid, and whether it was started for this request). Kept by reset() for its capacity.
  struct Upstream {
    bool proxied = false;
    std::string address;
    int64_t worker_pid = 0;
    bool cold = false;
  };
  Upstream upstream;

  // The Content-Security-Policy nonce of this response, generated on first use. An HTML response
  // carries it in its CSP header; a route that renders inline scripts reads it here.
  std::string_view csp_nonce();
  bool has_csp_nonce() const { return nonce_len_ != 0; }

  std::string_view param(std::string_view name) const;
  std::optional<std::string_view> header(std::string_view name) const { return headers.get(name); }
  bool keep_alive_default() const { return version_minor >= 1; }

  void reset();
  // Moves every view that points into [old_base, old_base+len) to the same offset in new_base.
  void rebase(const char* old_base, size_t len, const char* new_base);

 private:
  char nonce_[24];
  uint8_t nonce_len_ = 0;
  char trace_[55];
  uint8_t trace_len_ = 0;
};

}  // namespace corral::http
