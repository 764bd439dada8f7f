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

H3Stream::H3Stream(H3Connection& conn, int64_t id)
    : conn_(conn),
      id_(id),
      exchange_(conn.endpoint().tcp(), *this, http::Protocol::kHttp3, conn.peer()) {
  exchange_.start_clock();
}

H3Stream::~H3Stream() {
  finish();
}

bool H3Stream::add_body(const uint8_t* data, size_t len) {
  if (exchange_.head_out()) return false;
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
  if (exchange_.head_out() || finished_) return;
  dispatch();
}

void H3Stream::dispatch() {
  auto& ep = conn_.endpoint();
  auto& tcp = ep.tcp();
  ++ep.stats().requests;
  exchange_.count_in_flight();
  http::Request& req = exchange_.request();
  req.reset();
  RequestHead::Limits limits;
  limits.max_bytes = tcp.options().limits.max_head_bytes;
  limits.max_fields = tcp.options().limits.max_headers;
  if (int status = head_.build(req, limits)) {
    respond_error(status, head_.reason());
    return;
  }
  req.body = body_;
  req.scheme = "https";  // a relay's forwarding headers may say otherwise (admission)
  auto d = exchange_.dispatch();
  if (d.kind == http::Exchange::Dispatch::kRefused) {
    respond_error(d.status, d.reason);
  } else if (d.kind == http::Exchange::Dispatch::kParked) {
    parked_ = true;
    park_deadline_ms_ = ep.loop().now() + tcp.options().ready_timeout_ms;
  }
}

void H3Stream::retry_parked() {
  if (!parked_ || finished_) return;
  if (!conn_.endpoint().tcp().site()) {
    if (conn_.endpoint().loop().now() >= park_deadline_ms_) park_expired();
    return;
  }
  parked_ = false;
  exchange_.run_site();
  conn_.schedule_write();
}

void H3Stream::park_expired() {
  parked_ = false;
  respond_error(503, "no site published within ready_timeout");
  conn_.schedule_write();
}

void H3Stream::respond_error(int status, std::string_view reason) {
  if (exchange_.head_out()) return;
  if (!exchange_
           .begun()) {  // refused before dispatch (413 while the body arrives): still a request
    ++conn_.endpoint().stats().requests;
    exchange_.count_in_flight();
  }
  exchange_.respond_error(status, reason);
}

void H3Stream::submit_head(const H3Head& head, bool with_body) {
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
  if (!conn_.h3()) return;
  int rv = nghttp3_conn_submit_response(conn_.h3(), id_, head.data(), head.size(),
                                        with_body ? &reader : nullptr);
  if (rv != 0) {
    conn_.endpoint().tcp().log().warn("h3_submit_response", "error=\"{}\"", nghttp3_strerror(rv));
    ngtcp2_conn_shutdown_stream(conn_.quic(), id_, NGHTTP3_H3_INTERNAL_ERROR);
  }
  conn_.schedule_write();
}

void H3Stream::send_head(http::ResponsePlan& plan) {
  switch (plan.body) {
    case http::BodyKind::kBytes: {
      bool with_body = plan.send_body && !plan.bytes.empty();
      if (with_body) {
        add_chunk(plan.take_bytes());
        eof_ = true;
      }
      submit_head(H3Head(plan), with_body);
      return;
    }
    case http::BodyKind::kFile:
      submit_head(H3Head(plan), true);  // send_file() follows
      return;
    case http::BodyKind::kStream:
      submit_head(H3Head(plan), plan.send_body);  // send_data()... end_stream()
      return;
    default:
      submit_head(H3Head(plan), false);
      return;
  }
}

void H3Stream::send_file(http::FileCursor& file) {
  file_ = &file;
  file_active_ = true;
}

void H3Stream::add_chunk(std::string data) {
  if (data.empty()) return;
  unsent_ += data.size();
  chunks_.push_back(std::move(data));
}

bool H3Stream::fill_file() {
  // The next pieces of a file body: framing text as is, file ranges read in chunks.
  for (size_t i = 0; i < kFileChunksPerRead && file_active_;) {
    if (!file_->active()) {
      file_active_ = false;
      file_ = nullptr;
      eof_ = true;
      exchange_.file_done();
      return true;
    }
    http::FileSegment seg = file_->current();
    if (!seg.text.empty()) {
      add_chunk(std::string(seg.text));  // a chunk lives until acked; the file may go first
      file_->advance(seg.text.size());
      continue;
    }
    size_t want = seg.length > kFileChunk ? kFileChunk : static_cast<size_t>(seg.length);
    std::string chunk(want, '\0');
    ssize_t n = ::pread(file_->fd(), chunk.data(), want, static_cast<off_t>(seg.offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The file shrank under us or cannot be read: the announced length cannot be kept.
      conn_.endpoint().log().warn("file_read_failed", "remote={} error=\"{}\" proto=h3",
                                  conn_.peer().text(), n == 0 ? "file truncated" : strerror(errno));
      return false;
    }
    chunk.resize(static_cast<size_t>(n));
    file_->advance(static_cast<uint64_t>(n));
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
      http::add(http::metrics().proto[http::ProcessMetrics::kHttp3].response_bytes, c.size());
      ++n;
    }
  };
  hand_out();
  if (exchange_.wants_writable() && unsent_ < kLowWater) {
    // The producer may write (queued only: we are inside nghttp3) or end right here.
    in_read_ = true;
    exchange_.writable();
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

bool H3Stream::send_data(std::string_view data) {
  if (finished_ || eof_ || cut_) return false;
  add_chunk(std::string(data));
  resume();
  return unsent_ < kHighWater;
}

void H3Stream::end_stream() {
  if (finished_ || eof_ || cut_) return;
  eof_ = true;
  resume();  // if nghttp3 was told to wait, it must ask again to see the EOF
}

// The body's source failed: the stream is reset (H3_INTERNAL_ERROR), so the client never takes
// what came for the whole body (an HTTP/3 body has no framing of its own to show the cut).
void H3Stream::reset_stream() {
  if (finished_ || eof_ || cut_) return;
  cut_ = true;
  (void)ngtcp2_conn_shutdown_stream(conn_.quic(), id_, NGHTTP3_H3_INTERNAL_ERROR);
  conn_.schedule_write();
}

void H3Stream::responded_later() {
  conn_.schedule_write();
}

void H3Stream::finish() {
  if (finished_) return;
  finished_ = true;
  exchange_.peer_gone();
  // A stream that never carried a whole request (closed or reset early) is no request.
  if (exchange_.begun()) exchange_.complete();
}

}  // namespace corral::quic
