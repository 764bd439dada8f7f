// The HTTP/1.1 request parser: sans-IO glue around llhttp (Debian's node-llhttp) plus our own
// strict scan of the request head (RFC 9112). Bytes in, one request at a time out; no sockets, no
// timers.
//
// Why a scan of our own before llhttp: llhttp tolerates some forms RFC 9112 lets a server refuse
// and that smuggling relies on (bare LF line ends, obs-fold, runs of spaces in the request line,
// the versionless HTTP/0.9 form, a malformed HTTP-version it reports as unsupported), and it
// delivers header spans piecemeal when a head arrives in pieces. The scanner refuses those forms
// with the exact status, enforces the request-line, head-size and header-count limits as bytes
// arrive (so a slow or huge head is cut at the limit, not buffered), and hands llhttp only complete
// heads: every view llhttp reports then points into one contiguous buffer and the Request holds
// views, not copies.
//
// Transfer-Encoding is judged from the fields llhttp completes (TransferCodings below): llhttp
// lets an empty field through and frames such a body as if the field were absent.
//
// A framing error ends the connection: after kError the caller answers `status` and closes; no byte
// after the error is ever parsed as a request.
#pragma once

#include <llhttp.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/buffer.h"
#include "http/body_stream.h"
#include "http/chunked.h"
#include "http/request.h"

namespace corral::http {

// Asked once a request head with a body is parsed (before its Content-Length is judged): the
// body limit of the route the request goes to, and whether that route reads the body streamed.
class BodyRules {
 public:
  virtual BodyRule body_rule(Request& req) = 0;

 protected:
  ~BodyRules() = default;
};

struct ParserLimits {
  size_t max_request_line = 8 * 1024;   // 414 above
  size_t max_head_bytes = 32 * 1024;    // request line + headers; 431 above
  size_t max_headers = 100;             // 431 above
  uint64_t max_body = 8 * 1024 * 1024;  // 413 above
};

// Incremental strict scanner of one request head; remembers where it stopped.
class HeadScanner {
 public:
  enum class State { kNeedMore, kComplete, kError };
  struct Outcome {
    State state = State::kNeedMore;
    int status = 0;           // with kError: 400, 414, 431
    std::string_view reason;  // with kError: static text for the log
    size_t head_len = 0;      // with kComplete: bytes up to and including the empty line
  };
  // `data` is every byte of this request received so far (it grows between calls).
  Outcome scan(std::string_view data, const ParserLimits& limits);
  void reset() { *this = HeadScanner(); }

 private:
  Outcome fail(int status, std::string_view reason) { return {State::kError, status, reason, 0}; }
  // Why the complete request line (without CRLF) does not end in a well-formed HTTP-version, or
  // empty if it does.
  std::string_view version_error(std::string_view line) const;
  size_t pos_ = 0;         // next byte to look at
  size_t line_start_ = 0;  // start of the current line
  size_t colon_ = 0;       // position of the current header line's colon, 0 if none yet
  size_t headers_ = 0;
  size_t space1_ = 0;  // the request line's first and second SP, 0 until seen (never at 0)
  size_t space2_ = 0;
  bool request_line_ = true;
};

class RequestParser {
 public:
  enum class Kind {
    kNeedMore,  // all input consumed (or held back); read more
    kHead,      // the head is parsed into the request; the body (if any) follows
    kComplete,  // a whole request: req.body is set
    kError,     // answer `status` and close
  };
  struct Result {
    Kind kind = Kind::kNeedMore;
    size_t consumed = 0;  // bytes of the input consumed by this call
    int status = 0;
    std::string_view reason;
  };

  explicit RequestParser(const ParserLimits& limits);
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Parses from `data` (input not yet consumed) into `req`. Call again after kHead to continue into
  // the body, and after kComplete (once the request is answered) with next_request() first.
  // A streamed body (streaming() after kHead): feed() stops after the head (`consumed` is the
  // head's bytes) and the body is read with feed_body() instead.
  Result feed(std::string_view data, Request& req);

  // One step of a streamed body: `piece` is the body decoded from `data` (a view into `data` for
  // Content-Length, into the parser's own buffer for chunked, valid until the next call), and
  // `consumed` the bytes of `data` it took. kDone: the body ended (bytes after `consumed` are the
  // next request's); kError: answer `status` (400, 413) and close.
  struct BodyStep {
    enum class State { kMore, kDone, kError };
    State state = State::kMore;
    size_t consumed = 0;
    std::string_view piece;
    int status = 0;
    std::string_view reason;
  };
  BodyStep feed_body(std::string_view data);
  // Where the route's body rule comes from (null: limits.max_body, buffered).
  void set_body_rules(BodyRules* rules) { rules_ = rules; }
  bool streaming() const { return streaming_; }
  bool chunked() const { return is_chunked_; }
  // A streamed body's Content-Length (nullopt: chunked).
  std::optional<uint64_t> stream_length() const {
    if (is_chunked_) return std::nullopt;
    return stream_length_;
  }
  uint64_t max_body() const { return max_body_; }
  // Prepares for the next request on the same connection.
  void next_request();

  bool head_done() const { return head_done_; }
  bool keep_alive() const { return llhttp_should_keep_alive(&parser_) != 0; }
  bool expects_continue() const { return expect_continue_; }
  uint64_t content_length() const { return parser_.content_length; }
  bool has_body() const;
  // The body bytes received so far (owned by the parser, reused across requests).
  std::string_view body() const { return body_.view(); }
  size_t head_len() const { return head_len_; }
  void set_limits(const ParserLimits& limits) { limits_ = limits; }

 private:
  static int on_method(llhttp_t*, const char*, size_t);
  static int on_url(llhttp_t*, const char*, size_t);
  static int on_header_field(llhttp_t*, const char*, size_t);
  static int on_header_value(llhttp_t*, const char*, size_t);
  static int on_headers_complete(llhttp_t*);
  static int on_body(llhttp_t*, const char*, size_t);
  static int on_message_complete(llhttp_t*);
  Result error_from_llhttp(llhttp_errno_t err, std::string_view data);
  int check_head();

  // The codings the head's Transfer-Encoding fields apply, in order, gathered as llhttp completes
  // each field (so no second walk over the headers). llhttp alone lets an empty field through
  // (and then frames the body as if there were none).
  struct TransferCodings {
    size_t fields = 0;          // Transfer-Encoding fields seen (size_t: never wraps)
    size_t chunked = 0;         // times chunked is applied
    bool empty_field = false;   // a field with no coding at all ("", ",")
    bool chunked_last = false;  // the last coding so far is chunked
    bool unknown = false;       // a coding other than chunked
    void add_field(std::string_view value);
  };

  ParserLimits limits_;
  BodyRules* rules_ = nullptr;
  uint64_t max_body_ = 0;     // this request's (the route's rule, else limits_.max_body)
  uint64_t stream_left_ = 0;  // a streamed Content-Length body: bytes still to come
  uint64_t stream_length_ = 0;
  bool streaming_ = false;
  llhttp_settings_t settings_;
  llhttp_t parser_;
  HeadScanner scanner_;
  core::Buffer body_;
  Request* req_ = nullptr;
  std::string_view pending_field_;
  // Chunked bodies are decoded by ChunkedDecoder, not llhttp (see chunked.h): llhttp is told the
  // message has no body and pauses after the head.
  ChunkedDecoder chunked_;
  TransferCodings codings_;
  bool is_chunked_ = false;
  bool in_chunked_body_ = false;
  size_t head_len_ = 0;
  bool head_done_ = false;
  bool complete_ = false;
  bool expect_continue_ = false;
  int cb_status_ = 0;
  std::string_view cb_reason_;
};

}  // namespace corral::http
