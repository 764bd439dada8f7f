#include "proxy/response_reader.h"

#include "http/request.h"

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

void ResponseReader::start(Events& events, bool head_request, bool upgrade_requested) {
  events_ = &events;
  head_request_ = head_request;
  upgrade_requested_ = upgrade_requested;
  llhttp_init(&parser_, HTTP_RESPONSE, &settings_);  // no allocation: a struct reset
  parser_.data = this;
  head_.headers.clear();  // keeps its capacity for the next response
  head_.content_type.clear();
  head_.content_length.reset();
  name_ = {};
  name_copy_.clear();
  interims_ = 0;
  head_bytes_ = 0;
  keep_ = is_type_ = interim_ = switching_ = head_seen_ = complete_ = false;
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
  if (err != HPE_OK) return {State::kError, n};
  return {State::kMore, n};
}

ResponseReader::State ResponseReader::finish() {
  if (!head_seen_ || switching_) return complete_ ? State::kComplete : State::kError;
  if (!complete_ && llhttp_message_needs_eof(&parser_)) llhttp_finish(&parser_);
  return complete_ ? State::kComplete : State::kError;
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

int ResponseReader::on_header_field_complete(llhttp_t* p) {
  auto* r = reader(p);
  r->is_type_ = http::iequals(r->name_, "content-type");
  r->keep_ = !r->is_type_ && (r->upgrade_requested_ || !r->dropped_ || !r->dropped_(r->name_));
  if (r->keep_) r->head_.headers.emplace_back(r->name_, std::string());  // an upgrade keeps all
  if (r->is_type_) r->head_.content_type.clear();
  return 0;
}

int ResponseReader::on_header_value(llhttp_t* p, const char* at, size_t n) {
  auto* r = reader(p);
  if ((r->head_bytes_ += n) > kMaxHeadBytes) return -1;
  if (r->keep_) {
    r->head_.headers.back().second.append(at, n);
  } else if (r->is_type_) {
    r->head_.content_type.append(at, n);
  }
  return 0;
}

int ResponseReader::on_header_value_complete(llhttp_t* p) {
  auto* r = reader(p);
  r->name_ = {};
  r->name_copy_.clear();
  r->keep_ = r->is_type_ = false;
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
    r->interim_ = true;
    return ++r->interims_ > kMaxInterim ? -1 : 1;  // 1: a 1xx has no content, whatever it says
  }
  r->head_seen_ = true;
  r->head_.status = p->status_code;
  if (p->flags & F_CONTENT_LENGTH) r->head_.content_length = p->content_length;
  r->events_->on_head(r->head_);
  return r->head_request_ ? 1 : 0;  // a response to HEAD has no body
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
