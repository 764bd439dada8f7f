#include "http/connection.h"

#include <errno.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "http/h1_writer.h"
#include "http/metrics.h"
#include "http/response_plan.h"
#include "http/server.h"
#include "http/site.h"

namespace corral::http {

namespace {

constexpr size_t kReadSize = 16 * 1024;
// Output queue marks: above kHighWater a connection stops parsing pipelined requests and a stream
// producer is told to wait; below kLowWater they go on.
constexpr size_t kHighWater = 256 * 1024;
constexpr size_t kLowWater = 64 * 1024;
constexpr size_t kMaxLeadingEmptyLines = 4;
// String bodies above this are written from the response itself instead of copied into out_.
constexpr size_t kBigBody = 64 * 1024;
// How long an idle keep-alive connection is kept once the server drains (see begin_close()).
constexpr uint32_t kDrainGraceMs = 100;
// A file under TLS is read into the output buffer this much at a time (4 records).
constexpr size_t kTlsFileChunk = 64 * 1024;

}  // namespace

Connection::Connection(Server& server, std::unique_ptr<core::Transport> transport,
                       const core::SocketAddress& peer)
    : server_(server),
      loop_(server.loop()),
      transport_(std::move(transport)),
      secure_(transport_->secure()),
      peer_(peer),
      peer_info_(Peer::from(peer)),
      peer_ip_(peer_info_.text()),
      parser_(server.options().limits),
      read_timer_(loop_.timers(), [this] { on_read_timer(); }),
      write_timer_(loop_.timers(), [this] {
        server_.log().info("write_timeout", "remote={}", peer_ip_);
        close_now();
      }) {
  parser_.set_body_rules(this);
}

Connection::~Connection() = default;

void Connection::start() {
  started_us_ = loop_.now_us();
  interest_ = EPOLLIN | EPOLLRDHUP;
  if (auto r = loop_.add(transport_->fd(), interest_, this); !r) {
    server_.log().error("epoll_add", "error=\"{}\"", r.error().reason);
    close_now();
    return;
  }
  // A new connection must send a request head within the header timeout.
  arm_read_timer(ReadTimer::kHeader, server_.options().header_timeout_ms);
}

void Connection::arm_read_timer(ReadTimer kind, uint32_t ms) {
  read_timer_kind_ = kind;
  read_timer_.arm_after(ms);
}

void Connection::on_read_timer() {
  if (closed_) return;
  switch (read_timer_kind_) {
    case ReadTimer::kHeader:
      if (in_.empty() && phase_ == Phase::kIdle) {
        close_now();  // nothing was sent: no response is owed
      } else {
        respond_error(408, "request head timeout");
      }
      break;
    case ReadTimer::kBody:
      if (body_state_ == BodyState::kOpen) {
        fail_body(408, "request body timeout");
      } else {
        respond_error(408, "request body timeout");
      }
      break;
    case ReadTimer::kIdle:
      close_now();
      break;
    case ReadTimer::kReady:
      server_.unpark(this);
      respond_error(503, "no site published within ready_timeout");
      break;
    case ReadTimer::kLinger:
    case ReadTimer::kNone:
      close_now();
      break;
  }
}

// A plain transport is done at its first readable event, without a syscall: on_readable() then
// reads as it always would. TLS takes a few rounds.
void Connection::continue_handshake() {
  switch (transport_->handshake()) {
    case core::Transport::Step::kDone:
      handshaking_ = false;
      update_interest();
      on_readable();  // the first request (TLS: it may have come with the client's Finished)
      return;
    case core::Transport::Step::kWantRead:
      update_interest();
      return;
    case core::Transport::Step::kWantWrite:
      if (interest_ != (EPOLLOUT | EPOLLRDHUP)) {
        interest_ = EPOLLOUT | EPOLLRDHUP;
        (void)loop_.modify(transport_->fd(), interest_, this);
      }
      return;
    case core::Transport::Step::kFailed:
      // Only a TLS handshake can fail; the event name is documented (docs/tls.md).
      server_.log().info("tls_handshake_failed", "remote={} error=\"{}\"", peer_ip_,
                         transport_->error());
      close_now();
      return;
  }
}

void Connection::on_io(uint32_t events) {
  if (closed_) return;
  if (handshaking_) {
    if (events & (EPOLLIN | EPOLLOUT)) {
      continue_handshake();
    } else if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
      close_now();
    }
    return;
  }
  if (events & EPOLLOUT) flush();
  if (closed_) return;
  if (events & EPOLLIN) {
    on_readable();
  } else if (events & (EPOLLERR | EPOLLHUP)) {
    close_now();
  } else if (events & EPOLLRDHUP) {
    // The client shut down its side while we were not reading: it is gone as far as a stream is
    // concerned; anything else already queued is still written. While a request body streams,
    // what it sent before is still to be read (its EOF ends or aborts the body then).
    if (body_state_ == BodyState::kOpen) {
      peer_shut_ = true;
      update_interest();
      return;
    }
    peer_eof_ = true;
    if (producer_ || deferred_) {
      abort_stream();
      close_now();
      return;
    }
    update_interest();
  }
}

void Connection::on_readable() {
  if (phase_ == Phase::kLingering) {
    // Nothing is parsed any more: what the client still sends is read and dropped.
    in_.clear();
    auto r = transport_->read_into(in_, kReadSize);
    in_.clear();
    if (!r.ok() && !r.again()) close_now();
    return;
  }
  auto r = transport_->read_into(in_, kReadSize);
  if (r.ok()) {
    add(metrics().proto[ProcessMetrics::kHttp1].request_bytes, r.bytes);
    if (body_state_ == BodyState::kOpen) {
      pump_body();
      if (closed_) return;
    }
    process_input();
    flush();
    return;
  }
  if (r.again()) return;
  // EOF or error. A stream in progress is aborted (its reader is gone); responses already
  // queued for complete requests are still written (the client may have only shut down its
  // sending side); a half-sent request is dropped.
  peer_eof_ = true;
  if (r.status == core::IoResult::Status::kError || producer_ || deferred_ ||
      body_state_ == BodyState::kOpen) {
    abort_stream();
    close_now();
    return;
  }
  if (out_.empty() && !file_active_ && phase_ != Phase::kWaitingSite &&
      phase_ != Phase::kResponding) {
    close_now();
    return;
  }
  update_interest();  // finish writing what is queued, then close (peer_eof_)
}

void Connection::process_input() {
  if (in_process_) return;  // re-entered from a stream that ended inside on_start
  in_process_ = true;
  while (!closed_) {
    if (upgrade_) {
      hand_over();
      return;  // `this` is closed now
    }
    if (in_.empty()) break;
    if (phase_ == Phase::kResponding || phase_ == Phase::kWaitingSite ||
        phase_ == Phase::kLingering || close_after_write_)
      break;
    if (out_.size() >= kHighWater) break;  // a client that pipelines but does not read
    if (phase_ == Phase::kIdle) {
      // RFC 9112 §2.2: ignore a few empty lines before a request line.
      size_t skipped = 0;
      while (in_.size() >= 2 && in_.data()[0] == '\r' && in_.data()[1] == '\n' &&
             skipped < kMaxLeadingEmptyLines) {
        in_.consume(2);
        ++skipped;
      }
      if (in_.empty() || (in_.size() == 1 && in_.data()[0] == '\r')) break;
      phase_ = Phase::kHead;
      started_ms_ = loop_.now();
      started_us_ = loop_.now_us();
      if (!in_request_) {
        in_request_ = true;
        server_.request_started();
      }
      // A new connection's header deadline runs from accept: its first byte does not extend it.
      if (read_timer_kind_ != ReadTimer::kHeader)
        arm_read_timer(ReadTimer::kHeader, server_.options().header_timeout_ms);
    }
    auto r = parser_.feed(in_.view(), req_);
    switch (r.kind) {
      case RequestParser::Kind::kNeedMore:
        in_.consume(r.consumed);
        if (phase_ == Phase::kBody)
          arm_read_timer(ReadTimer::kBody, server_.options().body_timeout_ms);
        in_process_ = false;
        return;
      case RequestParser::Kind::kHead: {
        // The head is parsed, the body is still coming: keep the head's bytes stable (the
        // request holds views of them) before the input buffer is reused.
        size_t head = parser_.head_len();
        head_copy_.assign(in_.data(), head);
        req_.rebase(in_.data(), head, head_copy_.data());
        in_.consume(r.consumed);
        if (parser_.streaming()) {
          start_body_stream();
          in_process_ = false;
          return;
        }
        phase_ = Phase::kBody;
        arm_read_timer(ReadTimer::kBody, server_.options().body_timeout_ms);
        if (parser_.expects_continue()) out_.append("HTTP/1.1 100 Continue\r\n\r\n");
        in_process_ = false;
        return;
      }
      case RequestParser::Kind::kComplete: {
        dispatch();
        in_.consume(r.consumed);
        break;
      }
      case RequestParser::Kind::kError:
        respond_error(r.status, r.reason);
        in_.clear();  // nothing after a framing error is ever parsed
        in_process_ = false;
        return;
    }
  }
  in_process_ = false;
}

void Connection::dispatch() {
  read_timer_.cancel();
  read_timer_kind_ = ReadTimer::kNone;
  ++server_.stats_.requests;
  req_.loop = &loop_;
  server_.assign_trace(req_);
  if (secure_) req_.scheme = "https";  // before admission: a verified relay may still say otherwise
  auto a = admit(req_, peer_info_, server_.policy());
  if (a.status) {
    respond_error(a.status, a.reason);
    return;
  }
  if (a.dropped_headers) {
    server_.log().debug("headers_dropped",
                        "remote={} count={} reason=\"trusted header spelt with '_'\"", peer_ip_,
                        a.dropped_headers);
  }
  if (!req_.host.empty() && admitted_host_ != req_.host) admitted_host_.assign(req_.host);
  if (server_.options().behind_corral) {
    // The proxy's sequence number of a pipelined request: its response echoes it, so that the
    // proxy knows the answer is this request's (at most 20 digits; anything else is no number).
    std::string_view seq = take_corral_view(req_);
    if (!seq.empty() && seq.size() < sizeof echo_seq_) {
      std::memcpy(echo_seq_, seq.data(), seq.size());
      echo_seq_len_ = static_cast<uint8_t>(seq.size());
    }
  }
  if (!server_.site()) {
    phase_ = Phase::kWaitingSite;
    // The request's views point into in_ unless its body arrived in pieces (then into
    // head_copy_ already): keep them stable while parked, since in_ moves on.
    size_t head = parser_.head_len();
    if (head && in_.size() >= head && req_.target.data() >= in_.data() &&
        req_.target.data() < in_.data() + in_.size()) {
      head_copy_.assign(in_.data(), head);
      req_.rebase(in_.data(), head, head_copy_.data());
    }
    server_.park(this);
    arm_read_timer(ReadTimer::kReady, server_.options().ready_timeout_ms);
    update_interest();
    return;
  }
  if (site_ != server_.site()) site_ = server_.site();
  phase_ = Phase::kResponding;
  Response response = site_->handle(req_);
  write_response(response);
}

void Connection::hand_over() {
  in_process_ = false;
  auto handler = std::move(upgrade_);
  UpgradeContext ctx{loop_,   server_, nullptr, std::string(in_.view()), std::string(out_.view()),
                     peer_ip_};
  in_.clear();
  out_.clear();
  loop_.remove(transport_->fd());
  ctx.transport = std::move(transport_);
  read_timer_.cancel();
  write_timer_.cancel();
  close_now();
  handler->take_over(std::move(ctx));
}

void Connection::site_ready() {
  if (closed_ || phase_ != Phase::kWaitingSite) return;
  read_timer_.cancel();
  site_ = server_.site();
  phase_ = Phase::kResponding;
  Response response = site_->handle(req_);
  write_response(response);
  // The parked request's bytes were left in in_; the parser consumed them before parking.
  process_input();
  flush();
}

PlanContext Connection::plan_context() const {
  const auto& opt = server_.options();
  PlanContext ctx;
  ctx.keep_alive =
      !close_after_write_ && parser_.keep_alive() && !closing_ && !server_.closing() && !peer_eof_;
  ctx.server_name = opt.server_name;
  ctx.date = server_.date();
  ctx.alt_svc = opt.alt_svc;
  ctx.referrer_policy = opt.referrer_policy;
  return ctx;
}

// The connection's one plan: fresh on entry, reset() on every way out (PlanInUse) and before a
// route's code runs (a deferred's start() may respond() at once, which re-enters here).
void Connection::write_response(Response& r) {
  ResponsePlan& plan = plan_;
  struct PlanInUse {
    ResponsePlan& plan;
    ~PlanInUse() { plan.reset(); }
  } in_use{plan};
  // A response while the request body still comes is the connection's last: the rest of the
  // body is never parsed as a request.
  if (body_state_ == BodyState::kOpen && !std::holds_alternative<DeferredBody>(r.body))
    close_after_write_ = true;
  if (echo_seq_len_ && !std::holds_alternative<DeferredBody>(r.body)) {
    r.header("Corral-Seq", std::string(echo_seq_, echo_seq_len_));
    echo_seq_len_ = 0;
  }
  plan_response(r, req_, plan_context(), plan);
  if (!plan.refused_header.empty())
    server_.log().error("bad_response_header", "pattern=\"{}\" header=\"{}\"", req_.pattern,
                        fmt::format("{:.40}", plan.refused_header));
  status_ = plan.status;
  body_bytes_ = 0;
  if (plan.body != BodyKind::kDeferred) head_out_ = true;
  if (plan.body != BodyKind::kDeferred) count_response_head();
  if (plan.close) close_after_write_ = true;
  switch (plan.body) {
    case BodyKind::kDeferred:
      keep_log_fields();
      deferred_ = std::move(plan.deferred);
      plan.reset();
      deferred_->start(*this);  // may respond() at once
      return;
    case BodyKind::kUpgrade:
      // The head goes out, then the connection is handed over (process_input, after the upgrade
      // request's bytes are consumed).
      close_after_write_ = false;
      write_h1_head(plan, false, out_);
      upgrade_ = std::move(plan.upgrade);
      finish_request();
      phase_ = Phase::kResponding;  // nothing more is parsed as HTTP
      return;
    default:
      break;
  }
  const bool http10 = req_.version_major == 1 && req_.version_minor == 0;
  H1Framing framing = write_h1_head(plan, http10, out_);
  if (framing.close) close_after_write_ = true;
  if (plan.body == BodyKind::kBytes && plan.send_body) {
    body_bytes_ = plan.bytes.size();
    if (plan.bytes.size() > kBigBody) {
      // A large body is sent from the response's own string, not copied into out_ (a copy
      // would double the memory a big response costs while a slow client reads it).
      big_body_ = plan.take_bytes();
      big_off_ = 0;
      file_active_ = true;
      keep_log_fields();
      return;  // flush() sends it; finish_request() follows
    }
    out_.append(plan.bytes);
  }
  if (plan.body == BodyKind::kFile) {
    file_ = std::move(plan.file);
    file_active_ = true;
    file_part_ = 0;
    if (file_.parts.empty()) {
      ByteRange whole{0, file_.size ? file_.size - 1 : 0};
      ByteRange range = file_.ranges.empty() ? whole : file_.ranges.front();
      file_offset_ = range.first;
      file_left_ = range.last - range.first + 1;
    } else {
      out_.append(file_.parts[0].head);
      file_offset_ = file_.parts[0].range.first;
      file_left_ = file_.parts[0].range.last - file_.parts[0].range.first + 1;
    }
    keep_log_fields();
    return;  // flush() sends the file; finish_request() follows
  }
  if (plan.body != BodyKind::kStream || !plan.send_body) {
    finish_request();
    return;
  }
  stream_chunked_ = framing.chunked;
  keep_log_fields();
  producer_ = std::move(plan.producer);
  plan.reset();  // on_start() is the route's code: nothing below reads the plan
  stream_ended_ = false;
  stream_wants_writable_ = false;
  if (!producer_) {
    end();
    return;
  }
  producer_->on_start(*this);
}

bool Connection::write(std::string_view data) {
  if (closed_ || stream_ended_ || data.empty()) return !closed_;
  if (stream_chunked_) {
    append_h1_chunk(out_, data);
  } else {
    out_.append(data);
  }
  body_bytes_ += data.size();
  if (!flush_scheduled_) {
    flush_scheduled_ = true;
    loop_.defer([this] {
      flush_scheduled_ = false;
      if (!closed_) flush();
    });
  }
  if (out_.size() >= kHighWater) {
    stream_wants_writable_ = true;
    return false;
  }
  return true;
}

void Connection::end() {
  if (closed_ || stream_ended_) return;
  stream_ended_ = true;
  if (stream_chunked_) out_.append(kH1LastChunk);
  if (producer_) loop_.destroy_later(std::move(producer_));
  finish_request();
  if (!flush_scheduled_) {
    flush_scheduled_ = true;
    loop_.defer([this] {
      flush_scheduled_ = false;
      if (closed_) return;
      flush();
      process_input();
      flush();
    });
  }
}

void Connection::abort() {
  if (closed_ || stream_ended_) return;
  stream_ended_ = true;       // no last chunk: the message stays incomplete
  close_after_write_ = true;  // what is queued goes out, then the connection closes
  if (producer_) loop_.destroy_later(std::move(producer_));
  finish_request();
  if (!flush_scheduled_) {
    flush_scheduled_ = true;
    loop_.defer([this] {
      flush_scheduled_ = false;
      if (!closed_) flush();
    });
  }
}

void Connection::respond(Response response) {
  if (closed_ || !deferred_) return;
  loop_.destroy_later(std::move(deferred_));
  if (std::holds_alternative<DeferredBody>(response.body)) response = Response::status_only(500);
  write_response(response);
  if (closed_) return;
  loop_.defer([this] {
    if (closed_) return;
    flush();
    process_input();
    flush();
  });
}

void Connection::abort_stream() {
  abandon_body("connection closed");
  if (deferred_) {
    auto d = std::move(deferred_);
    d->on_abort();
    loop_.destroy_later(std::move(d));
  }
  if (!producer_) return;
  auto p = std::move(producer_);
  p->on_abort();
  loop_.destroy_later(std::move(p));
}

void Connection::keep_log_fields() {
  log_method_.assign(req_.method_name);
  log_target_.assign(req_.target);
  if (server_.log().access_format() == core::AccessFormat::kCombined) {
    log_referer_.assign(req_.header("referer").value_or(""));
    log_agent_.assign(req_.header("user-agent").value_or(""));
  }
}

void Connection::access_log(int status, uint64_t bytes) {
  if (!server_.options().access_log) return;
  const bool kept = !log_method_.empty();  // an asynchronous response: req_'s views may be gone
  core::AccessRecord r;
  r.time = server_.log_time();
  r.remote = peer_ip_;
  r.method = kept ? log_method_ : req_.method_name;
  r.target = log_target_.empty() ? req_.target : log_target_;
  r.status = status;
  r.bytes = bytes;
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

void Connection::finish_request() {
  echo_seq_len_ = 0;
  abandon_body("response ended before the body");
  head_out_ = continue_sent_ = false;
  access_log(status_, body_bytes_);
  metrics().request_done(ProcessMetrics::kHttp1, status_, elapsed_us(started_us_, loop_.now_us()));
  log_method_.clear();
  log_target_.clear();
  log_referer_.clear();
  log_agent_.clear();
  parser_.next_request();
  req_.reset();
  phase_ = Phase::kIdle;
  if (in_request_) {
    in_request_ = false;
    server_.request_finished();
  }
}

// The response head goes out (/metrics, http/metrics.h): the time to it, and for a request that
// waited for its worker's start, the same as that kind's first response.
void Connection::count_response_head() {
  ProcessMetrics& m = metrics();
  uint64_t us = elapsed_us(started_us_, loop_.now_us());
  m.response_head(ProcessMetrics::kHttp1, us);
  if (req_.upstream.cold)
    if (int kind = metrics_kind(req_.upstream.address); kind >= 0)
      m.first_response[kind].observe(kStartBoundsUs, us);
}

void Connection::respond_error(int status, std::string_view reason) {
  ++server_.stats_.errors;
  server_.log().info("request_refused", "remote={} status={} reason=\"{}\"", peer_ip_, status,
                     reason);
  abort_stream();
  file_active_ = false;
  std::string().swap(big_body_);
  close_after_write_ = true;
  Response r = Response::status_only(status);
  write_response(r);  // a short text body, then finish_request()
  phase_ = Phase::kIdle;
  flush();
}

bool Connection::send_file_data() {
  if (!big_body_.empty()) {
    while (big_off_ < big_body_.size()) {
      auto w = transport_->write(big_body_.data() + big_off_, big_body_.size() - big_off_);
      if (w.ok()) {
        add(metrics().proto[ProcessMetrics::kHttp1].response_bytes, w.bytes);
        big_off_ += w.bytes;
        write_timer_.cancel();
        continue;
      }
      if (w.again()) return false;
      close_now();
      return false;
    }
    std::string().swap(big_body_);
    file_active_ = false;
    finish_request();
    return true;
  }
  while (file_active_) {
    if (file_left_ == 0) {
      if (!file_.parts.empty() && ++file_part_ < file_.parts.size()) {
        out_.append(file_.parts[file_part_].head);
        file_offset_ = file_.parts[file_part_].range.first;
        file_left_ = file_.parts[file_part_].range.last - file_offset_ + 1;
        return true;  // write the part head first
      }
      if (!file_.parts.empty()) out_.append(file_.tail);
      file_active_ = false;
      body_bytes_ = file_.content_length;
      status_ = file_.status;
      file_ = ResolvedFile{};
      finish_request();
      return true;
    }
    if (!transport_->can_send_file()) {
      // No sendfile (TLS): the next piece goes through out_ (flush() encrypts it).
      size_t chunk = file_left_ > kTlsFileChunk ? kTlsFileChunk : static_cast<size_t>(file_left_);
      ssize_t n =
          ::pread(file_.fd.get(), out_.reserve(chunk), chunk, static_cast<off_t>(file_offset_));
      if (n > 0) {
        out_.commit(static_cast<size_t>(n));
        file_offset_ += static_cast<uint64_t>(n);
        file_left_ -= static_cast<uint64_t>(n);
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      server_.log().warn("file_read_failed", "remote={} error=\"{}\"", peer_ip_,
                         n == 0 ? "file truncated" : strerror(errno));
      close_now();
      return false;
    }
    size_t chunk = file_left_ > (1u << 20) ? (1u << 20) : static_cast<size_t>(file_left_);
    auto w = transport_->send_file(file_.fd.get(), file_offset_, chunk);
    if (w.ok()) {
      add(metrics().proto[ProcessMetrics::kHttp1].response_bytes, w.bytes);
      file_offset_ += w.bytes;
      file_left_ -= w.bytes;
      continue;
    }
    if (w.again()) return false;
    // The file shrank under us or the socket failed: the framing is broken, close.
    server_.log().warn(
        "sendfile_failed", "remote={} error=\"{}\"", peer_ip_,
        w.status == core::IoResult::Status::kEof ? "file truncated" : strerror(w.error));
    close_now();
    return false;
  }
  return true;
}

void Connection::flush() {
  if (closed_) return;
  for (;;) {
    while (!out_.empty()) {
      // A large body sent in place (send_file_data) follows the head queued in out_: both go in
      // one writev, so such a response costs one syscall, not two.
      core::IoResult w;
      if (big_off_ < big_body_.size()) {
        iovec iov[2] = {{out_.mutable_data(), out_.size()},
                        {big_body_.data() + big_off_, big_body_.size() - big_off_}};
        w = transport_->writev(iov, 2);
      } else {
        w = transport_->write(out_.data(), out_.size());
      }
      if (w.ok()) {
        add(metrics().proto[ProcessMetrics::kHttp1].response_bytes, w.bytes);
        size_t head = std::min(w.bytes, out_.size());
        out_.consume(head);
        big_off_ += w.bytes - head;
        write_timer_.cancel();
        continue;
      }
      if (w.again()) break;
      abort_stream();
      close_now();
      return;
    }
    if (!out_.empty() || !file_active_) break;
    if (!send_file_data()) break;
    if (closed_) return;
  }
  if (closed_) return;
  if (!out_.empty() || file_active_) {
    if (!write_timer_.armed()) write_timer_.arm_after(server_.options().write_timeout_ms);
  } else {
    write_timer_.cancel();
    if (producer_ && stream_wants_writable_) {
      stream_wants_writable_ = false;
      producer_->on_writable(*this);
      if (closed_) return;
    }
  }
  if (out_.empty() && !file_active_ && !producer_ && phase_ == Phase::kIdle) {
    if (close_after_write_ || (peer_eof_ && in_.empty())) {
      start_linger();
      return;
    }
    if (out_.size() < kLowWater && !in_.empty() && !in_process_) {
      process_input();  // pipelined requests held back by the output queue
      if (!out_.empty()) {
        flush();
        return;
      }
    }
    if (in_.empty() && read_timer_kind_ != ReadTimer::kIdle) {
      arm_read_timer(ReadTimer::kIdle,
                     closing_ ? kDrainGraceMs : server_.options().keepalive_timeout_ms);
      if (out_.capacity() > 1024 * 1024) out_.release();
    }
  }
  update_interest();
}

void Connection::update_interest() {
  if (closed_) return;
  uint32_t want = 0;
  bool busy = phase_ == Phase::kResponding || phase_ == Phase::kWaitingSite;
  // While a response is pending the connection keeps reading (what arrives waits in in_, up to
  // a head's worth): dropping EPOLLIN and adding it back would cost two epoll_ctl per deferred,
  // streamed or file response.
  bool room = in_.size() < server_.options().limits.max_head_bytes + kReadSize;
  if (body_state_ == BodyState::kOpen) {
    // A streamed body is read only while its consumer takes it, one read at a time, whatever
    // the response does (a request with `Connection: close` still sends its body).
    if (!peer_eof_ && body_consumer_ && !body_paused_ && in_.size() < kReadSize) want |= EPOLLIN;
  } else if (phase_ == Phase::kLingering ||
             (!peer_eof_ && !close_after_write_ && out_.size() < kHighWater && (!busy || room))) {
    want |= EPOLLIN;
  }
  if (!peer_eof_ && !peer_shut_) want |= EPOLLRDHUP;
  if (!out_.empty() || file_active_) want |= EPOLLOUT;
  if (want != interest_) {
    interest_ = want;
    (void)loop_.modify(transport_->fd(), want, this);
  }
}

void Connection::start_linger() {
  if (phase_ == Phase::kLingering) return;
  // Half-close and drain what the client still sends, so our last response is not destroyed by
  // a reset; then close after a short time.
  phase_ = Phase::kLingering;
  transport_->shutdown();  // TLS: close_notify first
  if (peer_eof_) {
    close_now();
    return;
  }
  arm_read_timer(ReadTimer::kLinger, server_.options().linger_timeout_ms);
  update_interest();
}

void Connection::begin_close() {
  if (closed_) return;
  closing_ = true;  // the next response is the last one (write_response adds Connection: close)
  if (phase_ == Phase::kResponding) {
    close_after_write_ = true;  // its head may be out already: close once it is complete
    return;
  }
  if (phase_ == Phase::kIdle && out_.empty() && !file_active_ && !producer_ && in_.empty()) {
    // An idle keep-alive connection: a request may already be on its way (a client under load
    // sends the next one the moment it read a response). Serve it as the last if it arrives
    // within a short grace, else close: closing at once would reset such a request.
    arm_read_timer(ReadTimer::kIdle, kDrainGraceMs);
  }
}

void Connection::policy_changed() {
  if (closed_ || admitted_host_.empty()) return;
  if (still_admitted(admitted_host_, server_.policy())) return;
  server_.log().info("connection_revoked", "remote={} host=\"{}\"", peer_ip_, admitted_host_);
  begin_close();
}

void Connection::close_now() {
  if (closed_) return;
  closed_ = true;
  if (in_request_) {
    in_request_ = false;
    server_.request_finished();
  }
  abort_stream();
  read_timer_.cancel();
  write_timer_.cancel();
  if (transport_) {
    loop_.remove(transport_->fd());
    transport_.reset();
  }
  server_.connection_closed(this);
}

}  // namespace corral::http
