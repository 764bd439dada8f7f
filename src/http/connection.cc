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
      exchange_(server, *this, Protocol::kHttp1, peer_info_),
      read_timer_(loop_.timers(), [this] { on_read_timer(); }),
      write_timer_(loop_.timers(), [this] {
        server_.log().info("write_timeout", "remote={}", peer_ip_);
        close_now();
      }) {
  parser_.set_body_rules(this);
}

Connection::~Connection() = default;

void Connection::start() {
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
      if (exchange_.body_open()) {
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
    if (exchange_.body_open()) {
      peer_shut_ = true;
      update_interest();
      return;
    }
    peer_eof_ = true;
    if (exchange_.waiting()) {
      exchange_.peer_gone();
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
    if (exchange_.body_open()) {
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
  if (r.status == core::IoResult::Status::kError || exchange_.waiting() || exchange_.body_open()) {
    exchange_.peer_gone();
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
      exchange_.begin();
      // A new connection's header deadline runs from accept: its first byte does not extend it.
      if (read_timer_kind_ != ReadTimer::kHeader)
        arm_read_timer(ReadTimer::kHeader, server_.options().header_timeout_ms);
    }
    Request& req = exchange_.request();
    auto r = parser_.feed(in_.view(), req);
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
        req.rebase(in_.data(), head, head_copy_.data());
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
  Request& req = exchange_.request();
  if (secure_) req.scheme = "https";  // before admission: a verified relay may still say otherwise
  phase_ = Phase::kResponding;
  auto d = exchange_.dispatch();
  if (d.kind == Exchange::Dispatch::kRefused) {
    respond_error(d.status, d.reason);
    return;
  }
  if (d.kind == Exchange::Dispatch::kHandled) return;
  phase_ = Phase::kWaitingSite;
  // The request's views point into in_ unless its body arrived in pieces (then into
  // head_copy_ already): keep them stable while parked, since in_ moves on.
  size_t head = parser_.head_len();
  if (head && in_.size() >= head && req.target.data() >= in_.data() &&
      req.target.data() < in_.data() + in_.size()) {
    head_copy_.assign(in_.data(), head);
    req.rebase(in_.data(), head, head_copy_.data());
  }
  server_.park(this);
  arm_read_timer(ReadTimer::kReady, server_.options().ready_timeout_ms);
  update_interest();
}

void Connection::admitted(const Request& req) {
  if (!req.host.empty() && admitted_host_ != req.host) admitted_host_.assign(req.host);
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
  phase_ = Phase::kResponding;
  exchange_.run_site();
  // The parked request's bytes were left in in_; the parser consumed them before parking.
  process_input();
  flush();
}

bool Connection::keep_alive() const {
  return !close_after_write_ && !exchange_.body_open() && parser_.keep_alive() && !closing_ &&
         !server_.closing() && !peer_eof_;
}

void Connection::send_head(ResponsePlan& plan) {
  if (plan.body == BodyKind::kUpgrade) {
    // The head goes out, then the connection is handed over (upgrade()).
    close_after_write_ = false;
    write_h1_head(plan, false, out_);
    return;
  }
  // A response while the request body still comes is the connection's last: the rest of the
  // body is never parsed as a request.
  if (plan.close || exchange_.body_open()) close_after_write_ = true;
  const Request& req = exchange_.request();
  const bool http10 = req.version_major == 1 && req.version_minor == 0;
  H1Framing framing = write_h1_head(plan, http10, out_);
  if (framing.close) close_after_write_ = true;
  switch (plan.body) {
    case BodyKind::kFile:
      return;  // send_file() follows
    case BodyKind::kStream:
      if (!plan.send_body) break;
      stream_chunked_ = framing.chunked;
      return;  // send_data()... end_stream() follow
    case BodyKind::kBytes:
      if (!plan.send_body) break;
      if (plan.bytes.size() > kBigBody) {
        // A large body is sent from the response's own string, not copied into out_ (a copy
        // would double the memory a big response costs while a slow client reads it).
        big_body_ = plan.take_bytes();
        big_off_ = 0;
        file_active_ = true;
        exchange_.keep_log_fields();
        return;  // flush() sends it; finish_request() follows
      }
      out_.append(plan.bytes);
      break;
    default:
      break;
  }
  finish_request();
}

void Connection::send_file(FileCursor& file) {
  file_ = &file;
  file_active_ = true;
  // A multipart body's first part head goes with the response head.
  FileSegment seg = file.current();
  if (!seg.text.empty()) {
    out_.append(seg.text);
    file.advance(seg.text.size());
  }
}

void Connection::upgrade(std::unique_ptr<UpgradeHandler> handler) {
  // process_input hands the connection over once the upgrade request's bytes are consumed.
  upgrade_ = std::move(handler);
  finish_request();
  phase_ = Phase::kResponding;  // nothing more is parsed as HTTP
}

void Connection::schedule_flush() {
  if (flush_scheduled_) return;
  flush_scheduled_ = true;
  loop_.defer([this] {
    flush_scheduled_ = false;
    if (!closed_) flush();
  });
}

bool Connection::send_data(std::string_view data) {
  if (closed_) return false;
  if (stream_chunked_) {
    append_h1_chunk(out_, data);
  } else {
    out_.append(data);
  }
  schedule_flush();
  return out_.size() < kHighWater;
}

void Connection::end_stream() {
  if (closed_) return;
  if (stream_chunked_) out_.append(kH1LastChunk);
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

void Connection::reset_stream() {
  if (closed_) return;
  close_after_write_ = true;  // no last chunk: what is queued goes out, then the connection closes
  finish_request();
  schedule_flush();
}

void Connection::responded_later() {
  if (closed_) return;
  loop_.defer([this] {
    if (closed_) return;
    flush();
    process_input();
    flush();
  });
}

void Connection::finish_request() {
  exchange_.complete();
  continue_sent_ = false;
  parser_.next_request();
  phase_ = Phase::kIdle;
}

void Connection::respond_error(int status, std::string_view reason) {
  ++server_.stats_.errors;
  file_active_ = false;
  std::string().swap(big_body_);
  close_after_write_ = true;
  exchange_.respond_error(status, reason);  // a short text body, then finish_request()
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
    if (!file_->active()) {
      file_active_ = false;
      file_ = nullptr;
      exchange_.file_done();
      finish_request();
      return true;
    }
    FileSegment seg = file_->current();
    if (!seg.text.empty()) {
      out_.append(seg.text);  // a multipart part's head or the closing delimiter: written first
      file_->advance(seg.text.size());
      if (file_->active()) return true;
      continue;
    }
    if (!transport_->can_send_file()) {
      // No sendfile (TLS): the next piece goes through out_ (flush() encrypts it).
      size_t chunk = seg.length > kTlsFileChunk ? kTlsFileChunk : static_cast<size_t>(seg.length);
      ssize_t n = ::pread(file_->fd(), out_.reserve(chunk), chunk, static_cast<off_t>(seg.offset));
      if (n > 0) {
        out_.commit(static_cast<size_t>(n));
        file_->advance(static_cast<uint64_t>(n));
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      server_.log().warn("file_read_failed", "remote={} error=\"{}\"", peer_ip_,
                         n == 0 ? "file truncated" : strerror(errno));
      close_now();
      return false;
    }
    size_t chunk = seg.length > (1u << 20) ? (1u << 20) : static_cast<size_t>(seg.length);
    auto w = transport_->send_file(file_->fd(), seg.offset, chunk);
    if (w.ok()) {
      add(metrics().proto[ProcessMetrics::kHttp1].response_bytes, w.bytes);
      file_->advance(w.bytes);
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
      exchange_.peer_gone();
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
    if (exchange_.wants_writable()) {
      exchange_.writable();
      if (closed_) return;
    }
  }
  if (out_.empty() && !file_active_ && !exchange_.producing() && phase_ == Phase::kIdle) {
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
  if (exchange_.body_open()) {
    // A streamed body is read only while its consumer takes it, one read at a time, whatever
    // the response does (a request with `Connection: close` still sends its body).
    if (!peer_eof_ && exchange_.body_flowing() && in_.size() < kReadSize) want |= EPOLLIN;
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
  if (phase_ == Phase::kIdle && out_.empty() && !file_active_ && !exchange_.producing() &&
      in_.empty()) {
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
  exchange_.release();
  exchange_.peer_gone();
  read_timer_.cancel();
  write_timer_.cancel();
  if (transport_) {
    loop_.remove(transport_->fd());
    transport_.reset();
  }
  server_.connection_closed(this);
}

}  // namespace corral::http
