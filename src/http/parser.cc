#include "http/parser.h"

#include "http/text.h"

#include <cstring>

namespace corral::http {

namespace {

RequestParser* self(llhttp_t* p) {
  return static_cast<RequestParser*>(p->data);
}

}  // namespace

HeadScanner::Outcome HeadScanner::scan(std::string_view data, const ParserLimits& limits) {
  const size_t n = data.size();
  for (size_t i = pos_; i < n; ++i) {
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
  if (parser_.flags & F_TRANSFER_ENCODING) {
    if (parser_.http_minor == 0) {
      cb_status_ = 400;
      cb_reason_ = "Transfer-Encoding in an HTTP/1.0 request";
      return -1;
    }
    int chunked = 0;
    for (const auto& h : req.headers) {
      if (!iequals(h.name, "transfer-encoding")) continue;
      std::string_view v = h.value;
      while (!v.empty()) {
        auto comma = v.find(',');
        auto token = trim_ows(v.substr(0, comma));
        v = comma == std::string_view::npos ? std::string_view{} : v.substr(comma + 1);
        if (token.empty()) continue;
        if (!iequals(token, "chunked")) {
          cb_status_ = 501;
          cb_reason_ = "unsupported transfer coding";
          return -1;
        }
        ++chunked;
      }
    }
    if (chunked != 1) {
      cb_status_ = 400;
      cb_reason_ = "invalid Transfer-Encoding";
      return -1;
    }
    if (parser_.flags & F_CONTENT_LENGTH) {
      cb_status_ = 400;
      cb_reason_ = "Content-Length with Transfer-Encoding";
      return -1;
    }
  }
  if ((parser_.flags & F_CONTENT_LENGTH) && parser_.content_length > limits_.max_body) {
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
  }
  // We never switch protocols here (WebSocket will take over before this point): without this,
  // llhttp reports the upgrade at the start of the next execute as a phantom empty message.
  p->upgrade = 0;
  return r;
}

int RequestParser::on_body(llhttp_t* p, const char* at, size_t len) {
  auto* s = self(p);
  if (s->body_.size() + len > s->limits_.max_body) {
    s->cb_status_ = 413;
    s->cb_reason_ = "request body too large";
    return -1;
  }
  s->body_.append({at, len});
  return 0;
}

int RequestParser::on_message_complete(llhttp_t* p) {
  auto* s = self(p);
  if (!s->is_chunked_) {
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
        for (const auto& h : req_->headers) {
          if (!iequals(h.name, "transfer-encoding")) continue;
          auto v = trim_ows(h.value);
          auto last = v.rfind(',');
          auto token = trim_ows(last == std::string_view::npos ? v : v.substr(last + 1));
          if (!iequals(token, "chunked")) {
            r.status = 501;
            r.reason = "unsupported transfer coding";
          }
        }
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
    if (!is_chunked_) return {Kind::kComplete, off, 0, {}};
    in_chunked_body_ = true;  // paused right after the head of a chunked request
  }
  auto c = chunked_.feed(data.substr(off), body_, limits_.max_body, limits_.max_head_bytes);
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

void RequestParser::next_request() {
  if (llhttp_get_errno(&parser_) == HPE_PAUSED) llhttp_resume(&parser_);
  body_.clear();
  if (body_.capacity() > 256 * 1024) body_.release();  // do not keep a large body's storage
  scanner_.reset();
  pending_field_ = {};
  head_len_ = 0;
  head_done_ = complete_ = expect_continue_ = false;
  chunked_.reset();
  is_chunked_ = in_chunked_body_ = false;
  cb_status_ = 0;
  cb_reason_ = {};
}

}  // namespace corral::http
