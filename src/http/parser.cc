#include "http/parser.h"

#include "http/text.h"

#include <algorithm>
#include <cstring>

namespace corral::http {

namespace {

RequestParser* self(llhttp_t* p) {
  return static_cast<RequestParser*>(p->data);
}

bool is_transfer_encoding(std::string_view name) {
  return name.size() == 17 && iequals(name, "transfer-encoding");
}

// Runs of head bytes with nothing to check are skipped before the byte-by-byte rules below see
// them: in the request line, any byte above SP but DEL; in a field value, any byte from SP up
// but DEL (obs-text, 0x80-0xff, passes both, as RFC 9110 §5.5 lets it); in a field name, tchars.
// The first two go eight bytes at a time, with the word tests of "a byte below `floor`" and "a
// byte equal to 0x7f" (each exact as a yes/no answer for the word), then a byte at a time from
// the word that has one. Each returns the first index in [i, end) it does not skip, `end` if
// none, or `i` if it is already at or past `end`.
template <unsigned char floor>
size_t skip_above(const char* p, size_t i, size_t end) {
  constexpr uint64_t kOnes = 0x0101010101010101, kHigh = 0x8080808080808080;
  while (i + 8 <= end) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    const uint64_t del = w ^ (kOnes * 0x7f);
    if ((((w - kOnes * floor) & ~w) | ((del - kOnes) & ~del)) & kHigh) break;
    i += 8;
  }
  while (i < end && static_cast<unsigned char>(p[i]) >= floor && p[i] != 0x7f) ++i;
  return i;
}

size_t skip_tchars(const char* p, size_t i, size_t end) {
  while (i < end && is_tchar(p[i])) ++i;
  return i;
}

}  // namespace

HeadScanner::Outcome HeadScanner::scan(std::string_view data, const ParserLimits& limits) {
  const size_t n = data.size();
  const size_t limit = std::min(n, limits.max_head_bytes);
  for (size_t i = pos_; i < n; ++i) {
    // Never past the head limit, nor, in the request line, past its own (the checks below then
    // see the byte that is over).
    if (request_line_) {
      // The request line is the first: it starts at 0.
      i = skip_above<0x21>(data.data(), i, std::min(limit, limits.max_request_line));
    } else if (colon_ != 0) {
      i = skip_above<0x20>(data.data(), i, limit);
    } else {
      i = skip_tchars(data.data(), i, limit);
    }
    if (i == n) break;
    // head_len <= max_head_bytes exactly, whatever the segmentation.
    if (i >= limits.max_head_bytes) return fail(431, "request head too large");
    const unsigned char c = static_cast<unsigned char>(data[i]);
    if (c == '\r') {
      if (i + 1 == n) {  // wait for the byte after CR
        pos_ = i;
        return {};
      }
      if (data[i + 1] != '\n') return fail(400, "bare CR in request head");
      continue;
    }
    if (c == '\n') {
      if (i == 0 || data[i - 1] != '\r') return fail(400, "bare LF in request head");
      const size_t line_len = i - 1 - line_start_;
      if (request_line_) {
        if (line_len == 0) return fail(400, "empty request line");
        if (line_len > limits.max_request_line) return fail(414, "request line too long");
        if (auto reason = version_error(data.substr(0, i - 1)); !reason.empty())
          return fail(400, reason);
        request_line_ = false;
      } else if (line_len == 0) {
        pos_ = i + 1;
        return {State::kComplete, 0, {}, i + 1};
      } else {
        const char first = data[line_start_];
        if (first == ' ' || first == '\t') return fail(400, "obs-fold in header");
        if (colon_ == 0) return fail(400, "header line without a colon");
        if (colon_ == line_start_) return fail(400, "empty header name");
        if (++headers_ > limits.max_headers) return fail(431, "too many header fields");
      }
      line_start_ = i + 1;
      colon_ = 0;
      continue;
    }
    if ((c < 0x20 && c != '\t') || c == 0x7f) return fail(400, "control character in request head");
    if (request_line_) {
      if (c == '\t') return fail(400, "tab in request line");
      if (i - line_start_ >= limits.max_request_line) return fail(414, "request line too long");
      // RFC 9112 §3: method SP request-target SP HTTP-version, one SP each. llhttp takes runs of
      // spaces as one and reads "GET /" as HTTP/0.9; a front end that splits the line otherwise
      // sees another request.
      if (c == ' ') {
        if (i == 0) return fail(400, "whitespace before the method");
        if (space1_ == 0) {
          space1_ = i;
        } else if (space2_ == 0) {
          if (i == space1_ + 1) return fail(400, "two spaces in request line");
          space2_ = i;
        } else {
          return fail(400, "extra space in request line");
        }
      }
    } else if (colon_ == 0) {
      if (c == ':') {
        colon_ = i;
        if (i > line_start_ && (data[i - 1] == ' ' || data[i - 1] == '\t'))
          return fail(400, "whitespace before colon");
      } else if (!is_tchar(static_cast<char>(c)) &&
                 !(i == line_start_ && (c == ' ' || c == '\t'))) {
        return fail(400, "invalid character in header name");
      }
    }
  }
  pos_ = n;
  if (n > limits.max_head_bytes) return fail(431, "request head too large");
  return {};
}

std::string_view HeadScanner::version_error(std::string_view line) const {
  if (space2_ == 0) return "request line without HTTP-version";  // "GET /" (HTTP/0.9 form)
  // RFC 9112 §2.3: HTTP-version = "HTTP" "/" DIGIT "." DIGIT, case-sensitive. A well-formed version
  // passes here; llhttp and check_head answer 505 for one other than 1.0 and 1.1.
  std::string_view v = line.substr(space2_ + 1);
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (v.size() != 8 || v.substr(0, 5) != "HTTP/" || !digit(v[5]) || v[6] != '.' || !digit(v[7]))
    return "malformed HTTP-version";
  return {};
}

RequestParser::RequestParser(const ParserLimits& limits) : limits_(limits) {
  llhttp_settings_init(&settings_);
  settings_.on_method = on_method;
  settings_.on_url = on_url;
  settings_.on_header_field = on_header_field;
  settings_.on_header_value = on_header_value;
  settings_.on_header_value_complete = [](llhttp_t* p) {
    auto* s = self(p);
    if (!s->head_done_) {
      auto& list = s->req_->headers.list();
      // on_header_value stored the value span in the last entry's value, or nothing for "".
      if (list.empty() || list.back().name.data() != s->pending_field_.data())
        s->req_->headers.add(s->pending_field_, {});
      if (is_transfer_encoding(s->pending_field_)) s->codings_.add_field(list.back().value);
    }
    return 0;
  };
  settings_.on_headers_complete = on_headers_complete;
  settings_.on_body = on_body;
  settings_.on_message_complete = on_message_complete;
  llhttp_init(&parser_, HTTP_REQUEST, &settings_);
  parser_.data = this;
}

int RequestParser::on_method(llhttp_t* p, const char* at, size_t len) {
  self(p)->req_->method_name = {at, len};
  return 0;
}

int RequestParser::on_url(llhttp_t* p, const char* at, size_t len) {
  auto* req = self(p)->req_;
  req->target = {at, len};
  auto q = req->target.find('?');
  req->path = req->target.substr(0, q);
  req->query = q == std::string_view::npos ? std::string_view{} : req->target.substr(q + 1);
  return 0;
}

int RequestParser::on_header_field(llhttp_t* p, const char* at, size_t len) {
  auto* s = self(p);
  if (!s->head_done_) s->pending_field_ = {at, len};
  return 0;
}

int RequestParser::on_header_value(llhttp_t* p, const char* at, size_t len) {
  auto* s = self(p);
  if (!s->head_done_) s->req_->headers.add(s->pending_field_, trim_ows({at, len}));
  return 0;
}

void RequestParser::TransferCodings::add_field(std::string_view value) {
  ++fields;
  bool any = false;
  while (!value.empty()) {
    auto comma = value.find(',');
    auto coding = trim_ows(value.substr(0, comma));
    value = comma == std::string_view::npos ? std::string_view{} : value.substr(comma + 1);
    if (coding.empty()) continue;  // RFC 9110 §5.6.1: empty list elements do not count
    any = true;
    chunked_last = iequals(coding, "chunked");
    if (chunked_last) {
      ++chunked;
    } else {
      unknown = true;
    }
  }
  if (!any) empty_field = true;
}

bool RequestParser::has_body() const {
  return (parser_.flags & F_CHUNKED) ||
         ((parser_.flags & F_CONTENT_LENGTH) && parser_.content_length);
}

int RequestParser::check_head() {
  Request& req = *req_;
  req.version_major = parser_.http_major;
  req.version_minor = parser_.http_minor;
  req.method = parse_method(req.method_name);
  if (parser_.http_major != 1 || parser_.http_minor > 1) {
    cb_status_ = 505;
    cb_reason_ = "unsupported HTTP version";
    return -1;
  }
  if (codings_.fields) {
    // RFC 9112 §6.1, §6.3: the body of a request with Transfer-Encoding is chunked, exactly once
    // and last, or its length cannot be known; 400 and close. A coding we do not know is 501.
    auto refuse = [this](int status, std::string_view reason) {
      cb_status_ = status;
      cb_reason_ = reason;
      return -1;
    };
    if (parser_.http_minor == 0) return refuse(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (codings_.empty_field) return refuse(400, "empty Transfer-Encoding");
    if (codings_.chunked > 1)
      return refuse(400, "chunked applied more than once in Transfer-Encoding");
    if (codings_.chunked && !codings_.chunked_last)
      return refuse(400, "chunked not the final coding in Transfer-Encoding");
    if (codings_.unknown) return refuse(501, "unsupported transfer coding");
    // Our reading and llhttp's must agree, or the body would be framed two ways.
    if (!(parser_.flags & F_CHUNKED)) return refuse(400, "invalid Transfer-Encoding");
    if (parser_.flags & F_CONTENT_LENGTH) {
      cb_status_ = 400;
      cb_reason_ = "Content-Length with Transfer-Encoding";
      return -1;
    }
  }
  max_body_ = limits_.max_body;
  if (rules_ && has_body()) {
    BodyRule rule = rules_->body_rule(req);
    max_body_ = rule.max_body;
    streaming_ = rule.stream;
  }
  if ((parser_.flags & F_CONTENT_LENGTH) && parser_.content_length > max_body_) {
    cb_status_ = 413;
    cb_reason_ = "request body too large";
    return -1;
  }
  if (auto expect = req.headers.get("expect")) {
    if (!iequals(*expect, "100-continue") || req.headers.count("expect") != 1) {
      cb_status_ = 417;
      cb_reason_ = "unsupported expectation";
      return -1;
    }
    // RFC 9110 §10.1.1: an HTTP/1.0 client's 100-continue is ignored (it cannot parse a 1xx).
    expect_continue_ = has_body() && req.version_minor >= 1;
  }
  return 0;
}

int RequestParser::on_headers_complete(llhttp_t* p) {
  auto* s = self(p);
  int r = s->check_head();
  s->head_done_ = true;
  if (r == 0 && (p->flags & F_CHUNKED)) {
    s->is_chunked_ = true;
    r = 1;  // "no body" for llhttp: ChunkedDecoder reads it (on_message_complete pauses first)
  } else if (r == 0 && s->streaming_) {
    s->stream_left_ = s->stream_length_ = p->content_length;
    r = 1;  // "no body" for llhttp: feed_body() counts it
  }
  // We never switch protocols here (WebSocket will take over before this point): without this,
  // llhttp reports the upgrade at the start of the next execute as a phantom empty message.
  p->upgrade = 0;
  return r;
}

int RequestParser::on_body(llhttp_t* p, const char* at, size_t len) {
  auto* s = self(p);
  if (s->body_.size() + len > s->max_body_) {
    s->cb_status_ = 413;
    s->cb_reason_ = "request body too large";
    return -1;
  }
  s->body_.append({at, len});
  return 0;
}

int RequestParser::on_message_complete(llhttp_t* p) {
  auto* s = self(p);
  if (!s->is_chunked_ && !s->streaming_) {
    s->complete_ = true;
    s->req_->body = s->body_.view();
  }
  return HPE_PAUSED;
}

RequestParser::Result RequestParser::error_from_llhttp(llhttp_errno_t err, std::string_view data) {
  Result r{Kind::kError, 0, 400, llhttp_get_error_reason(&parser_)};
  if (r.reason.empty()) r.reason = llhttp_errno_name(err);
  switch (err) {
    case HPE_CB_HEADERS_COMPLETE:
    case HPE_USER:
      if (cb_status_) {
        r.status = cb_status_;
        r.reason = cb_reason_;
      }
      break;
    default:
      if (cb_status_) {  // a callback refused (on_body's 413)
        r.status = cb_status_;
        r.reason = cb_reason_;
      } else if (err == HPE_INVALID_VERSION) {
        r.status = 505;
      } else if (err == HPE_INVALID_METHOD) {
        // A well-formed method token we do not know is 501; garbage is 400.
        auto sp = data.find(' ');
        std::string_view token = data.substr(0, sp);
        bool token_ok = sp != std::string_view::npos && sp > 0;
        for (char c : token) token_ok = token_ok && is_tchar(c);
        if (token_ok) {
          r.status = 501;
          r.reason = "method not implemented";
        }
      } else if (err == HPE_INVALID_TRANSFER_ENCODING) {
        // llhttp stops at a coding after chunked (in the same field or a later one): chunked
        // applied twice or not last, 400 either way (RFC 9112 §6.3). A head without chunked
        // reaches check_head first, which answers it.
        r.reason = "a coding after chunked in Transfer-Encoding";
      }
  }
  return r;
}

RequestParser::Result RequestParser::feed(std::string_view data, Request& req) {
  req_ = &req;
  const bool head_was_done = head_done_;
  if (!head_done_) {
    auto o = scanner_.scan(data, limits_);
    if (o.state == HeadScanner::State::kNeedMore) return {Kind::kNeedMore, 0, 0, {}};
    if (o.state == HeadScanner::State::kError) return {Kind::kError, 0, o.status, o.reason};
    head_len_ = o.head_len;
  }
  size_t off = 0;
  if (!in_chunked_body_) {
    llhttp_errno_t err = llhttp_execute(&parser_, data.data(), data.size());
    if (err == HPE_OK) return {head_was_done ? Kind::kNeedMore : Kind::kHead, data.size(), 0, {}};
    if (err != HPE_PAUSED) return error_from_llhttp(err, data);
    off = static_cast<size_t>(llhttp_get_error_pos(&parser_) - data.data());
    if (streaming_) return {Kind::kHead, off, 0, {}};  // the body: feed_body()
    if (!is_chunked_) return {Kind::kComplete, off, 0, {}};
    in_chunked_body_ = true;  // paused right after the head of a chunked request
  }
  auto c = chunked_.feed(data.substr(off), body_, max_body_, limits_.max_head_bytes);
  switch (c.state) {
    case ChunkedDecoder::State::kNeedMore:
      return {head_was_done ? Kind::kNeedMore : Kind::kHead, data.size(), 0, {}};
    case ChunkedDecoder::State::kError:
      return {Kind::kError, 0, c.status, c.reason};
    case ChunkedDecoder::State::kDone:
      break;
  }
  complete_ = true;
  req_->body = body_.view();
  return {Kind::kComplete, off + c.consumed, 0, {}};
}

RequestParser::BodyStep RequestParser::feed_body(std::string_view data) {
  using State = BodyStep::State;
  if (!is_chunked_) {
    size_t take = data.size() < stream_left_ ? data.size() : static_cast<size_t>(stream_left_);
    stream_left_ -= take;
    return {stream_left_ == 0 ? State::kDone : State::kMore, take, data.substr(0, take), 0, {}};
  }
  body_.clear();  // the previous piece was handed on
  auto c = chunked_.feed(data, body_, max_body_, limits_.max_head_bytes);
  switch (c.state) {
    case ChunkedDecoder::State::kNeedMore:
      return {State::kMore, data.size(), body_.view(), 0, {}};
    case ChunkedDecoder::State::kError:
      return {State::kError, c.consumed, {}, c.status, c.reason};
    case ChunkedDecoder::State::kDone:
      break;
  }
  complete_ = true;
  return {State::kDone, c.consumed, body_.view(), 0, {}};
}

void RequestParser::next_request() {
  if (llhttp_get_errno(&parser_) == HPE_PAUSED) llhttp_resume(&parser_);
  body_.clear();
  if (body_.capacity() > 256 * 1024) body_.release();  // do not keep a large body's storage
  scanner_.reset();
  pending_field_ = {};
  head_len_ = 0;
  head_done_ = complete_ = expect_continue_ = false;
  chunked_.reset();
  codings_ = {};
  is_chunked_ = in_chunked_body_ = streaming_ = false;
  stream_left_ = stream_length_ = 0;
  cb_status_ = 0;
  cb_reason_ = {};
}

}  // namespace corral::http
