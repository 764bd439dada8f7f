// ResponsePlan: what a response *is*, decided once, before any protocol writes a byte of it.
//
// A route returns a Response: a description (text, JSON, a file to serve, a stream, a deferred
// or an upgrade, a redirect, a bare status) plus the headers it wants. Turning that into bytes
// takes decisions that have nothing to do with the wire: which status a file request really gets
// (200, 206, 304, 404, 416... from its conditional and Range headers), how long the body is and
// whether one is sent at all (HEAD, 204, 304), which defaults every response carries (Server,
// Date, Alt-Svc, nosniff, Referrer-Policy, the CSP of HTML pages), and which of the route's
// headers may go out. plan_response() takes all of them, for every protocol, and yields a plan:
//
//   status          the final status
//   fields          validated name/value pairs in the order they are sent, names as given (a
//                   protocol that needs lowercase lowers them); the protocol's own framing fields
//                   (Content-Length, Transfer-Encoding, Connection) go before fields[framing_at]
//   content_length  the body's length, or for HEAD the one a GET would have (none: 204/304/1xx,
//                   a stream of unknown length)
//   body            none, bytes (owned or static), a file (an open fd and its segments: ranges,
//                   multipart/byteranges framing), a stream producer, a deferred producer, an
//                   upgrade handler
//
// Each protocol then only serializes a plan: HTTP/1.1 (h1_writer.h) writes the status line,
// the fields and the framing (Content-Length, chunked, or close); HTTP/3 (quic/h3_mapping.h)
// lowercases the fields into nghttp3 name/value pairs and reads the body through a data reader.
// Neither walks the Response or judges a header: the rules live here once.
//
// Header rules (field_refused and route_field_sent in the .cc): a name that is empty, or a name or
// value with CR, LF or NUL, cannot be sent safely by any protocol: the whole response is refused
// and becomes a 500 (`refused_header` names it for the log). A pseudo-header name (":x") is
// dropped. Framing is the protocol's: a route's Transfer-Encoding and Content-Length are dropped (a
// HEAD response without a body announces the route's Content-Length instead of 0: a proxy relaying
// HEAD). The connection-specific fields Connection, Keep-Alive and Proxy-Connection are dropped,
// except Connection in an HTTP/1.1 101 (the switch needs it); Upgrade is dropped over HTTP/3 (RFC
// 9114 §4.2 makes all of them malformed there) and kept over HTTP/1.1 (a 101 and a 426 carry it).
//
// Cost: no allocation for a plain response (fields are views into the Response, the context and
// the plan; up to kInlineFields of them live inside the plan). Lifetime: a plan borrows from the
// Response and the PlanContext it was built from; use it while they live, and do not move it
// (it is neither copyable nor movable: its fields may point into its own storage). A plan is
// ~1.4 KiB: an HTTP/1.1 connection keeps one and reset()s it between responses instead of
// building one per response (the zeroing and the ResolvedFile cost more than the 5-byte
// response's head, bench/alloc_bench).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/file_response.h"
#include "http/request.h"
#include "http/response.h"

namespace corral::http {

// The field rules differ by protocol family; HTTP/2 would share HTTP/3's (RFC 9113 §8.2.2).
enum class Protocol : uint8_t { kHttp1, kHttp3 };

// What the plan needs besides the Response and the Request (method, Range and conditional
// headers, the CSP nonce): the connection's state and the server's defaults.
struct PlanContext {
  Protocol protocol = Protocol::kHttp1;
  // HTTP/1.1: the connection may stay open after this response (the request allowed it, the
  // server is not draining, the peer has not gone). Ignored by HTTP/3.
  bool keep_alive = true;
  std::string_view server_name = "corral";
  std::string_view date;
  std::string_view alt_svc;  // empty: no Alt-Svc field
  std::string_view referrer_policy = "strict-origin-when-cross-origin";
};

struct Field {
  std::string_view name;
  std::string_view value;
};

// The plan's fields: a small inline array, a vector only past kInlineFields (a proxied response
// with many headers).
class PlanFields {
 public:
  static constexpr size_t kInlineFields = 24;
  void add(std::string_view name, std::string_view value) {
    if (size_ < kInlineFields) {
      inline_[size_++] = {name, value};
      return;
    }
    add_overflow(name, value);
  }
  size_t size() const { return size_; }
  void clear() {
    size_ = 0;
    if (!overflow_.empty()) overflow_.clear();
  }
  const Field* begin() const { return overflow_.empty() ? inline_.data() : overflow_.data(); }
  const Field* end() const { return begin() + size_; }
  const Field& operator[](size_t i) const { return begin()[i]; }
  // The first field called `name` (case-insensitive).
  std::optional<std::string_view> find(std::string_view name) const;

 private:
  void add_overflow(std::string_view name, std::string_view value);
  std::array<Field, kInlineFields> inline_;
  std::vector<Field> overflow_;
  size_t size_ = 0;
};

enum class BodyKind : uint8_t { kNone, kBytes, kFile, kStream, kDeferred, kUpgrade };

// One piece of a file body: framing text (a multipart part's head, the closing delimiter) or a
// range of the open file.
struct FileSegment {
  std::string_view text;  // non-empty: these bytes (views into the ResolvedFile)
  uint64_t offset = 0;    // else: `length` bytes of the file from `offset`
  uint64_t length = 0;
};

// The body of a resolved file laid out as segments: the whole file, one range, or the parts of a
// multipart/byteranges body and its closing delimiter. Empty when there is no body to send.
std::vector<FileSegment> file_segments(const ResolvedFile& f);

class ResponsePlan {
 public:
  ResponsePlan() = default;
  ResponsePlan(const ResponsePlan&) = delete;
  ResponsePlan& operator=(const ResponsePlan&) = delete;

  int status = 200;
  PlanFields fields;
  size_t framing_at = 0;  // where a protocol's framing fields go
  std::optional<uint64_t> content_length;
  // Body bytes follow the head (or a stream is started): false for HEAD, 204, 304 and 1xx.
  bool send_body = false;
  // HTTP/1.1: the connection closes after this response (Connection: close). Never for a 101.
  bool close = false;
  BodyKind body = BodyKind::kNone;

  // kBytes: the body, either `owned_bytes` (moved out of the Response) or static text.
  std::string_view bytes;
  std::string owned_bytes;
  // kFile: what resolve_file() decided, its fd open (see file_segments()). For the other kinds
  // it still holds the resolver's headers the fields point at (a 304, a 404...).
  ResolvedFile file;
  std::unique_ptr<StreamProducer> producer;    // kStream (may be null: an empty body)
  std::unique_ptr<DeferredProducer> deferred;  // kDeferred: the head comes through a Responder
  std::unique_ptr<UpgradeHandler> upgrade;     // kUpgrade: the connection is handed over

  // Non-empty: the Response was refused for this header (a view into it) and the plan is a 500.
  std::string_view refused_header;

  // The body bytes as a string to keep: moved out of the plan when it owns them, else a copy.
  std::string take_bytes();

  // Back to a fresh plan, as constructed: what it still owns (a body string, the resolver's
  // file and headers, producers not taken) is released.
  void reset();

 private:
  friend void plan_response(Response& r, Request& req, const PlanContext& ctx, ResponsePlan& plan);
  bool file_used_ = false;                // `file` was resolved: reset() must clear it
  [[gnu::noinline]] void release_file();  // out of reset()'s common path
  // The default Content-Security-Policy of an HTML response, with the request's nonce.
  std::array<char, 256> csp_;  // not zeroed: only the bytes written are read
};

// Fills `plan` (a fresh one: constructed or reset()) from `r`: moves the body and its producers out
// of `r`, resolves a file against `req` (which also gets its CSP nonce for an HTML response). `r`'s
// headers stay in place: the plan's fields point at them.
void plan_response(Response& r, Request& req, const PlanContext& ctx, ResponsePlan& plan);

}  // namespace corral::http
