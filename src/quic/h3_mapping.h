// HTTP/3 <-> corral's request and response descriptions, without sockets (sans-IO, unit-tested):
//   - RequestHead collects one request's header fields as QPACK hands them over (pseudo-headers
//     by token) and turns them into an http::Request: :method, :path as the target (split into
//     path and query the way the HTTP/1.1 parser does), :authority as the Host header, every other
//     field as it came. A request that lacks a required pseudo-header is malformed (400); CONNECT
//     is let through to admission, which refuses it (501) like over TCP.
//   - H3Head serializes a ResponsePlan's head (the status, fields and length that
//     http::plan_response decided for every protocol) into nghttp3 name/value pairs.
// Lifetime: a RequestHead owns the bytes the Request's views point at; keep it alive (and do not
// add fields) while the Request is in use.
#pragma once

#include <nghttp3/nghttp3.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http/request.h"
#include "http/response_plan.h"

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

// The HTTP/3 head of a ResponsePlan (http/response_plan.h), as nghttp3 takes it: ":status", the
// plan's fields with their names lowercased (HTTP/3 forbids uppercase), and "content-length"
// where the plan has a length (where HTTP/1.1 writes its framing; HTTP/3 frames the body itself,
// the field tells the length ahead, RFC 9114 §4.1.2). No Transfer-Encoding or Connection: the plan
// already dropped what a route set of those. Owns the bytes the name/value pairs point at; nghttp3
// copies them on submit, so a head can be dropped right after.
class H3Head {
 public:
  explicit H3Head(const http::ResponsePlan& plan);
  H3Head(const H3Head&) = delete;
  H3Head& operator=(const H3Head&) = delete;

  const nghttp3_nv* data() const { return nva_.data(); }
  size_t size() const { return nva_.size(); }
  std::string_view name(size_t i) const;
  std::string_view value(size_t i) const;
  // The first field called `name` (exact: names are lowercase), for tests and logs.
  std::optional<std::string_view> field(std::string_view name) const;

 private:
  void add(std::string_view name, std::string_view value, bool lower);
  std::string bytes_;  // every name and value, reserved once: the pairs point into it
  std::vector<nghttp3_nv> nva_;
};

}  // namespace corral::quic
