#include "proxy/response_reader.h"

#include "http/request.h"
#include "http/text.h"

namespace corral::proxy {

namespace {
ResponseReader* reader(llhttp_t* p) {
  return static_cast<ResponseReader*>(p->data);
}
}  // namespace

ResponseReader::ResponseReader(DroppedHeader dropped) : dropped_(dropped) {
  llhttp_settings_init(&settings_);
  settings_.on_header_field = on_header_field;
  settings_.on_header_field_complete = on_header_field_complete;
  settings_.on_header_value = on_header_value;
  settings_.on_header_value_complete = on_header_value_complete;
  settings_.on_headers_complete = on_headers_complete;
  settings_.on_body = on_body;
  settings_.on_message_complete = on_message_complete;
  llhttp_init(&parser_, HTTP_RESPONSE, &settings_);
  parser_.data = this;
}

void ResponseReader::start(Events& events, bool head_request, bool upgrade_requested, uint64_t seq,
                           bool seq_required) {
  events_ = &events;
  head_request_ = head_request;
  upgrade_requested_ = upgrade_requested;
  seq_ = seq;
  seq_required_ = seq_required;
  seq_echoed_ = has_echo_ = false;
  echoed_.clear();
  codings_.clear();
  error_ = {};
  llhttp_init(&parser_, HTTP_RESPONSE, &settings_);  // no allocation: a struct reset
  parser_.data = this;
  head_.headers.clear();  // keeps its capacity for the next response
  head_.content_type.clear();
  head_.content_length.reset();
  head_.connection.clear();
  name_ = {};
  name_copy_.clear();
  interims_ = 0;
  head_bytes_ = 0;
  special_ = Special::kNone;
  keep_ = interim_ = switching_ = head_seen_ = complete_ = false;
}

ResponseReader::Fed ResponseReader::feed(const char* data, size_t n) {
  llhttp_errno_t err = llhttp_execute(&parser_, data, n);
  if (!name_.empty()) keep_name();  // a name cut by the end of this read
  if (switching_ && err == HPE_PAUSED_UPGRADE)
    return {State::kSwitched, static_cast<size_t>(llhttp_get_error_pos(&parser_) - data)};
  if (complete_) {
    size_t used =
        err == HPE_PAUSED ? static_cast<size_t>(llhttp_get_error_pos(&parser_) - data) : n;
    return {State::kComplete, used};
  }
  if (err != HPE_OK) {
    if (error_.empty()) error_ = "malformed upstream response";
    return {State::kError, n};
  }
  return {State::kMore, n};
}

ResponseReader::State ResponseReader::finish() {
  if (!head_seen_ || switching_) return complete_ ? State::kComplete : State::kError;
  if (!complete_ && llhttp_message_needs_eof(&parser_)) llhttp_finish(&parser_);
  if (complete_) return State::kComplete;
  if (error_.empty()) error_ = "upstream response cut short";
  return State::kError;
}

// A field's name is a view into the read buffer while it arrives in one piece (it nearly always
// does); one split across reads is copied (keep_name). Only the values of fields kept are stored.
int ResponseReader::on_header_field(llhttp_t* p, const char* at, size_t n) {
  auto* r = reader(p);
  if ((r->head_bytes_ += n) > kMaxHeadBytes) return -1;
  if (r->name_.empty()) {
    r->name_ = {at, n};
  } else {
    r->keep_name();
    r->name_copy_.append(at, n);
    r->name_ = r->name_copy_;
  }
  return 0;
}

// The fields whose values are kept apart: by length first, as fields.cc does (this runs for every
// field of every response).
int ResponseReader::on_header_field_complete(llhttp_t* p) {
  auto* r = reader(p);
  std::string_view name = r->name_;
  Special special = Special::kNone;
  if (name.size() == 12 && http::iequals(name, "content-type")) {
    special = Special::kType;
    r->head_.content_type.clear();
  } else if (name.size() == 10 && http::iequals(name, "connection")) {
    special = Special::kConnection;
    if (!r->head_.connection.empty()) r->head_.connection.push_back(',');
  } else if (name.size() == 10 && http::iequals(name, "corral-seq")) {
    special = Special::kSeq;  // never passed on: the proxy's business with its upstream
    r->echoed_.clear();
    r->has_echo_ = true;
  } else if (name.size() == 17 && http::iequals(name, "transfer-encoding")) {
    special = Special::kTransferEncoding;
    if (!r->codings_.empty()) r->codings_.push_back(',');
  }
  r->special_ = special;
  // An upgrade keeps all (but Content-Type, always apart), for a 101 that may come.
  r->keep_ = special != Special::kType && special != Special::kSeq &&
             (r->upgrade_requested_ || !r->dropped_ || !r->dropped_(name));
  if (r->keep_) r->head_.headers.emplace_back(name, std::string());
  return 0;
}

int ResponseReader::on_header_value(llhttp_t* p, const char* at, size_t n) {
  auto* r = reader(p);
  if ((r->head_bytes_ += n) > kMaxHeadBytes) return -1;
  if (r->keep_) r->head_.headers.back().second.append(at, n);
  switch (r->special_) {
    case Special::kNone:
      break;
    case Special::kType:
      r->head_.content_type.append(at, n);
      break;
    case Special::kConnection:
      r->head_.connection.append(at, n);
      break;
    case Special::kSeq:
      r->echoed_.append(at, n);
      break;
    case Special::kTransferEncoding:
      r->codings_.append(at, n);
      break;
  }
  return 0;
}

int ResponseReader::on_header_value_complete(llhttp_t* p) {
  auto* r = reader(p);
  r->name_ = {};
  r->name_copy_.clear();
  r->keep_ = false;
  r->special_ = Special::kNone;
  return 0;
}

namespace {

// Every comma-separated token of `codings` is "chunked" (an empty list too).
bool only_chunked(std::string_view codings) {
  while (!codings.empty()) {
    size_t comma = codings.find(',');
    std::string_view token = http::trim_ows(codings.substr(0, comma));
    if (!token.empty() && !http::iequals(token, "chunked")) return false;
    if (comma == std::string_view::npos) break;
    codings.remove_prefix(comma + 1);
  }
  return true;
}

// The decimal value of a Corral-Seq field; 0 (never a sequence number) when it is not one.
uint64_t seq_value(std::string_view v) {
  v = http::trim_ows(v);
  if (v.empty() || v.size() > 19) return 0;
  uint64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return 0;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  return n;
}

}  // namespace

int ResponseReader::final_head_error(const llhttp_t* p) {
  // The response must be its request's: the same Corral-Seq, or none on both sides (a request
  // without one cannot be answered with one: that answer was another request's).
  uint64_t echoed = has_echo_ ? seq_value(echoed_) : 0;
  seq_echoed_ = seq_ != 0 && echoed == seq_;
  if (has_echo_ ? !seq_echoed_ : seq_required_) {
    error_ = kNotItsResponse;
    return -1;
  }
  bool body = !head_request_ && p->status_code != 204 && p->status_code != 304;
  if (body && !codings_.empty() && !only_chunked(codings_)) {
    error_ = kTransferCoding;
    return -1;
  }
  return 0;
}

int ResponseReader::on_headers_complete(llhttp_t* p) {
  auto* r = reader(p);
  if (r->upgrade_requested_ && p->status_code == 101) {
    r->switching_ = true;
    r->head_seen_ = true;
    r->head_.status = 101;
    r->events_->on_head(r->head_);
    return 2;  // the rest is the upgraded protocol: llhttp pauses after the head
  }
  if (p->status_code == 101) return -1;  // a switch nobody asked for: malformed
  if (p->status_code < 200) {
    // An interim response (100 Continue, 102, 103 Early Hints; RFC 9110 §15.2): not the answer,
    // which follows on the same connection. A flood of them is malformed.
    r->head_.headers.clear();
    r->head_.content_type.clear();
    r->head_.connection.clear();
    r->echoed_.clear();
    r->codings_.clear();
    r->has_echo_ = false;
    r->interim_ = true;
    return ++r->interims_ > kMaxInterim ? -1 : 1;  // 1: a 1xx has no content, whatever it says
  }
  if (r->final_head_error(p) != 0) return -1;
  r->head_seen_ = true;
  r->head_.status = p->status_code;
  if (p->flags & F_CONTENT_LENGTH) r->head_.content_length = p->content_length;
  r->events_->on_head(r->head_);
  // A response to HEAD, a 204 and a 304 have no body, whatever their fields say (RFC 9112 §6.3):
  // llhttp would read a chunked one's.
  bool no_body = r->head_request_ || p->status_code == 204 || p->status_code == 304;
  return no_body ? 1 : 0;
}

int ResponseReader::on_body(llhttp_t* p, const char* at, size_t n) {
  reader(p)->events_->on_body({at, n});
  return 0;
}

int ResponseReader::on_message_complete(llhttp_t* p) {
  auto* r = reader(p);
  if (r->switching_) return 0;  // a 101 "completes" at once: the socket goes on
  if (r->interim_) {
    r->interim_ = false;
    return 0;  // the final response is parsed next
  }
  r->complete_ = true;
  // What follows is the next pipelined response, or nobody's: stop here.
  return static_cast<int>(HPE_PAUSED);
}

void ResponseReader::keep_name() {
  if (name_.data() != name_copy_.data()) {
    name_copy_.assign(name_);
    name_ = name_copy_;
  }
}

}  // namespace corral::proxy
