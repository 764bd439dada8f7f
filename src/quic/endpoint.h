// Endpoint: the packet side of Http3Server (internal to the quic component). It owns the UDP
// sockets' registrations, the connection table and the stateless answers (Version Negotiation,
// Retry, stateless reset, the INVALID_TOKEN close), and routes each datagram:
//   owner slot (steering.h) is another process -> forward it (forward.h), unless it was forwarded
//   to us already; a connection of ours (server CID, or client-chosen DCID + peer address) ->
//   that connection; our slot's CID of the other SIGHUP generation, or a new connection while we
//   drain -> the other generation's forwarding pair (dispatch.h); a new v1 Initial of at least
//   1200 bytes -> Retry, a new connection or nothing (admit_initial in stateless.h: under a
//   flood Retry comes before any cap); any other version -> Version Negotiation (v1 only); a
//   short header with our tag but no connection -> stateless reset. Every stateless answer is
//   smaller than what it answers and comes from a per-process token bucket (RFC 9000 §8.1).
// Receives are batched with recvmmsg (local address from IP_PKTINFO/IPV6_PKTINFO, ECN from the
// TOS byte); sends use one sendmsg per GSO batch (UDP_SEGMENT), falling back to one datagram per
// call when the kernel refuses GSO (EIO).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ngtcp2/ngtcp2.h>

#include "core/event_loop.h"
#include "core/socket.h"
#include "core/timer_wheel.h"
#include "http/server.h"
#include "quic/context.h"
#include "quic/server.h"
#include "quic/stateless.h"

namespace corral::quic {

class H3Connection;

// Monotonic and wall-clock nanoseconds (connections use the first, tokens the second).
uint64_t now_ns();
uint64_t wall_ns();

// A datagram as the endpoint sees it.
struct Datagram {
  const uint8_t* data = nullptr;
  size_t len = 0;
  core::SocketAddress local;
  core::SocketAddress remote;
  uint8_t ecn = 0;
  bool forwarded = false;
};

class Endpoint {
 public:
  Endpoint(http::Server& tcp, ProcessContext ctx, Http3Options options);
  ~Endpoint();

  core::Result<void> start();
  void close(std::function<void()> done);

  // For connections.
  http::Server& tcp() { return tcp_; }
  core::EventLoop& loop() { return loop_; }
  core::Logger& log() { return tcp_.log(); }
  const ProcessContext& ctx() const { return ctx_; }
  const Http3Options& options() const { return options_; }
  Http3Stats& stats() { return stats_; }
  const Http3Stats& stats() const { return stats_; }
  bool closing() const { return closing_; }
  const uint8_t* secret() const { return ctx_.secrets->static_secret; }
  static constexpr size_t kSecretLen = sizeof(Secrets::static_secret);

  // Connection table keys: server CIDs, and client-chosen DCIDs with the peer address.
  static std::string server_key(const uint8_t* cid, size_t len);
  static std::string client_key(const uint8_t* cid, size_t len, const core::SocketAddress& peer);
  bool link(const std::string& key, H3Connection* c);  // false: taken
  void unlink(const std::string& key, H3Connection* c);
  bool cid_taken(const uint8_t* cid, size_t len) const;

  // Sends `len` bytes (`gso` > 0: packets of that size, the last may be shorter) along `path`.
  // Returns false when the socket is full (EAGAIN): nothing was sent, retry when writable.
  enum class SendResult { kSent, kBlocked, kFailed };
  SendResult send(const core::SocketAddress& local, const core::SocketAddress& remote, uint8_t ecn,
                  const uint8_t* data, size_t len, size_t gso);
  // The connection's send was blocked: call its on_writable() when the socket drains.
  void wait_writable(H3Connection* c);
  // Run the connection's write loop after the current batch of input.
  void schedule_write(H3Connection* c);
  // The connection is finished: unlink it and destroy it after this round.
  void remove(H3Connection* c);
  // An unvalidated connection's handshake completed (the address answered): it no longer counts
  // against max_unvalidated_handshakes.
  void handshake_validated(H3Connection* c);
  // One transmit buffer for every connection's write loop (single-threaded; a blocked send keeps
  // its own copy), so an idle connection holds no packet memory.
  std::vector<uint8_t>& tx_buffer() { return tx_buf_; }

 private:
  struct Socket;
  struct ForwardSocket;
  friend struct Socket;
  friend struct ForwardSocket;

  void on_readable(Socket& s);
  void on_writable(Socket& s);
  void on_forwarded();
  void process(Socket& s, const Datagram& d);
  void handle_new(Socket& s, const Datagram& d, const ngtcp2_version_cid& vc);
  void send_version_negotiation(Socket& s, const Datagram& d, const ngtcp2_version_cid& vc);
  void send_retry(Socket& s, const Datagram& d, const ngtcp2_pkt_hd& hd);
  void send_invalid_token(Socket& s, const Datagram& d, const ngtcp2_pkt_hd& hd);
  void send_stateless_reset(Socket& s, const Datagram& d, const uint8_t* dcid, size_t dcidlen);
  void send_raw(Socket& s, const Datagram& d, const uint8_t* data, size_t len);
  // A stateless answer (Retry, Version Negotiation, INVALID_TOKEN) may go: false (counted) when
  // the per-process bucket is empty.
  bool take_stateless_token();
  Socket* socket_for(const core::SocketAddress& local);
  void flush_writes();
  void drain_tick();
  void maybe_finish_close();
  void trim_memory();

  http::Server& tcp_;
  core::EventLoop& loop_;
  ProcessContext ctx_;
  Http3Options options_;
  Http3Stats stats_;
  std::vector<std::unique_ptr<Socket>> sockets_;
  std::unique_ptr<ForwardSocket> forward_;
  std::unordered_map<std::string, H3Connection*> table_;
  std::unordered_map<H3Connection*, std::unique_ptr<H3Connection>> conns_;
  std::vector<H3Connection*> dirty_;
  bool flush_scheduled_ = false;
  std::vector<H3Connection*> blocked_;
  bool gso_ = true;
  PerSecond initials_;           // new-connection Initials (RetryMode::kAuto)
  TokenBucket retry_bucket_;     // Retry, Version Negotiation, INVALID_TOKEN
  TokenBucket reset_bucket_;     // stateless resets
  size_t unvalidated_ = 0;       // handshakes in progress from unvalidated addresses
  size_t peak_connections_ = 0;  // since the last trim_memory
  // Receive buffers (recvmmsg).
  std::vector<uint8_t> rx_buf_;
  std::vector<uint8_t> tx_buf_;
  bool closing_ = false;
  std::function<void()> close_done_;
  core::Timer close_timer_;  // close_timeout: CONNECTION_CLOSE whatever is left
  core::Timer tick_;         // while closing: GOAWAY steps; while a site is missing: parked
  core::Timer trim_timer_;   // after a wave of connections: give the free heap back
  uint64_t close_started_ms_ = 0;
  uint64_t goaways_ = 0;  // GOAWAYs sent while closing (log)
};

}  // namespace corral::quic
