// Http3Server: HTTP/3 (QUIC v1, ngtcp2 0.12 + nghttp3 0.8 over GnuTLS) for one server process,
// next to the TCP http::Server on the same port number over UDP. It serves the TCP server's
// published Site with the same admission policy, Date header and access log, so a route answers
// the same over HTTP/1.1, TLS and HTTP/3 (docs/http3.md).
//
// One process is slot `ctx.slot` of a fan-out: every connection ID it issues carries the slot and
// the deployment tag (steering.h). Datagrams the kernel hands to the wrong process are forwarded
// to their owner over the forwarding sockets (forward.h); datagrams forwarded to us are served as
// if they had arrived on our UDP socket for their local address. During SIGHUP reloads the new
// process of a slot and the old ones still draining share its UDP socket; every CID carries its
// generation's index, and each hands the others' datagrams over through the slot's pair of that
// index (dispatch.h).
//
// Lifetime: construct after the http::Server (it borrows it, its loop and its logger), start(),
// close(done) on shutdown (GOAWAY, drain up to the server's close_timeout, then CONNECTION_CLOSE
// for what is left), destroy before the http::Server. Single-threaded, on the server's loop.
// RunOptions::on_server returns it as a Companion{keep, close}.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "http/server.h"
#include "quic/context.h"

namespace corral::quic {

struct Http3Options {
  uint32_t idle_timeout_ms = 30'000;
  RetryMode retry = RetryMode::kAuto;
  // kAuto: Retry is required while new-connection Initials arrive faster than this per second in
  // this process (a flood of spoofed Initials then costs the attacker a round trip each, and us
  // no handshake state). 1000/s is far above what a healthy process sees from real clients
  // (10k connections renewing every 10 s), and far below what a single flooding host can send.
  uint32_t retry_auto_initials_per_sec = 1000;
  // Flow control: the receive windows auto-tune up to these (an upload of the body limit, or a
  // request stream; downloads are bounded by the client's windows).
  uint64_t max_window = 24ull << 20;
  uint64_t max_stream_window = 16ull << 20;
  // Above it, an Initial from a validated address is dropped; an unvalidated one gets a Retry
  // (kAuto, kOn) or is dropped (kOff): the cap never comes before the Retry decision.
  size_t max_connections = 10'000;
  uint32_t max_streams_bidi = 100;
  // Handshakes in progress from addresses that did not prove themselves (no Retry or NEW_TOKEN
  // token): the state a spoofed flood can make. At the cap kAuto sends Retry to every further
  // unvalidated Initial, kOff drops them. Each holds ~60 KiB until it completes or times out.
  size_t max_unvalidated_handshakes = 256;
  // How long such a handshake may take (a validated one gets ngtcp2's 10 s): a real client needs
  // a few round trips; a spoofed one never completes and is dropped silently after this.
  uint32_t unvalidated_handshake_timeout_ms = 5'000;
  // Stateless answers per second at most, each as a token bucket with one second of burst:
  // Retry, Version Negotiation and INVALID_TOKEN closes (each smaller than the >= 1200-byte
  // datagram it answers) share `retries_per_sec`; stateless resets (each smaller than its
  // trigger, for a connection we lost) have their own.
  uint32_t retries_per_sec = 10'000;
  uint32_t stateless_resets_per_sec = 200;
};

struct Http3Stats {
  uint64_t connections_active = 0;
  uint64_t handshakes = 0;
  uint64_t requests = 0;
  uint64_t packets_in = 0;
  uint64_t packets_out = 0;
  uint64_t forwarded_out = 0;  // datagrams we sent to their owning slot
  uint64_t forwarded_in = 0;   // datagrams another slot (or generation) forwarded to us
  // Datagrams we sent to the other SIGHUP generation of our slot: its connections' packets, and
  // new connections while we drain (dispatch.h).
  uint64_t forwarded_generation = 0;
  uint64_t stateless_resets = 0;
  uint64_t retries_sent = 0;
  uint64_t version_negotiations = 0;
  // Stateless answers not sent because their token bucket was empty (the datagram was dropped).
  uint64_t retries_limited = 0;  // Retry, Version Negotiation, INVALID_TOKEN
  uint64_t stateless_resets_limited = 0;
  uint64_t handshakes_unvalidated = 0;  // now: unvalidated handshakes in progress
  uint64_t handshake_timeouts = 0;      // handshakes dropped unfinished
  uint64_t initials_refused = 0;        // new-connection Initials dropped by a cap
  uint64_t requests_incomplete = 0;     // request streams ended before HEADERS (stream error)
  uint64_t dropped = 0;                 // undecodable, unowned, refused or undeliverable datagrams
};

class Endpoint;

class Http3Server {
 public:
  Http3Server(http::Server& tcp, ProcessContext ctx, Http3Options options);
  ~Http3Server();
  Http3Server(const Http3Server&) = delete;
  Http3Server& operator=(const Http3Server&) = delete;

  // Sets the socket options on ctx.udp_fds and registers them and ctx.forward_rx on the loop.
  core::Result<void> start();
  // Graceful close: GOAWAY to every connection, drain up to tcp.options().close_timeout_ms, then
  // CONNECTION_CLOSE the rest; `done` once no connection is left.
  void close(std::function<void()> done);
  const Http3Stats& stats() const;
  SteeringMode steering_mode() const;
  // The steering mode and the counters, as the control API's GET /processes shows them.
  nlohmann::json stats_json() const;
  int slot() const;

 private:
  std::unique_ptr<Endpoint> endpoint_;
};

}  // namespace corral::quic
