// HTTP/3 <-> corral's request and response descriptions, without sockets (sans-IO, unit-tested):
//   - RequestHead collects one request's header fields as QPACK hands them over (pseudo-headers
//     by token) and turns them into an http::Request: :method, :path as the target (split into
//     path and query the way the HTTP/1.1 parser does), :authority as the Host header, every other
//     field as it came. A request that lacks a required pseudo-header is malformed (400); CONNECT
//     is let through to admission, which refuses it (501) like over TCP.
//   - response_head() lays out the HTTP/3 field list of a response: :status first, then the same
//     defaults the HTTP/1.1 connection adds (server, date, content-type, content-length, nosniff,
//     referrer-policy, the CSP nonce header of HTML) and the route's headers, lowercased (HTTP/3
//     forbids uppercase names), minus connection-specific fields that HTTP/3 forbids.
// Lifetime: a RequestHead owns the bytes the Request's views point at; keep it alive (and do not
// add fields) while the Request is in use.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http/file_response.h"
#include "http/request.h"
#include "http/response.h"

namespace corral::quic {

class RequestHead {
 public:
  enum class Pseudo { kNone, kMethod, kScheme, kAuthority, kPath, kProtocol, kUnknown };

  // One field. `pseudo` tells which pseudo-header it is (kNone: a regular field).
  void add(Pseudo pseudo, std::string_view name, std::string_view value);
  size_t field_bytes() const { return bytes_; }
  size_t field_count() const { return regular_.size(); }
  // The first regular field called `name` (case-insensitive).
  std::optional<std::string_view> field(std::string_view name) const;

  // Fills `req` (views into this object). Returns 0, or the status to answer: 400 for a
  // malformed request (missing/duplicated pseudo-headers, a pseudo-header after a regular
  // one, an unknown pseudo-header), 431 above the limits.
  struct Limits {
    size_t max_bytes = 32 * 1024;
    size_t max_fields = 100;
  };
  int build(http::Request& req, const Limits& limits) const;
  std::string_view reason() const { return reason_; }

 private:
  std::deque<std::string> storage_;  // deque: growing never moves earlier strings
  std::string_view method_, scheme_, authority_, path_;
  std::vector<std::pair<std::string_view, std::string_view>> regular_;
  size_t bytes_ = 0;
  int duplicates_ = 0;
  bool unknown_pseudo_ = false;
  bool pseudo_after_regular_ = false;
  mutable std::string_view reason_;
};

// What the HTTP/1.1 connection adds to every response (ServerOptions).
struct HeadDefaults {
  std::string_view server_name = "corral";
  std::string_view date;
  std::string_view referrer_policy = "strict-origin-when-cross-origin";
};

using FieldList = std::vector<std::pair<std::string, std::string>>;

// `length` < 0: no content-length (a stream of unknown length, 204/304). `csp_nonce` non-empty:
// an HTML response gets the CSP header unless the route set one. `extra` are the file resolver's
// headers (ETag, Content-Range, ...).
void response_head(int status, const http::Response& r, std::string_view content_type,
                   int64_t length, const FieldList* extra, std::string_view csp_nonce,
                   const HeadDefaults& d, FieldList& out);

// A file response laid out for HTTP/3: the head to send and the body as segments, either framing
// text (multipart part heads, the closing delimiter) or a range of the open file. Mirrors what
// the HTTP/1.1 connection does with a ResolvedFile (404/403 get a short text body, 416 none,
// 304 no length, HEAD the length a GET would have and no body).
struct BodySegment {
  std::string text;     // non-empty: send these bytes
  uint64_t offset = 0;  // else: `length` bytes of the file from `offset`
  uint64_t length = 0;
};
struct FilePlan {
  int status = 200;
  std::string content_type;
  int64_t length = -1;  // content-length, or -1 for none
  FieldList extra;      // the resolver's headers (and Location)
  std::vector<BodySegment> segments;
  bool has_body = false;
};
FilePlan plan_file(const http::ResolvedFile& f, bool head_only);

// Whether a route's header may go out over HTTP/3 (name and value free of CR/LF/NUL, not a
// connection-specific field).
bool h3_header_allowed(std::string_view name, std::string_view value);

}  // namespace corral::quic
