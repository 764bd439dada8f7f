#include "http/exchange.h"

#include <fmt/format.h>

#include <cstring>

#include "core/event_loop.h"
#include "http/metrics.h"
#include "http/server.h"
#include "http/site.h"

namespace corral::http {

void FileCursor::start(ResolvedFile&& file) {
  file_ = std::move(file);
  active_ = true;
  part_ = 0;
  if (file_.parts.empty()) {
    in_text_ = false;
    ByteRange whole{0, file_.size ? file_.size - 1 : 0};
    ByteRange r = file_.ranges.empty() ? whole : file_.ranges.front();
    offset_ = r.first;
    left_ = r.length();
    return;
  }
  enter_part();
}

void FileCursor::enter_part() {
  in_text_ = true;
  text_off_ = 0;
  if (part_ < file_.parts.size()) {
    offset_ = file_.parts[part_].range.first;
    left_ = file_.parts[part_].range.length();
  }
}

FileSegment FileCursor::current() const {
  if (!in_text_) return {{}, offset_, left_};
  std::string_view text = part_ < file_.parts.size() ? file_.parts[part_].head : file_.tail;
  return {text.substr(text_off_), 0, 0};
}

void FileCursor::advance(uint64_t n) {
  if (in_text_) {
    text_off_ += n;
    const bool tail = part_ == file_.parts.size();
    if (text_off_ < (tail ? file_.tail : file_.parts[part_].head).size()) return;
    if (tail) {
      active_ = false;
      return;
    }
    in_text_ = false;
    return;
  }
  offset_ += n;
  left_ -= n;
  if (left_ > 0) return;
  if (file_.parts.empty()) {
    active_ = false;
    return;
  }
  ++part_;
  enter_part();
}

void FileCursor::clear() {
  active_ = false;
  file_ = ResolvedFile{};
}

Exchange::Exchange(Server& server, ExchangeStream& stream, Protocol protocol, const Peer& peer)
    : server_(server),
      loop_(server.loop()),
      stream_(stream),
      protocol_(protocol),
      metrics_proto_(protocol == Protocol::kHttp3 ? ProcessMetrics::kHttp3
                                                  : ProcessMetrics::kHttp1),
      peer_(peer) {}

Exchange::~Exchange() = default;

void Exchange::start_clock() {
  started_ms_ = loop_.now();
  started_us_ = loop_.now_us();
}

void Exchange::count_in_flight() {
  if (!in_request_) {
    in_request_ = true;
    server_.request_started();
  }
}

Exchange::Dispatch Exchange::dispatch() {
  req_.loop = &loop_;
  server_.assign_trace(req_);
  auto a = admit(req_, peer_, server_.policy());
  if (a.status) return {Dispatch::kRefused, a.status, a.reason};
  if (a.dropped_headers) {
    server_.log().debug("headers_dropped",
                        "remote={} count={} reason=\"trusted header spelt with '_'\"", peer_.text(),
                        a.dropped_headers);
  }
  stream_.admitted(req_);
  if (server_.options().behind_corral) {
    // The proxy's sequence number of a pipelined request: its response echoes it, so that the
    // proxy knows the answer is this request's (at most 20 digits; anything else is no number).
    std::string_view seq = take_corral_view(req_);
    if (!seq.empty() && seq.size() < sizeof echo_seq_) {
      std::memcpy(echo_seq_, seq.data(), seq.size());
      echo_seq_len_ = static_cast<uint8_t>(seq.size());
    }
  }
  if (!server_.site()) return {Dispatch::kParked};
  handle();
  return {};
}

void Exchange::run_site() {
  handle();
}

void Exchange::handle() {
  if (site_ != server_.site()) site_ = server_.site();
  Response response = site_->handle(req_);
  write_response(response);
}

void Exchange::respond_error(int status, std::string_view reason) {
  if (protocol_ == Protocol::kHttp3) {
    server_.log().info("request_refused", "remote={} status={} reason=\"{}\" proto=h3",
                       peer_.text(), status, reason);
  } else {
    server_.log().info("request_refused", "remote={} status={} reason=\"{}\"", peer_.text(), status,
                       reason);
  }
  peer_gone();  // what was under way for this request stops
  Response r = Response::status_only(status);
  write_response(r);
}

PlanContext Exchange::plan_context() const {
  const auto& opt = server_.options();
  PlanContext ctx;
  ctx.protocol = protocol_;
  ctx.keep_alive = stream_.keep_alive();
  ctx.server_name = opt.server_name;
  ctx.date = server_.date();
  if (protocol_ != Protocol::kHttp3) ctx.alt_svc = opt.alt_svc;  // an h3 client is there already
  ctx.referrer_policy = opt.referrer_policy;
  return ctx;
}

// The exchange's one plan: fresh on entry, reset() on every way out (PlanInUse) and before a
// route's code runs (a deferred's start() may respond() at once, which re-enters here).
void Exchange::write_response(Response& r) {
  ResponsePlan& plan = plan_;
  struct PlanInUse {
    ResponsePlan& plan;
    ~PlanInUse() { plan.reset(); }
  } in_use{plan};
  const bool deferred = std::holds_alternative<DeferredBody>(r.body);
  if (echo_seq_len_ && !deferred) {
    r.header("Corral-Seq", std::string(echo_seq_, echo_seq_len_));
    echo_seq_len_ = 0;
  }
  plan_response(r, req_, plan_context(), plan);
  if (!plan.refused_header.empty())
    server_.log().error("bad_response_header", "pattern=\"{}\" header=\"{}\"", req_.pattern,
                        fmt::format("{:.40}", plan.refused_header));
  if (plan.body == BodyKind::kUpgrade && !stream_.can_upgrade()) {
    // An upgrade (WebSocket) has no meaning on a multiplexed stream without extended CONNECT:
    // refuse it plainly.
    std::string_view proto = protocol_ == Protocol::kHttp3 ? "h3" : "http";
    server_.log().info("request_refused",
                       "remote={} status=501 reason=\"upgrade over {}\" proto={}", peer_.text(),
                       proto, proto);
    plan.reset();
    Response err = Response::status_only(501);
    write_response(err);
    return;
  }
  body_bytes_ = 0;
  if (plan.body == BodyKind::kDeferred) {
    keep_log_fields();
    deferred_ = std::move(plan.deferred);
    plan.reset();
    deferred_->start(*this);  // may respond() at once
    return;
  }
  status_ = plan.status;
  head_out_ = true;
  count_response_head();
  switch (plan.body) {
    case BodyKind::kUpgrade: {
      auto handler = std::move(plan.upgrade);
      stream_.send_head(plan);
      stream_.upgrade(std::move(handler));
      return;
    }
    case BodyKind::kFile:
      stream_.send_head(plan);  // before the file moves: fields point into it
      file_.start(std::move(plan.file));
      keep_log_fields();
      stream_.send_file(file_);
      return;
    case BodyKind::kStream:
      if (!plan.send_body) break;
      keep_log_fields();
      producer_ = std::move(plan.producer);
      stream_ended_ = false;
      wants_writable_ = false;
      stream_.send_head(plan);
      plan.reset();  // on_start() is the route's code: nothing below reads the plan
      if (!producer_) {
        end();
        return;
      }
      producer_->on_start(*this);
      return;
    case BodyKind::kBytes:
      if (plan.send_body) body_bytes_ = plan.bytes.size();
      break;
    default:
      break;
  }
  stream_.send_head(plan);  // the whole message
}

bool Exchange::write(std::string_view data) {
  if (stream_ended_) return false;
  if (data.empty()) return true;
  body_bytes_ += data.size();
  if (stream_.send_data(data)) return true;
  wants_writable_ = true;
  return false;
}

void Exchange::end() {
  if (stream_ended_) return;
  stream_ended_ = true;
  if (producer_) loop_.destroy_later(std::move(producer_));
  stream_.end_stream();
}

void Exchange::abort() {
  if (stream_ended_) return;
  stream_ended_ = true;
  if (producer_) loop_.destroy_later(std::move(producer_));
  stream_.reset_stream();
}

void Exchange::writable() {
  if (!producer_ || !wants_writable_) return;
  wants_writable_ = false;
  producer_->on_writable(*this);
}

void Exchange::respond(Response response) {
  if (!deferred_) return;
  loop_.destroy_later(std::move(deferred_));
  if (std::holds_alternative<DeferredBody>(response.body)) response = Response::status_only(500);
  write_response(response);
  stream_.responded_later();
}

void Exchange::file_done() {
  body_bytes_ = file_.file().content_length;
  status_ = file_.file().status;
  file_.clear();
}

void Exchange::peer_gone() {
  abandon_body("connection closed");
  stream_ended_ = true;
  if (deferred_) {
    auto d = std::move(deferred_);
    d->on_abort();
    loop_.destroy_later(std::move(d));
  }
  if (producer_) {
    auto p = std::move(producer_);
    p->on_abort();
    loop_.destroy_later(std::move(p));
  }
}

void Exchange::release() {
  if (in_request_) {
    in_request_ = false;
    server_.request_finished();
  }
}

void Exchange::complete() {
  echo_seq_len_ = 0;
  abandon_body("response ended before the body");
  head_out_ = false;
  access_log();
  if (status_)
    metrics().request_done(static_cast<ProcessMetrics::Proto>(metrics_proto_), status_,
                           elapsed_us(started_us_, loop_.now_us()));
  log_method_.clear();
  log_target_.clear();
  log_referer_.clear();
  log_agent_.clear();
  if (file_.active()) file_.clear();
  req_.reset();
  status_ = 0;
  release();
}

void Exchange::keep_log_fields() {
  log_method_.assign(req_.method_name);
  log_target_.assign(req_.target);
  if (server_.log().access_format() == core::AccessFormat::kCombined) {
    log_referer_.assign(req_.header("referer").value_or(""));
    log_agent_.assign(req_.header("user-agent").value_or(""));
  }
}

void Exchange::access_log() {
  if (!server_.options().access_log) return;
  const bool kept = !log_method_.empty();  // an asynchronous response: req_'s views may be gone
  core::AccessRecord r;
  r.time = server_.log_time();
  r.remote = peer_.text();
  r.method = kept ? log_method_ : req_.method_name;
  r.target = log_target_.empty() ? req_.target : log_target_;
  if (protocol_ == Protocol::kHttp3) r.proto = "h3";
  r.status = status_ ? status_ : 499;  // 499: the stream went before any response
  r.bytes = body_bytes_;
  r.duration_ms = loop_.now() - started_ms_;
  r.traceparent = req_.traceparent();
  if (req_.upstream.proxied) {
    r.proxied = true;
    r.address = req_.upstream.address;
    r.worker_pid = req_.upstream.worker_pid;
    r.cold = req_.upstream.cold;
  }
  if (server_.log().access_format() == core::AccessFormat::kCombined) {
    r.referer = kept ? log_referer_ : req_.header("referer").value_or("");
    r.user_agent = kept ? log_agent_ : req_.header("user-agent").value_or("");
    if (req_.principal) r.user = req_.principal->id;
  }
  server_.log().access(r);
}

// The response head goes out (/metrics, http/metrics.h): the time to it, and for a request that
// waited for its worker's start, the same as that kind's first response.
void Exchange::count_response_head() {
  ProcessMetrics& m = metrics();
  uint64_t us = elapsed_us(started_us_, loop_.now_us());
  m.response_head(static_cast<ProcessMetrics::Proto>(metrics_proto_), us);
  if (req_.upstream.cold)
    if (int kind = metrics_kind(req_.upstream.address); kind >= 0)
      m.first_response[kind].observe(kStartBoundsUs, us);
}

// A streamed request body (body_stream.h).

void Exchange::open_body() {
  body_open_ = true;
  consumer_ = nullptr;
  body_delivered_ = 0;
  body_paused_ = body_resumed_ = false;
  req_.body_stream = this;
}

void Exchange::read(BodyConsumer* consumer) {
  if (!body_open_) return;
  consumer_ = consumer;
  if (consumer) {
    stream_.request_body_wanted();
  } else {
    stream_.request_body_detached();
  }
}

void Exchange::resume() {
  if (!body_open_) return;
  if (body_in_callback_) {
    body_resumed_ = true;  // on_body_data's false that follows does not pause
    return;
  }
  if (!body_paused_) return;
  body_paused_ = false;
  stream_.request_body_wanted();
}

void Exchange::deliver_body(std::string_view piece) {
  body_delivered_ += piece.size();
  body_in_callback_ = true;
  body_resumed_ = false;
  bool more = consumer_->on_body_data(piece);
  body_in_callback_ = false;
  if (!more && !body_resumed_) body_paused_ = true;
}

void Exchange::end_body() {
  body_open_ = false;
  BodyConsumer* c = consumer_;
  consumer_ = nullptr;
  if (c) c->on_body_end();
}

bool Exchange::abandon_body(std::string_view why) {
  if (!body_open_) return false;
  body_open_ = false;
  BodyConsumer* c = consumer_;
  consumer_ = nullptr;
  stream_.request_body_abandoned();
  if (c) c->on_body_abort(why);
  return true;
}

}  // namespace corral::http
