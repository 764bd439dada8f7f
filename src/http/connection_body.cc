// Connection's side of a streamed request body (body_stream.h): the route's rule asked by the
// parser, and the pump that hands pieces to the exchange's consumer (the BodyStream it reads is
// the Exchange's) while it takes them. The rest of the connection is connection.cc.
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
  exchange_.open_body();
  read_timer_.cancel();  // nothing is read before a consumer asks
  read_timer_kind_ = ReadTimer::kNone;
  dispatch();  // the route runs now
  if (closed_) return;
  update_interest();
}

void Connection::cancel_body_timer() {
  if (read_timer_kind_ == ReadTimer::kBody) {
    read_timer_.cancel();
    read_timer_kind_ = ReadTimer::kNone;
  }
}

void Connection::request_body_wanted() {
  if (closed_) return;
  // RFC 9110 §10.1.1: the 100 goes out when the body is asked for, not before: a route that
  // answers first (403, 413) never invites it.
  if (parser_.expects_continue() && !continue_sent_ && !exchange_.head_out()) {
    continue_sent_ = true;
    out_.append("HTTP/1.1 100 Continue\r\n\r\n");
  }
  schedule_body_pump();
}

void Connection::request_body_detached() {
  if (closed_) return;
  cancel_body_timer();
  update_interest();
}

void Connection::request_body_abandoned() {
  close_after_write_ = true;  // the rest of the body is never parsed as a request
  cancel_body_timer();
}

std::optional<uint64_t> Connection::request_body_length() const {
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
  while (!closed_ && exchange_.body_flowing() && !in_.empty()) {
    auto step = parser_.feed_body(in_.view());
    if (step.state == RequestParser::BodyStep::State::kError)
      return fail_body(step.status, step.reason);
    if (!step.piece.empty()) {
      exchange_.deliver_body(step.piece);  // the piece views in_ or the parser
      if (closed_) return;
    }
    in_.consume(step.consumed);
    if (step.state == RequestParser::BodyStep::State::kDone && exchange_.body_open()) {
      cancel_body_timer();
      exchange_.end_body();
      if (closed_) return;
      update_interest();
      return;
    }
  }
  if (closed_) return;
  if (exchange_.body_flowing()) {
    // Waiting for the client: the body timeout runs between its bytes.
    arm_read_timer(ReadTimer::kBody, server_.options().body_timeout_ms);
  } else {
    cancel_body_timer();  // waiting for the consumer is not the client's delay
  }
  update_interest();
}

void Connection::fail_body(int status, std::string_view why) {
  exchange_.abandon_body(why);
  if (closed_) return;
  in_.clear();  // nothing after a framing error is ever parsed
  if (exchange_.head_out()) {
    // The response has begun: there is no answering the error, only ending the connection.
    ++server_.stats_.errors;
    server_.log().info("request_refused", "remote={} status={} reason=\"{}\"", peer_ip_, status,
                       why);
    exchange_.peer_gone();
    close_now();
    return;
  }
  respond_error(status, why);
}

}  // namespace corral::http
