// H3Stream: one HTTP/3 request stream (see h3_connection.h).
#include <fmt/format.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "http/metrics.h"
#include "http/server.h"
#include "http/site.h"
#include "quic/h3_connection.h"

namespace corral::quic {

namespace {

// Response body chunks read from a file, and the stream producer's queue marks (the same as the
// HTTP/1.1 connection's output queue).
constexpr size_t kFileChunk = 64 * 1024;
constexpr size_t kFileChunksPerRead = 4;
constexpr uint64_t kHighWater = 256 * 1024;
constexpr uint64_t kLowWater = 64 * 1024;

}  // namespace

H3Stream::H3Stream(H3Connection& conn, int64_t id) : conn_(conn), id_(id) {
  started_ms_ = conn.endpoint().loop().now();
  started_us_ = conn.endpoint().loop().now_us();
}

H3Stream::~H3Stream() {
  finish();
}

bool H3Stream::add_body(const uint8_t* data, size_t len) {
  if (responded_) return false;
  const auto& limits = conn_.endpoint().tcp().options().limits;
  if (body_.size() + len > limits.max_body) {
    respond_error(413, "request body too large");
    // Stop reading: the response says it all (RFC 9114 §4.1.1, H3_NO_ERROR).
    ngtcp2_conn_shutdown_stream_read(conn_.quic(), id_, NGHTTP3_H3_NO_ERROR);
    return false;
  }
  body_.append(reinterpret_cast<const char*>(data), len);
  http::add(http::metrics().proto[http::ProcessMetrics::kHttp3].request_bytes, len);
  return true;
}

void H3Stream::headers_done() {
  // A declared body over the limit is refused before it is sent.
  auto cl = head_.field("content-length");
  uint64_t n = 0;
  if (cl && std::from_chars(cl->data(), cl->data() + cl->size(), n).ec == std::errc() &&
      n > conn_.endpoint().tcp().options().limits.max_body) {
    respond_error(413, "request body too large");
    ngtcp2_conn_shutdown_stream_read(conn_.quic(), id_, NGHTTP3_H3_NO_ERROR);
  }
}

void H3Stream::request_done() {
  if (responded_ || finished_) return;
  dispatch();
}

void H3Stream::dispatch() {
  auto& ep = conn_.endpoint();
  auto& tcp = ep.tcp();
  ++ep.stats().requests;
  if (!in_request_) {
    in_request_ = true;
    conn_.stream_request_started();
  }
  req_.reset();
  RequestHead::Limits limits;
  limits.max_bytes = tcp.options().limits.max_head_bytes;
  limits.max_fields = tcp.options().limits.max_headers;
  if (int status = head_.build(req_, limits)) {
    respond_error(status, head_.reason());
    return;
  }
  req_.body = body_;
  req_.loop = &ep.loop();
  req_.scheme = "https";  // a relay's forwarding headers may say otherwise (admission)
  tcp.assign_trace(req_);
  auto a = http::admit(req_, conn_.peer(), tcp.policy());
  if (a.status) {
    respond_error(a.status, a.reason);
    return;
  }
  if (!tcp.site()) {
    parked_ = true;
    park_deadline_ms_ = ep.loop().now() + tcp.options().ready_timeout_ms;
    return;
  }
  site_ = tcp.site();
  http::Response r = site_->handle(req_);
  submit(r);
}

void H3Stream::retry_parked() {
  if (!parked_ || finished_) return;
  auto& tcp = conn_.endpoint().tcp();
  if (!tcp.site()) {
    if (conn_.endpoint().loop().now() >= park_deadline_ms_) park_expired();
    return;
  }
  parked_ = false;
  site_ = tcp.site();
  http::Response r = site_->handle(req_);
  submit(r);
  conn_.schedule_write();
}

void H3Stream::park_expired() {
  parked_ = false;
  respond_error(503, "no site published within ready_timeout");
  conn_.schedule_write();
}

void H3Stream::respond_error(int status, std::string_view reason) {
  if (responded_) return;
  auto& tcp = conn_.endpoint().tcp();
  if (!in_request_) {  // refused before dispatch (413 while the body arrives): still a request
    ++conn_.endpoint().stats().requests;
    in_request_ = true;
    conn_.stream_request_started();
  }
  tcp.log().info("request_refused", "remote={} status={} reason=\"{}\" proto=h3",
                 conn_.peer().text(), status, reason);
  http::Response r = http::Response::status_only(status);
  submit(r);
}

http::PlanContext H3Stream::plan_context() {
  auto& tcp = conn_.endpoint().tcp();
  http::PlanContext ctx;
  ctx.protocol = http::Protocol::kHttp3;
  ctx.server_name = tcp.options().server_name;
  ctx.date = tcp.date();
  ctx.referrer_policy = tcp.options().referrer_policy;
  return ctx;  // no Alt-Svc: the client is here already
}

void H3Stream::submit_head(const H3Head& head, int status, bool with_body) {
  nghttp3_data_reader reader;
  reader.read_data = nullptr;
  if (with_body)
    reader.read_data = [](nghttp3_conn* c, int64_t sid, nghttp3_vec* vec, size_t veccnt,
                          uint32_t* pflags, void* ud, void* sud) {
      (void)c;
      (void)sid;
      (void)ud;
      if (!sud) return static_cast<nghttp3_ssize>(NGHTTP3_ERR_CALLBACK_FAILURE);
      return static_cast<H3Stream*>(sud)->read_data(vec, veccnt, pflags);
    };
  status_ = status;
  responded_ = true;
  count_response_head();
  if (!conn_.h3()) return;
  int rv = nghttp3_conn_submit_response(conn_.h3(), id_, head.data(), head.size(),
                                        with_body ? &reader : nullptr);
  if (rv != 0) {
    conn_.endpoint().tcp().log().warn("h3_submit_response", "error=\"{}\"", nghttp3_strerror(rv));
    ngtcp2_conn_shutdown_stream(conn_.quic(), id_, NGHTTP3_H3_INTERNAL_ERROR);
  }
  conn_.schedule_write();
}

void H3Stream::submit(http::Response& r) {
  http::ResponsePlan plan;
  http::plan_response(r, req_, plan_context(), plan);
  if (!plan.refused_header.empty())
    conn_.endpoint().log().error("bad_response_header", "pattern=\"{}\" header=\"{}\"",
                                 req_.pattern, fmt::format("{:.40}", plan.refused_header));
  log_method_.assign(req_.method_name);
  log_target_.assign(req_.target);
  if (conn_.endpoint().tcp().log().access_format() == core::AccessFormat::kCombined) {
    log_referer_.assign(req_.header("referer").value_or(""));
    log_agent_.assign(req_.header("user-agent").value_or(""));
  }
  switch (plan.body) {
    case http::BodyKind::kDeferred:
      deferred_ = std::move(plan.deferred);
      deferred_->start(*this);  // may respond() at once
      return;
    case http::BodyKind::kUpgrade: {
      // An upgrade (WebSocket) has no meaning on an HTTP/3 request stream (RFC 9220's extended
      // CONNECT is not supported): refuse it plainly.
      conn_.endpoint().log().info("request_refused",
                                  "remote={} status=501 reason=\"upgrade over h3\" proto=h3",
                                  conn_.peer().text());
      http::Response err = http::Response::status_only(501);
      submit(err);
      return;
    }
    case http::BodyKind::kBytes: {
      bool with_body = plan.send_body && !plan.bytes.empty();
      if (with_body) {
        add_chunk(plan.take_bytes());
        eof_ = true;
      }
      submit_head(H3Head(plan), plan.status, with_body);
      return;
    }
    case http::BodyKind::kFile: {
      H3Head head(plan);  // a copy of the fields: some point into plan.file, moved next
      file_ = std::move(plan.file);
      segments_ = http::file_segments(file_);
      segment_ = 0;
      file_active_ = true;
      submit_head(head, plan.status, true);
      return;
    }
    case http::BodyKind::kStream:
      if (!plan.send_body || !plan.producer) {
        if (plan.send_body) eof_ = true;  // an empty stream
        submit_head(H3Head(plan), plan.status, false);
        return;
      }
      producer_ = std::move(plan.producer);
      submit_head(H3Head(plan), plan.status, true);
      producer_->on_start(*this);
      return;
    case http::BodyKind::kNone:
      submit_head(H3Head(plan), plan.status, false);
      return;
  }
}

void H3Stream::add_chunk(std::string data) {
  if (data.empty()) return;
  unsent_ += data.size();
  chunks_.push_back(std::move(data));
}

bool H3Stream::fill_file() {
  // The next segments of a file body: framing text as is, file ranges read in chunks.
  for (size_t i = 0; i < kFileChunksPerRead && file_active_;) {
    if (segment_ == segments_.size()) {
      file_active_ = false;
      eof_ = true;
      segments_.clear();
      file_ = http::ResolvedFile{};
      return true;
    }
    auto& seg = segments_[segment_];
    if (!seg.text.empty()) {
      add_chunk(std::string(seg.text));  // a chunk lives until acked; the file may go first
      ++segment_;
      continue;
    }
    if (seg.length == 0) {
      ++segment_;
      continue;
    }
    size_t want = seg.length > kFileChunk ? kFileChunk : static_cast<size_t>(seg.length);
    std::string chunk(want, '\0');
    ssize_t n = ::pread(file_.fd.get(), chunk.data(), want, static_cast<off_t>(seg.offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The file shrank under us or cannot be read: the announced length cannot be kept.
      conn_.endpoint().log().warn("file_read_failed", "remote={} error=\"{}\" proto=h3",
                                  conn_.peer().text(), n == 0 ? "file truncated" : strerror(errno));
      return false;
    }
    chunk.resize(static_cast<size_t>(n));
    seg.offset += static_cast<uint64_t>(n);
    seg.length -= static_cast<uint64_t>(n);
    add_chunk(std::move(chunk));
    ++i;
  }
  return true;
}

nghttp3_ssize H3Stream::read_data(nghttp3_vec* vec, size_t veccnt, uint32_t* pflags) {
  if (next_chunk_ == chunks_.size() && file_active_ && !fill_file()) {
    ngtcp2_conn_shutdown_stream(conn_.quic(), id_, NGHTTP3_H3_INTERNAL_ERROR);
    file_active_ = false;
    return NGHTTP3_ERR_WOULDBLOCK;
  }
  size_t n = 0;
  auto hand_out = [&] {
    while (next_chunk_ < chunks_.size() && n < veccnt) {
      auto& c = chunks_[next_chunk_++];
      vec[n].base = reinterpret_cast<uint8_t*>(c.data());
      vec[n].len = c.size();
      unsent_ -= c.size();
      body_bytes_ += c.size();
      http::add(http::metrics().proto[http::ProcessMetrics::kHttp3].response_bytes, c.size());
      ++n;
    }
  };
  hand_out();
  if (producer_ && wants_writable_ && unsent_ < kLowWater) {
    // The producer may write (queued only: we are inside nghttp3) or end right here.
    wants_writable_ = false;
    in_read_ = true;
    producer_->on_writable(*this);
    in_read_ = false;
    hand_out();
  }
  if (n == 0 && !eof_) {
    blocked_ = true;
    return NGHTTP3_ERR_WOULDBLOCK;
  }
  if (next_chunk_ == chunks_.size() && eof_ && !file_active_) *pflags |= NGHTTP3_DATA_FLAG_EOF;
  return static_cast<nghttp3_ssize>(n);
}

void H3Stream::acked(uint64_t n) {
  while (n > 0 && !chunks_.empty() && next_chunk_ > 0) {
    uint64_t left = chunks_.front().size() - front_acked_;
    if (n < left) {
      front_acked_ += n;
      return;
    }
    n -= left;
    chunks_.pop_front();
    --next_chunk_;
    front_acked_ = 0;
  }
}

void H3Stream::resume() {
  if (!blocked_ || in_read_ || !conn_.h3()) return;
  blocked_ = false;
  nghttp3_conn_resume_stream(conn_.h3(), id_);
  conn_.schedule_write();
}

bool H3Stream::write(std::string_view data) {
  if (finished_ || eof_ || cut_) return false;
  if (!data.empty()) add_chunk(std::string(data));
  resume();
  if (unsent_ >= kHighWater) {
    wants_writable_ = true;
    return false;
  }
  return true;
}

void H3Stream::end() {
  if (finished_ || eof_ || cut_) return;
  eof_ = true;
  if (producer_) conn_.endpoint().loop().destroy_later(std::move(producer_));
  resume();  // if nghttp3 was told to wait, it must ask again to see the EOF
}

// The body's source failed: the stream is reset (H3_INTERNAL_ERROR), so the client never takes
// what came for the whole body (an HTTP/3 body has no framing of its own to show the cut).
void H3Stream::abort() {
  if (finished_ || eof_ || cut_) return;
  cut_ = true;
  if (producer_) conn_.endpoint().loop().destroy_later(std::move(producer_));
  (void)ngtcp2_conn_shutdown_stream(conn_.quic(), id_, NGHTTP3_H3_INTERNAL_ERROR);
  conn_.schedule_write();
}

void H3Stream::respond(http::Response response) {
  if (finished_ || !deferred_) return;
  conn_.endpoint().loop().destroy_later(std::move(deferred_));
  if (std::holds_alternative<http::DeferredBody>(response.body))
    response = http::Response::status_only(500);
  submit(response);
  conn_.schedule_write();
}

void H3Stream::abort_producers() {
  auto& loop = conn_.endpoint().loop();
  if (deferred_) {
    auto d = std::move(deferred_);
    d->on_abort();
    loop.destroy_later(std::move(d));
  }
  if (producer_) {
    auto p = std::move(producer_);
    p->on_abort();
    loop.destroy_later(std::move(p));
  }
}

void H3Stream::access_log() {
  auto& tcp = conn_.endpoint().tcp();
  if (!tcp.options().access_log || !in_request_) return;
  auto peer = conn_.peer().text();
  core::AccessRecord r;
  r.time = tcp.log_time();
  r.remote = peer;
  r.method = log_method_.empty() ? req_.method_name : log_method_;
  r.target = log_target_.empty() ? req_.target : log_target_;
  r.proto = "h3";
  r.status = status_ ? status_ : 499;
  r.bytes = body_bytes_;
  r.duration_ms = conn_.endpoint().loop().now() - started_ms_;
  r.traceparent = req_.traceparent();
  if (req_.upstream.proxied) {
    r.proxied = true;
    r.address = req_.upstream.address;
    r.worker_pid = req_.upstream.worker_pid;
    r.cold = req_.upstream.cold;
  }
  r.referer = log_referer_;
  r.user_agent = log_agent_;
  if (req_.principal) r.user = req_.principal->id;
  tcp.log().access(r);
}

// The response head goes out (/metrics, http/metrics.h): as the HTTP/1.1 connection counts it.
void H3Stream::count_response_head() {
  http::ProcessMetrics& m = http::metrics();
  uint64_t us = http::elapsed_us(started_us_, conn_.endpoint().loop().now_us());
  m.response_head(http::ProcessMetrics::kHttp3, us);
  if (req_.upstream.cold)
    if (int kind = http::metrics_kind(req_.upstream.address); kind >= 0)
      m.first_response[kind].observe(http::kStartBoundsUs, us);
}

void H3Stream::finish() {
  if (finished_) return;
  finished_ = true;
  abort_producers();
  if (in_request_ && status_)
    http::metrics().request_done(http::ProcessMetrics::kHttp3, status_,
                                 http::elapsed_us(started_us_, conn_.endpoint().loop().now_us()));
  access_log();
  if (in_request_) {
    in_request_ = false;
    conn_.stream_request_finished();
  }
}

}  // namespace corral::quic
