// H3Connection (h3_connection.cc) and H3Stream (h3_stream.cc): one QUIC connection (ngtcp2_conn +
// its GnuTLS session) carrying HTTP/3 (nghttp3_conn), and its request streams. A stream collects a
// request (RequestHead, body up to the server's body limit) and hands it to its http::Exchange
// (http/exchange.h), which runs admission, the Site, the ResponsePlan and the body producers as
// for every protocol; the stream is the exchange's ExchangeStream: it serializes the head with
// h3_mapping.h's H3Head and queues the body for nghttp3 to pull through read_data — in-memory
// bodies, files (the exchange's FileCursor, pread in chunks), stream data with backpressure.
// Every body byte handed to nghttp3 stays in memory until the peer acknowledges it.
//
// Lifetime: owned by the Endpoint (connection table), destroyed after the loop round in which it
// finished (idle timeout, closing/draining period over, or a fatal error). Timers: one, at
// ngtcp2_conn_get_expiry rounded up to the millisecond.
#pragma once

#include <gnutls/gnutls.h>
#include <nghttp3/nghttp3.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/timer_wheel.h"
#include "http/admission.h"
#include "http/exchange.h"
#include "http/file_response.h"
#include "http/request.h"
#include "http/response.h"
#include "http/response_plan.h"
#include "quic/endpoint.h"
#include "quic/h3_mapping.h"

namespace corral::quic {

class H3Connection;

class H3Stream final : private http::ExchangeStream {
 public:
  H3Stream(H3Connection& conn, int64_t id);
  ~H3Stream();

  int64_t id() const { return id_; }
  RequestHead& head() { return head_; }
  // Request body bytes; false when past the body limit (413 has been answered).
  bool add_body(const uint8_t* data, size_t len);
  void headers_done();
  void request_done();  // end of the request stream: admit, handle, respond
  bool parked() const { return parked_; }
  void retry_parked();  // the site may be published now
  void park_expired();  // ready_timeout passed without a site: 503
  nghttp3_ssize read_data(nghttp3_vec* vec, size_t veccnt, uint32_t* pflags);
  void acked(uint64_t n);
  // The stream is gone (closed, reset, or the connection is going away).
  void finish();

 private:
  void dispatch();
  void submit_head(const H3Head& head, bool with_body);
  void respond_error(int status, std::string_view reason);
  bool fill_file();
  void add_chunk(std::string data);
  void resume();
  // ExchangeStream: the head as an H3Head, the body pulled by nghttp3 through read_data.
  void send_head(http::ResponsePlan& plan) override;
  void send_file(http::FileCursor& file) override;
  bool send_data(std::string_view data) override;
  void end_stream() override;
  void reset_stream() override;
  size_t buffered() const override { return unsent_; }
  void responded_later() override;

  H3Connection& conn_;
  int64_t id_;
  RequestHead head_;
  std::string body_;
  bool parked_ = false;
  bool finished_ = false;
  uint64_t park_deadline_ms_ = 0;
  http::Exchange exchange_;  // the request's life (http/exchange.h)

  // The body, in chunks handed to nghttp3 in order and released in order as they are acked.
  std::deque<std::string> chunks_;
  size_t next_chunk_ = 0;     // first chunk not yet handed out
  uint64_t front_acked_ = 0;  // acked bytes of chunks_.front()
  uint64_t unsent_ = 0;       // bytes in chunks not handed out yet
  bool eof_ = false;          // no chunk will be added any more
  bool cut_ = false;          // reset_stream(): nothing is added any more
  bool blocked_ = false;      // read_data said WOULDBLOCK: resume on new data
  bool in_read_ = false;      // inside read_data (nghttp3 must not be re-entered)
  // A file body: the exchange's cursor, read in chunks as nghttp3 asks.
  http::FileCursor* file_ = nullptr;
  bool file_active_ = false;
};

class H3Connection {
 public:
  // A new server connection for the Initial in `d` (header `hd`). `odcid`: the client's first
  // DCID (recovered from a Retry token when `retried`). `unvalidated`: no token proved the
  // address (a short handshake timeout; counted by the endpoint until the handshake completes).
  // Returns null (and logs) on failure.
  static std::unique_ptr<H3Connection> accept(Endpoint& ep, const Datagram& d,
                                              const ngtcp2_pkt_hd& hd, const ngtcp2_cid& odcid,
                                              bool retried, const ngtcp2_vec& token,
                                              bool unvalidated);
  ~H3Connection();

  // A datagram for this connection.
  void on_datagram(const Datagram& d);
  void write();
  void on_writable();
  // Graceful close steps (Endpoint::close), each timed from this connection's own previous step:
  // a connection whose handshake ends during the close gets its notice then, and its round trip
  // (kGoawayAfterMs, or two smoothed RTTs, from its handshake's end) before the GOAWAY that refuses
  // new requests, so its first requests, sent right after the handshake, are served instead of
  // rejected (H3_REQUEST_REJECTED).
  static constexpr uint64_t kGoawayAfterMs = 100;
  void shutdown_notice();
  bool goaway(uint64_t now_ms);  // true: sent now (not before, and not before its round trip)
  bool has_streams() const { return !streams_.empty(); }
  // Done with: GOAWAY sent a round trip ago and no stream left. A connection still in its
  // handshake is not (close_timeout bounds it).
  bool closable(uint64_t now_ms) const {
    return goaway_sent_ && streams_.empty() && now_ms - goaway_ms_ >= kGoawayAfterMs;
  }
  void close_now();  // CONNECTION_CLOSE (H3_NO_ERROR), then gone
  void tick_parked(uint64_t now_ms);
  bool parked_any() const;
  bool finished() const { return state_ == State::kGone; }
  bool unvalidated() const { return unvalidated_; }
  void set_validated() { unvalidated_ = false; }

  Endpoint& endpoint() { return ep_; }
  ngtcp2_conn* quic() { return conn_; }
  nghttp3_conn* h3() { return h3_; }
  const http::Peer& peer() const { return peer_; }
  const core::SocketAddress& peer_address() const { return remote_; }
  void schedule_write() { ep_.schedule_write(this); }
  void stream_request_started() { ep_.tcp().request_started(); }
  void stream_request_finished() { ep_.tcp().request_finished(); }
  std::vector<std::string>& keys() { return keys_; }

 private:
  enum class State { kOpen, kClosing, kDraining, kGone };
  H3Connection(Endpoint& ep, const Datagram& d);
  bool init(const ngtcp2_pkt_hd& hd, const ngtcp2_cid& odcid, bool retried,
            const ngtcp2_vec& token);
  void answer_closing(const Datagram& d);
  bool setup_tls();
  int setup_h3();
  void handle_error(int rv);
  void start_closing(const ngtcp2_connection_close_error& err);
  void enter_closed_period(State s);
  void gone();
  void arm_timer();
  void on_timer();
  bool flush_pending();
  H3Stream* stream(int64_t id);

  // ngtcp2 callbacks
  static int on_recv_stream_data(ngtcp2_conn*, uint32_t flags, int64_t sid, uint64_t offset,
                                 const uint8_t* data, size_t len, void* ud, void* sud);
  static int on_acked_stream_data_offset(ngtcp2_conn*, int64_t sid, uint64_t offset, uint64_t len,
                                         void* ud, void* sud);
  static int on_stream_close(ngtcp2_conn*, uint32_t flags, int64_t sid, uint64_t code, void* ud,
                             void* sud);
  static int on_stream_reset(ngtcp2_conn*, int64_t sid, uint64_t final_size, uint64_t code,
                             void* ud, void* sud);
  static int on_stream_stop_sending(ngtcp2_conn*, int64_t sid, uint64_t code, void* ud, void* sud);
  static int on_extend_max_remote_streams_bidi(ngtcp2_conn*, uint64_t max, void* ud);
  static int on_extend_max_stream_data(ngtcp2_conn*, int64_t sid, uint64_t max, void* ud,
                                       void* sud);
  static int on_recv_tx_key(ngtcp2_conn*, ngtcp2_crypto_level level, void* ud);
  static int on_handshake_completed(ngtcp2_conn*, void* ud);
  static int on_get_new_connection_id(ngtcp2_conn*, ngtcp2_cid* cid, uint8_t* token, size_t cidlen,
                                      void* ud);
  static int on_remove_connection_id(ngtcp2_conn*, const ngtcp2_cid* cid, void* ud);
  static void on_rand(uint8_t* dest, size_t len, const ngtcp2_rand_ctx*);
  static ngtcp2_conn* get_conn(ngtcp2_crypto_conn_ref* ref);

  // nghttp3 callbacks
  static int h3_acked_stream_data(nghttp3_conn*, int64_t sid, uint64_t len, void* ud, void* sud);
  static int h3_stream_close(nghttp3_conn*, int64_t sid, uint64_t code, void* ud, void* sud);
  static int h3_recv_data(nghttp3_conn*, int64_t sid, const uint8_t* data, size_t len, void* ud,
                          void* sud);
  static int h3_deferred_consume(nghttp3_conn*, int64_t sid, size_t consumed, void* ud, void* sud);
  static int h3_begin_headers(nghttp3_conn*, int64_t sid, void* ud, void* sud);
  static int h3_recv_header(nghttp3_conn*, int64_t sid, int32_t token, nghttp3_rcbuf* name,
                            nghttp3_rcbuf* value, uint8_t flags, void* ud, void* sud);
  static int h3_end_headers(nghttp3_conn*, int64_t sid, int fin, void* ud, void* sud);
  static int h3_end_stream(nghttp3_conn*, int64_t sid, void* ud, void* sud);
  static int h3_stop_sending(nghttp3_conn*, int64_t sid, uint64_t code, void* ud, void* sud);
  static int h3_reset_stream(nghttp3_conn*, int64_t sid, uint64_t code, void* ud, void* sud);
  static nghttp3_ssize h3_read_data(nghttp3_conn*, int64_t sid, nghttp3_vec* vec, size_t veccnt,
                                    uint32_t* pflags, void* ud, void* sud);

  Endpoint& ep_;
  core::SocketAddress local_;
  core::SocketAddress remote_;
  http::Peer peer_;
  ngtcp2_conn* conn_ = nullptr;
  gnutls_session_t session_ = nullptr;
  nghttp3_conn* h3_ = nullptr;
  ngtcp2_crypto_conn_ref conn_ref_{};
  ngtcp2_connection_close_error last_error_{};
  std::map<int64_t, std::unique_ptr<H3Stream>> streams_;
  std::vector<std::string> keys_;  // table keys linked to this connection
  core::Timer timer_;
  State state_ = State::kOpen;
  std::string close_pkt_;  // the CONNECTION_CLOSE we answer with while closing
  uint64_t close_sends_ = 0;
  // While unvalidated, what the peer sent and what we answered in the closing period: we never
  // send more than 3x what an unvalidated address sent (RFC 9000 §8.1).
  uint64_t closing_in_ = 0, closing_out_ = 0;
  bool unvalidated_ = false;
  bool handshake_done_ = false;
  bool goaway_sent_ = false;
  bool notice_sent_ = false;
  // Loop time of the handshake's end, the shutdown notice and the GOAWAY.
  uint64_t handshake_ms_ = 0, notice_ms_ = 0, goaway_ms_ = 0;
  // A send the socket refused (EAGAIN), retried when it is writable.
  std::string pending_;
  size_t pending_gso_ = 0;
  uint8_t pending_ecn_ = 0;
  core::SocketAddress pending_local_, pending_remote_;
};

}  // namespace corral::quic
