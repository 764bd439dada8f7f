// Connection's side of a streamed request body (body_stream.h): the route's rule asked by the
// parser, the BodyStream the route's consumer reads, and the pump that hands pieces over while
// the consumer takes them. The rest of the connection is connection.cc.
#include "http/connection.h"
#include "http/server.h"
#include "http/site.h"

namespace corral::http {

BodyRule Connection::body_rule(Request& req) {
  const uint64_t limit = server_.options().limits.max_body;
  const auto& site = server_.site();
  if (!site) return {limit, false};  // parked until one is published: buffered
  return site->body_rule(req, limit);
}

void Connection::start_body_stream() {
  body_state_ = BodyState::kOpen;
  body_consumer_ = nullptr;
  body_delivered_ = 0;
  body_paused_ = body_resumed_ = false;
  req_.body_stream = this;
  read_timer_.cancel();  // nothing is read before a consumer asks
  read_timer_kind_ = ReadTimer::kNone;
  dispatch();  // the route runs now
  if (closed_) return;
  update_interest();
}

void Connection::read(BodyConsumer* consumer) {
  if (closed_ || body_state_ != BodyState::kOpen) return;
  body_consumer_ = consumer;
  if (!consumer) {
    if (read_timer_kind_ == ReadTimer::kBody) {
      read_timer_.cancel();
      read_timer_kind_ = ReadTimer::kNone;
    }
    update_interest();
    return;
  }
  // RFC 9110 §10.1.1: the 100 goes out when the body is asked for, not before: a route that
  // answers first (403, 413) never invites it.
  if (parser_.expects_continue() && !continue_sent_ && !head_out_) {
    continue_sent_ = true;
    out_.append("HTTP/1.1 100 Continue\r\n\r\n");
  }
  schedule_body_pump();
}

void Connection::resume() {
  if (closed_ || body_state_ != BodyState::kOpen) return;
  if (body_in_callback_) {
    body_resumed_ = true;  // on_body_data's false that follows does not pause
    return;
  }
  if (!body_paused_) return;
  body_paused_ = false;
  schedule_body_pump();
}

std::optional<uint64_t> Connection::length() const {
  return parser_.stream_length();
}

void Connection::schedule_body_pump() {
  if (body_pump_scheduled_) return;
  body_pump_scheduled_ = true;
  loop_.defer([this] {
    body_pump_scheduled_ = false;
    if (closed_) return;
    pump_body();
    if (!closed_) flush();
  });
}

// Hands what in_ holds of the body to the consumer while it takes it; reading the socket waits
// for the consumer (update_interest).
void Connection::pump_body() {
  while (!closed_ && body_state_ == BodyState::kOpen && body_consumer_ && !body_paused_ &&
         !in_.empty()) {
    auto step = parser_.feed_body(in_.view());
    if (step.state == RequestParser::BodyStep::State::kError)
      return fail_body(step.status, step.reason);
    if (!step.piece.empty()) {
      body_delivered_ += step.piece.size();
      body_in_callback_ = true;
      body_resumed_ = false;
      bool more = body_consumer_->on_body_data(step.piece);  // the piece views in_ or the parser
      body_in_callback_ = false;
      if (closed_) return;
      if (!more && !body_resumed_) body_paused_ = true;
    }
    in_.consume(step.consumed);
    if (step.state == RequestParser::BodyStep::State::kDone && body_state_ == BodyState::kOpen) {
      body_state_ = BodyState::kNone;
      BodyConsumer* c = body_consumer_;
      body_consumer_ = nullptr;
      if (read_timer_kind_ == ReadTimer::kBody) {
        read_timer_.cancel();
        read_timer_kind_ = ReadTimer::kNone;
      }
      if (c) c->on_body_end();
      if (closed_) return;
      update_interest();
      return;
    }
  }
  if (closed_) return;
  if (body_state_ == BodyState::kOpen && body_consumer_ && !body_paused_) {
    // Waiting for the client: the body timeout runs between its bytes.
    arm_read_timer(ReadTimer::kBody, server_.options().body_timeout_ms);
  } else if (read_timer_kind_ == ReadTimer::kBody) {
    read_timer_.cancel();  // waiting for the consumer is not the client's delay
    read_timer_kind_ = ReadTimer::kNone;
  }
  update_interest();
}

void Connection::abandon_body(std::string_view why) {
  if (body_state_ != BodyState::kOpen) return;
  body_state_ = BodyState::kNone;
  close_after_write_ = true;  // the rest of the body is never parsed as a request
  BodyConsumer* c = body_consumer_;
  body_consumer_ = nullptr;
  if (read_timer_kind_ == ReadTimer::kBody) {
    read_timer_.cancel();
    read_timer_kind_ = ReadTimer::kNone;
  }
  if (c) c->on_body_abort(why);
}

void Connection::fail_body(int status, std::string_view why) {
  abandon_body(why);
  if (closed_) return;
  in_.clear();  // nothing after a framing error is ever parsed
  if (head_out_) {
    // The response has begun: there is no answering the error, only ending the connection.
    ++server_.stats_.errors;
    server_.log().info("request_refused", "remote={} status={} reason=\"{}\"", peer_ip_, status,
                       why);
    abort_stream();
    close_now();
    return;
  }
  respond_error(status, why);
}

}  // namespace corral::http
