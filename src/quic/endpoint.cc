#include "quic/endpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <gnutls/crypto.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "http/metrics.h"
#include "quic/dispatch.h"
#include "quic/forward.h"
#include "quic/h3_connection.h"
#include "quic/stateless.h"
#include "quic/steering.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

namespace corral::quic {

static_assert(NGTCP2_VERSION_NUM == 0x000c01, "built for ngtcp2 0.12.1 (Debian 12)");
static_assert(NGHTTP3_VERSION_NUM == 0x000800, "built for nghttp3 0.8.0 (Debian 12)");

namespace {

constexpr size_t kBatch = 32;             // datagrams per recvmmsg
constexpr size_t kMaxDatagram = 65536;    // what one recvmmsg slot holds (no GRO)
constexpr int kMaxBatchesPerWakeup = 16;  // then let other sockets and timers run
constexpr int kSocketBuffer = 4 << 20;    // SO_RCVBUF / SO_SNDBUF asked for (capped by sysctl)
// How old a Retry token may be: one round trip, generously.
constexpr uint64_t kRetryTokenTimeoutNs = 10ull * NGTCP2_SECONDS;
constexpr uint64_t kRegularTokenTimeoutNs = 3600ull * NGTCP2_SECONDS;
constexpr uint32_t kTickMs = 20;
// Returning memory after a wave of connections: when the table falls to a quarter of a peak of
// at least this many, the free heap goes back to the kernel (see trim_memory).
constexpr size_t kTrimPeak = 1024;

size_t rss_kib() {
  long pages = 0, resident = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE)) / 1024;
}

uint64_t clock_ns(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

const ngtcp2_sockaddr* sa(const core::SocketAddress& a) {
  return reinterpret_cast<const ngtcp2_sockaddr*>(&a.storage);
}

bool same_ip(const core::SocketAddress& a, const core::SocketAddress& b) {
  if (a.family() != b.family()) return false;
  if (a.family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&b.storage)->sin_addr.s_addr;
  return memcmp(&reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr,
                &reinterpret_cast<const sockaddr_in6*>(&b.storage)->sin6_addr, 16) == 0;
}

bool is_wildcard(const core::SocketAddress& a) {
  if (a.family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr == INADDR_ANY;
  const auto& in6 = reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr;
  return memcmp(&in6, &in6addr_any, sizeof in6) == 0;
}

}  // namespace

uint64_t now_ns() {
  return clock_ns(CLOCK_MONOTONIC);
}
uint64_t wall_ns() {
  return clock_ns(CLOCK_REALTIME);
}

struct Endpoint::Socket final : core::IoHandler {
  Endpoint* ep = nullptr;
  int fd = -1;
  core::SocketAddress local;
  bool want_out = false;
  void on_io(uint32_t events) override {
    if (events & EPOLLOUT) ep->on_writable(*this);
    if (events & (EPOLLIN | EPOLLERR)) ep->on_readable(*this);
  }
};

struct Endpoint::ForwardSocket final : core::IoHandler {
  Endpoint* ep = nullptr;
  int fd = -1;
  void on_io(uint32_t) override { ep->on_forwarded(); }
};

Endpoint::Endpoint(http::Server& tcp, ProcessContext ctx, Http3Options options)
    : tcp_(tcp),
      loop_(tcp.loop()),
      ctx_(std::move(ctx)),
      options_(options),
      retry_bucket_(options.retries_per_sec, options.retries_per_sec),
      reset_bucket_(options.stateless_resets_per_sec, options.stateless_resets_per_sec),
      close_timer_(loop_.timers(), nullptr),
      tick_(loop_.timers(), nullptr),
      trim_timer_(loop_.timers(), nullptr) {
  close_timer_.bind(loop_.timers(), [this] {
    std::vector<H3Connection*> all;
    for (auto& [c, owned] : conns_) all.push_back(c);
    for (auto* c : all) c->close_now();
    maybe_finish_close();
  });
  tick_.bind(loop_.timers(), [this] { drain_tick(); });
  trim_timer_.bind(loop_.timers(), [this] { trim_memory(); });
}

Endpoint::~Endpoint() {
  for (auto& s : sockets_) loop_.remove(s->fd);
  if (forward_) loop_.remove(forward_->fd);
  dirty_.clear();
  blocked_.clear();
  conns_.clear();
}

core::Result<void> Endpoint::start() {
  if (!ctx_.secrets) return core::Error{EINVAL, "quic: no secrets in the process context"};
  if (!ctx_.credentials) return core::Error{EINVAL, "quic: no TLS credentials"};
  if (ctx_.udp_fds.empty()) return core::Error{EINVAL, "quic: no UDP socket"};
  rx_buf_.resize(kBatch * kMaxDatagram);
  for (int fd : ctx_.udp_fds) {
    auto s = std::make_unique<Socket>();
    s->ep = this;
    s->fd = fd;
    auto local = core::local_address(fd);
    if (!local) return local.error();
    s->local = local.value();
    int one = 1;
    int family = s->local.family();
    (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (family == AF_INET) {
      // Local address per datagram (wildcard binds), ECN from the TOS byte, DF set so that
      // ngtcp2's path MTU discovery probes are not fragmented.
      if (setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) != 0)
        return core::errno_error("setsockopt(IP_PKTINFO)");
      (void)setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof one);
      int pmtu = IP_PMTUDISC_DO;
      (void)setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    } else if (family == AF_INET6) {
      if (setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof one) != 0)
        return core::errno_error("setsockopt(IPV6_RECVPKTINFO)");
      (void)setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof one);
      int pmtu = IPV6_PMTUDISC_DO;
      (void)setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu);
    } else {
      return core::Error{EINVAL, "quic: UDP socket is neither IPv4 nor IPv6"};
    }
    int buf = kSocketBuffer;
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    if (auto r = loop_.add(fd, EPOLLIN, s.get()); !r) return r.error();
    sockets_.push_back(std::move(s));
  }
  if (ctx_.forward_rx >= 0) {
    forward_ = std::make_unique<ForwardSocket>();
    forward_->ep = this;
    forward_->fd = ctx_.forward_rx;
    (void)fcntl(ctx_.forward_rx, F_SETFL, fcntl(ctx_.forward_rx, F_GETFL) | O_NONBLOCK);
    if (auto r = loop_.add(ctx_.forward_rx, EPOLLIN, forward_.get()); !r) return r.error();
  }
  log().info("quic_listening", "slot={} generation={} steering={} sockets={} retry={}", ctx_.slot,
             ctx_.generation, steering_name(ctx_.mode), sockets_.size(),
             options_.retry == RetryMode::kOn    ? "on"
             : options_.retry == RetryMode::kOff ? "off"
                                                 : "auto");
  return {};
}

std::string Endpoint::server_key(const uint8_t* cid, size_t len) {
  std::string k(1, 'S');
  k.append(reinterpret_cast<const char*>(cid), len);
  return k;
}

std::string Endpoint::client_key(const uint8_t* cid, size_t len, const core::SocketAddress& peer) {
  std::string k(1, 'C');
  k.append(reinterpret_cast<const char*>(cid), len);
  k.append(reinterpret_cast<const char*>(&peer.storage), peer.len);
  return k;
}

bool Endpoint::link(const std::string& key, H3Connection* c) {
  return table_.emplace(key, c).second;
}

void Endpoint::unlink(const std::string& key, H3Connection* c) {
  auto it = table_.find(key);
  if (it != table_.end() && it->second == c) table_.erase(it);
}

bool Endpoint::cid_taken(const uint8_t* cid, size_t len) const {
  return table_.count(server_key(cid, len)) != 0;
}

Endpoint::Socket* Endpoint::socket_for(const core::SocketAddress& local) {
  for (auto& s : sockets_) {
    if (s->local.family() != local.family() || s->local.port() != local.port()) continue;
    if (is_wildcard(s->local) || same_ip(s->local, local)) return s.get();
  }
  return nullptr;
}

// ----------------------------------------------------------------------------------------------
// Receiving

void Endpoint::on_readable(Socket& s) {
  mmsghdr msgs[kBatch];
  iovec iovs[kBatch];
  sockaddr_storage names[kBatch];
  alignas(cmsghdr) char ctrl[kBatch][128];
  for (int round = 0; round < kMaxBatchesPerWakeup; ++round) {
    for (size_t i = 0; i < kBatch; ++i) {
      iovs[i].iov_base = rx_buf_.data() + i * kMaxDatagram;
      iovs[i].iov_len = kMaxDatagram;
      memset(&msgs[i], 0, sizeof msgs[i]);
      msgs[i].msg_hdr.msg_name = &names[i];
      msgs[i].msg_hdr.msg_namelen = sizeof names[i];
      msgs[i].msg_hdr.msg_iov = &iovs[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_control = ctrl[i];
      msgs[i].msg_hdr.msg_controllen = sizeof ctrl[i];
    }
    int n = recvmmsg(s.fd, msgs, kBatch, MSG_DONTWAIT, nullptr);
    if (n <= 0) return;
    for (int i = 0; i < n; ++i) {
      auto& h = msgs[i].msg_hdr;
      if (h.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        ++stats_.packets_in;
        ++stats_.dropped;
        continue;
      }
      Datagram d;
      d.data = rx_buf_.data() + static_cast<size_t>(i) * kMaxDatagram;
      d.len = msgs[i].msg_len;
      d.remote.len = h.msg_namelen;
      memcpy(&d.remote.storage, &names[i], h.msg_namelen);
      d.local = s.local;
      for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
          in_pktinfo pi;
          memcpy(&pi, CMSG_DATA(c), sizeof pi);
          reinterpret_cast<sockaddr_in*>(&d.local.storage)->sin_addr = pi.ipi_addr;
        } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
          d.ecn = *reinterpret_cast<const uint8_t*>(CMSG_DATA(c)) & 0x3;
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
          in6_pktinfo pi;
          memcpy(&pi, CMSG_DATA(c), sizeof pi);
          reinterpret_cast<sockaddr_in6*>(&d.local.storage)->sin6_addr = pi.ipi6_addr;
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
          int tclass;
          memcpy(&tclass, CMSG_DATA(c), sizeof tclass);
          d.ecn = static_cast<uint8_t>(tclass & 0x3);
        }
      }
      process(s, d);
    }
    if (static_cast<size_t>(n) < kBatch) return;
  }
}

void Endpoint::on_forwarded() {
  uint8_t* buf = rx_buf_.data();  // 2 MiB: any forwarded message fits
  for (int i = 0; i < 64; ++i) {
    ssize_t n = recv(forward_->fd, buf, rx_buf_.size(), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    ForwardHeader h;
    Datagram d;
    if (!decode_forwarded(buf, static_cast<size_t>(n), h, &d.data, &d.len) || d.len == 0) {
      ++stats_.dropped;
      continue;
    }
    d.local = h.local;
    d.remote = h.remote;
    d.ecn = h.ecn;
    d.forwarded = true;
    Socket* s = socket_for(d.local);
    if (!s) {
      ++stats_.dropped;
      continue;
    }
    ++stats_.forwarded_in;
    process(*s, d);
  }
}

void Endpoint::process(Socket& s, const Datagram& d) {
  ++stats_.packets_in;
  if (d.len == 0) {  // ngtcp2_pkt_decode_version_cid asserts on an empty datagram
    ++stats_.dropped;
    return;
  }
  ngtcp2_version_cid vc;
  int rv = ngtcp2_pkt_decode_version_cid(&vc, d.data, d.len, kCidLength);
  const bool long_header = (d.data[0] & 0x80) != 0;
  // We speak QUIC v1 only, as our Version Negotiation says: ngtcp2 0.12 would also run draft-29
  // and the v2 draft, so those get Version Negotiation too (issue 11, defect 15).
  if (rv == NGTCP2_ERR_VERSION_NEGOTIATION ||
      (rv == 0 && long_header && vc.version != 0 && vc.version != NGTCP2_PROTO_VER_V1)) {
    send_version_negotiation(s, d, vc);
    return;
  }
  // A long header with version 0 is a Version Negotiation packet, which only servers send.
  if (rv != 0 || (long_header && vc.version == 0)) {
    ++stats_.dropped;
    return;
  }
  const bool ours = cid_is_ours(vc.dcid, vc.dcidlen, ctx_.key.tag);
  std::string key =
      ours ? server_key(vc.dcid, vc.dcidlen) : client_key(vc.dcid, vc.dcidlen, d.remote);
  auto it = table_.find(key);
  // Steering (a datagram the kernel gave to the wrong slot goes to its owner, once) and
  // generations (our slot's old and new process share its UDP socket during a reload).
  DispatchSelf self;
  self.slot = ctx_.slot;
  self.generation = ctx_.generation_index();
  self.steering = ctx_.mode != SteeringMode::kOff && ctx_.key.slots > 1;
  self.closing = closing_;
  DatagramFacts facts;
  facts.forwarded = d.forwarded;
  facts.owner = packet_owner(d.data, d.len, ctx_.key);
  facts.ours = ours;
  facts.cid_generation = ours ? cid_generation(vc.dcid) : 0;
  facts.known = it != table_.end();
  facts.long_header = vc.version != 0;
  facts.serving = ctx_.serving_index(facts.owner != kNoOwner ? facts.owner : ctx_.slot);
  Dispatch to = dispatch(self, facts);
  if (to.route != Route::kHere) {
    int fd = static_cast<size_t>(to.slot) < ctx_.forward_tx.size()
                 ? ctx_.forward_tx[static_cast<size_t>(to.slot)][to.generation]
                 : -1;
    // No pair for the other generation (a single-generation embedding): handle it here.
    if (fd >= 0 || to.route == Route::kToSlot) {
      ForwardHeader h{d.local, d.remote, d.ecn};
      if (fd >= 0 && forward_datagram(fd, h, d.data, d.len)) {
        ++(to.route == Route::kToSlot ? stats_.forwarded_out : stats_.forwarded_generation);
        http::add(http::metrics().quic_forwarded[to.route == Route::kToSlot
                                                     ? http::ProcessMetrics::kToSlot
                                                     : http::ProcessMetrics::kToGeneration]);
      } else {
        ++stats_.dropped;
      }
      return;
    }
  }
  if (it != table_.end()) {
    it->second->on_datagram(d);
    return;
  }
  if (vc.version == 0) {
    // A short header for a connection we do not have: ours (a process that died had it, or it
    // timed out) gets a stateless reset; anything else is noise.
    if (ours) {
      send_stateless_reset(s, d, vc.dcid, vc.dcidlen);
    } else {
      ++stats_.dropped;
    }
    return;
  }
  handle_new(s, d, vc);
}

void Endpoint::handle_new(Socket& s, const Datagram& d, const ngtcp2_version_cid& vc) {
  (void)vc;
  if (closing_) {
    ++stats_.dropped;
    return;
  }
  ngtcp2_pkt_hd hd;
  int rv = ngtcp2_accept(&hd, d.data, d.len);
  // ngtcp2_accept asks for a Retry (NGTCP2_ERR_RETRY) for a 0-RTT packet that came before any
  // Initial, whatever its size: answering it made a 17-byte datagram bring back a 119-byte Retry
  // (issue 11, defect 13). A Retry answers an Initial of at least 1200 bytes only (RFC 9000
  // §8.1, §17.2.5); we have no 0-RTT, and the client's Initial comes anyway. Everything but a
  // >= 1200-byte v1 Initial (what rv == 0 means) is dropped here.
  if (rv != 0 || hd.type != NGTCP2_PKT_INITIAL || d.len < NGTCP2_MAX_UDP_PAYLOAD_SIZE) {
    ++stats_.dropped;
    return;
  }
  initials_.add(loop_.now());

  ngtcp2_cid odcid = hd.dcid;
  bool retried = false, validated = false;
  ngtcp2_vec token{nullptr, 0};
  if (hd.token.len > 0) {
    if (hd.token.base[0] == NGTCP2_CRYPTO_TOKEN_MAGIC_RETRY) {
      if (ngtcp2_crypto_verify_retry_token(&odcid, hd.token.base, hd.token.len, secret(),
                                           kSecretLen, hd.version, sa(d.remote), d.remote.len,
                                           &hd.dcid, kRetryTokenTimeoutNs, wall_ns()) != 0) {
        send_invalid_token(s, d, hd);
        return;
      }
      retried = validated = true;
    } else if (hd.token.base[0] == NGTCP2_CRYPTO_TOKEN_MAGIC_REGULAR) {
      if (ngtcp2_crypto_verify_regular_token(hd.token.base, hd.token.len, secret(), kSecretLen,
                                             sa(d.remote), d.remote.len, kRegularTokenTimeoutNs,
                                             wall_ns()) == 0) {
        validated = true;
        token = hd.token;
      }
    }
  }
  AdmissionFacts f;
  f.mode = options_.retry;
  f.validated = validated;
  f.initials_this_second = initials_.current(loop_.now());
  f.auto_limit = options_.retry_auto_initials_per_sec;
  f.unvalidated = unvalidated_;
  f.max_unvalidated = options_.max_unvalidated_handshakes;
  f.connections = conns_.size();
  f.max_connections = options_.max_connections;
  switch (admit_initial(f)) {
    case Admission::kRetry:
      send_retry(s, d, hd);
      return;
    case Admission::kRefuse:
      ++stats_.initials_refused;
      ++stats_.dropped;
      return;
    case Admission::kAccept:
      break;
  }
  auto c = H3Connection::accept(*this, d, hd, odcid, retried, token, !validated);
  if (!c) {
    ++stats_.dropped;
    return;
  }
  H3Connection* raw = c.get();
  conns_.emplace(raw, std::move(c));
  stats_.connections_active = conns_.size();
  http::store(http::metrics().gauges.connections_open[http::ProcessMetrics::kHttp3],
              static_cast<int64_t>(conns_.size()));
  peak_connections_ = std::max(peak_connections_, conns_.size());
  if (!validated) {
    ++unvalidated_;
    stats_.handshakes_unvalidated = unvalidated_;
  }
  raw->on_datagram(d);
  // An Initial that does not even decrypt (junk that passed ngtcp2_accept) ends it at once.
  if (raw->finished()) ++stats_.dropped;
}

void Endpoint::handshake_validated(H3Connection* c) {
  if (!c->unvalidated()) return;
  c->set_validated();
  if (unvalidated_ > 0) --unvalidated_;
  stats_.handshakes_unvalidated = unvalidated_;
}

bool Endpoint::take_stateless_token() {
  if (retry_bucket_.take(loop_.now())) return true;
  ++stats_.retries_limited;
  ++stats_.dropped;
  return false;
}

void Endpoint::send_raw(Socket& s, const Datagram& d, const uint8_t* data, size_t len) {
  (void)s;
  ++stats_.packets_out;
  (void)send(d.local, d.remote, 0, data, len, 0);
}

void Endpoint::send_version_negotiation(Socket& s, const Datagram& d,
                                        const ngtcp2_version_cid& vc) {
  // Only a datagram that could be a client's first (>= 1200 bytes, RFC 9000 §6.1 and §14.1)
  // gets one: it is at most 7 + 2 x 255 + 4 bytes, less than half of that.
  if (d.len < NGTCP2_MAX_UDP_PAYLOAD_SIZE) {
    ++stats_.dropped;
    return;
  }
  if (!take_stateless_token()) return;
  ++stats_.version_negotiations;
  uint8_t buf[NGTCP2_MAX_UDP_PAYLOAD_SIZE];
  uint8_t rnd;
  (void)gnutls_rnd(GNUTLS_RND_NONCE, &rnd, 1);
  const uint32_t versions[] = {NGTCP2_PROTO_VER_V1};
  auto n = ngtcp2_pkt_write_version_negotiation(buf, sizeof buf, rnd, vc.scid, vc.scidlen, vc.dcid,
                                                vc.dcidlen, versions, 1);
  if (n > 0) send_raw(s, d, buf, static_cast<size_t>(n));
}

void Endpoint::send_retry(Socket& s, const Datagram& d, const ngtcp2_pkt_hd& hd) {
  ngtcp2_cid scid;
  scid.datalen = kCidLength;
  // Tagged with our slot: the client's next Initial carries it and is steered back here.
  make_cid(scid.data, static_cast<uint32_t>(ctx_.slot), ctx_.key.tag, ctx_.generation_index());
  uint8_t token[NGTCP2_CRYPTO_MAX_RETRY_TOKENLEN];
  auto tokenlen =
      ngtcp2_crypto_generate_retry_token(token, secret(), kSecretLen, hd.version, sa(d.remote),
                                         d.remote.len, &scid, &hd.dcid, wall_ns());
  if (tokenlen < 0) return;
  if (!take_stateless_token()) return;
  uint8_t buf[NGTCP2_MAX_UDP_PAYLOAD_SIZE];
  auto n = ngtcp2_crypto_write_retry(buf, sizeof buf, hd.version, &hd.scid, &scid, &hd.dcid, token,
                                     static_cast<size_t>(tokenlen));
  if (n <= 0) return;
  ++stats_.retries_sent;
  send_raw(s, d, buf, static_cast<size_t>(n));
}

void Endpoint::send_invalid_token(Socket& s, const Datagram& d, const ngtcp2_pkt_hd& hd) {
  if (!take_stateless_token()) return;
  uint8_t buf[NGTCP2_MAX_UDP_PAYLOAD_SIZE];
  auto n = ngtcp2_crypto_write_connection_close(buf, sizeof buf, hd.version, &hd.scid, &hd.dcid,
                                                NGTCP2_INVALID_TOKEN, nullptr, 0);
  if (n > 0) send_raw(s, d, buf, static_cast<size_t>(n));
}

void Endpoint::send_stateless_reset(Socket& s, const Datagram& d, const uint8_t* dcid,
                                    size_t dcidlen) {
  size_t total = stateless_reset_length(d.len);
  if (total == 0) {
    ++stats_.dropped;
    return;
  }
  if (!reset_bucket_.take(loop_.now())) {
    ++stats_.stateless_resets_limited;
    ++stats_.dropped;
    return;
  }
  size_t randlen = total - NGTCP2_STATELESS_RESET_TOKENLEN;
  uint8_t token[NGTCP2_STATELESS_RESET_TOKENLEN];
  if (!stateless_reset_token(secret(), kSecretLen, dcid, dcidlen, token)) return;
  uint8_t rnd[64];
  (void)gnutls_rnd(GNUTLS_RND_NONCE, rnd, randlen);
  uint8_t buf[128];
  auto n = ngtcp2_pkt_write_stateless_reset(buf, sizeof buf, token, rnd, randlen);
  if (n <= 0) return;
  ++stats_.stateless_resets;
  send_raw(s, d, buf, static_cast<size_t>(n));
}

// ----------------------------------------------------------------------------------------------
// Sending

Endpoint::SendResult Endpoint::send(const core::SocketAddress& local,
                                    const core::SocketAddress& remote, uint8_t ecn,
                                    const uint8_t* data, size_t len, size_t gso) {
  Socket* s = socket_for(local);
  if (!s) {
    if (sockets_.empty()) return SendResult::kFailed;
    s = sockets_.front().get();
  }
  if (gso && (!gso_ || len <= gso)) {
    if (len > gso && !gso_) {
      // No GSO: one datagram per call.
      for (size_t off = 0; off < len; off += gso) {
        auto r = send(local, remote, ecn, data + off, std::min(gso, len - off), 0);
        if (r == SendResult::kBlocked && off == 0) return r;
        if (r != SendResult::kSent) return SendResult::kSent;  // the rest is lost; QUIC recovers
      }
      return SendResult::kSent;
    }
    gso = 0;
  }
  iovec iov{const_cast<uint8_t*>(data), len};
  msghdr msg{};
  msg.msg_name = const_cast<sockaddr_storage*>(&remote.storage);
  msg.msg_namelen = remote.len;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int)) +
                             CMSG_SPACE(sizeof(uint16_t))];
  memset(ctrl, 0, sizeof ctrl);
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  size_t used = 0;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  // Source address: the one the client sent to (wildcard binds have several).
  if (local.family() == AF_INET) {
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
    in_pktinfo pi{};
    pi.ipi_spec_dst = reinterpret_cast<const sockaddr_in*>(&local.storage)->sin_addr;
    memcpy(CMSG_DATA(c), &pi, sizeof pi);
    used += CMSG_SPACE(sizeof(in_pktinfo));
  } else {
    c->cmsg_level = IPPROTO_IPV6;
    c->cmsg_type = IPV6_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
    in6_pktinfo pi{};
    pi.ipi6_addr = reinterpret_cast<const sockaddr_in6*>(&local.storage)->sin6_addr;
    memcpy(CMSG_DATA(c), &pi, sizeof pi);
    used += CMSG_SPACE(sizeof(in6_pktinfo));
  }
  if (ecn) {
    msg.msg_controllen = used + CMSG_SPACE(sizeof(int));
    c = CMSG_NXTHDR(&msg, c);
    int tos = ecn;
    c->cmsg_level = local.family() == AF_INET ? IPPROTO_IP : IPPROTO_IPV6;
    c->cmsg_type = local.family() == AF_INET ? IP_TOS : IPV6_TCLASS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &tos, sizeof tos);
    used += CMSG_SPACE(sizeof(int));
  }
  if (gso) {
    msg.msg_controllen = used + CMSG_SPACE(sizeof(uint16_t));
    c = CMSG_NXTHDR(&msg, c);
    uint16_t seg = static_cast<uint16_t>(gso);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    memcpy(CMSG_DATA(c), &seg, sizeof seg);
    used += CMSG_SPACE(sizeof(uint16_t));
  }
  msg.msg_controllen = used;
  for (;;) {
    ssize_t n = sendmsg(s->fd, &msg, 0);
    if (n >= 0) return SendResult::kSent;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return SendResult::kBlocked;
    if (gso && (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT)) {
      // The device cannot segment (no checksum offload): one datagram per call from now on.
      gso_ = false;
      log().info("quic_gso_off", "error=\"{}\"", strerror(errno));
      return send(local, remote, ecn, data, len, gso);
    }
    log().debug("quic_send_failed", "remote={} error=\"{}\"", remote.to_string(), strerror(errno));
    return SendResult::kFailed;
  }
}

void Endpoint::wait_writable(H3Connection* c) {
  if (std::find(blocked_.begin(), blocked_.end(), c) == blocked_.end()) blocked_.push_back(c);
  for (auto& s : sockets_) {
    if (s->want_out) continue;
    s->want_out = true;
    (void)loop_.modify(s->fd, EPOLLIN | EPOLLOUT, s.get());
  }
}

void Endpoint::on_writable(Socket& s) {
  (void)s;
  for (auto& sock : sockets_) {
    if (!sock->want_out) continue;
    sock->want_out = false;
    (void)loop_.modify(sock->fd, EPOLLIN, sock.get());
  }
  auto list = std::move(blocked_);
  blocked_.clear();
  for (auto* c : list)
    if (conns_.count(c) && !c->finished()) c->on_writable();
}

void Endpoint::schedule_write(H3Connection* c) {
  if (std::find(dirty_.begin(), dirty_.end(), c) == dirty_.end()) dirty_.push_back(c);
  if (flush_scheduled_) return;
  flush_scheduled_ = true;
  loop_.defer([this] { flush_writes(); });
}

void Endpoint::flush_writes() {
  flush_scheduled_ = false;
  auto list = std::move(dirty_);
  dirty_.clear();
  for (auto* c : list)
    if (conns_.count(c) && !c->finished()) c->write();
  // Parked requests (no site yet) and graceful close are driven by the tick.
  for (auto& [c, owned] : conns_) {
    if (c->parked_any()) {
      if (!tick_.armed()) tick_.arm_after(kTickMs);
      break;
    }
  }
}

void Endpoint::remove(H3Connection* c) {
  auto it = conns_.find(c);
  if (it == conns_.end()) return;
  handshake_validated(c);  // no longer in progress
  for (const auto& k : c->keys()) unlink(k, c);
  c->keys().clear();
  dirty_.erase(std::remove(dirty_.begin(), dirty_.end(), c), dirty_.end());
  blocked_.erase(std::remove(blocked_.begin(), blocked_.end(), c), blocked_.end());
  loop_.destroy_later(std::move(it->second));
  conns_.erase(it);
  stats_.connections_active = conns_.size();
  http::store(http::metrics().gauges.connections_open[http::ProcessMetrics::kHttp3],
              static_cast<int64_t>(conns_.size()));
  // On a timer, so that it runs after the loop has destroyed what was removed.
  if (peak_connections_ >= kTrimPeak && conns_.size() <= peak_connections_ / 4 &&
      !trim_timer_.armed())
    trim_timer_.arm_after(100);
  maybe_finish_close();
}

void Endpoint::trim_memory() {
  // Measured (release build, a spoofed flood with retry off and no cap): 7,300 handshakes took
  // RSS from 11 MB to 570 MB, and once every one had expired it stayed at 416 MB: all of it
  // freed (malloc_trim brings it to 12 MB), but glibc only gives back the top of the heap, and
  // the few allocations that outlive a wave pin the rest. So after a wave, once.
  size_t before = rss_kib();
  uint64_t t0 = now_ns();
  (void)malloc_trim(0);
  log().info("quic_memory_trimmed", "connections_peak={} connections={} rss_kib={} -> {} ms={}",
             peak_connections_, conns_.size(), before, rss_kib(), (now_ns() - t0) / 1'000'000);
  peak_connections_ = conns_.size();
}

// ----------------------------------------------------------------------------------------------
// Graceful close

void Endpoint::close(std::function<void()> done) {
  if (closing_) {
    if (done) done();
    return;
  }
  closing_ = true;
  close_done_ = std::move(done);
  close_started_ms_ = loop_.now();
  // Step 1: the shutdown notice (a GOAWAY with the largest id: "no new requests soon").
  for (auto& [c, owned] : conns_) c->shutdown_notice();
  close_timer_.arm_after(tcp_.options().close_timeout_ms);
  tick_.arm_after(kTickMs);
  log().info("quic_closing", "connections={}", conns_.size());
  maybe_finish_close();
}

void Endpoint::drain_tick() {
  uint64_t now = loop_.now();
  std::vector<H3Connection*> all;
  for (auto& [c, owned] : conns_) all.push_back(c);
  bool parked = false;
  for (auto* c : all) {
    if (!conns_.count(c)) continue;
    if (c->parked_any()) {
      c->tick_parked(now);
      parked = parked || c->parked_any();
    }
  }
  if (closing_) {
    // Step 2, about a round trip (100 ms) after a connection's notice: GOAWAY with the last
    // stream id actually accepted; step 3, a round trip later: a connection whose streams are
    // done gets CONNECTION_CLOSE(H3_NO_ERROR). Timed per connection, not from the start of the
    // close: one whose handshake ended a moment ago gets its notice now and its requests served
    // (a GOAWAY at once refused them, and a close at 200 ms cut handshakes in progress).
    for (auto* c : all) {
      if (!conns_.count(c)) continue;
      c->shutdown_notice();  // a connection that became ready since; once each
      if (c->goaway(now)) ++goaways_;
      if (conns_.count(c) && c->closable(now)) c->close_now();
    }
  }
  if (closing_ ? !conns_.empty() : parked) tick_.arm_after(kTickMs);
}

void Endpoint::maybe_finish_close() {
  if (!closing_ || !conns_.empty() || !close_done_) return;
  close_timer_.cancel();
  tick_.cancel();
  auto done = std::move(close_done_);
  close_done_ = nullptr;
  log().info("quic_closed",
             "slot={} generation={} handshakes={} requests={} goaways={} packets_in={} "
             "packets_out={} forwarded_in={} forwarded_out={} forwarded_generation={} "
             "stateless_resets={} retries={} version_negotiations={} retries_limited={} "
             "stateless_resets_limited={} handshake_timeouts={} initials_refused={} "
             "requests_incomplete={} dropped={}",
             ctx_.slot, ctx_.generation, stats_.handshakes, stats_.requests, goaways_,
             stats_.packets_in, stats_.packets_out, stats_.forwarded_in, stats_.forwarded_out,
             stats_.forwarded_generation, stats_.stateless_resets, stats_.retries_sent,
             stats_.version_negotiations, stats_.retries_limited, stats_.stateless_resets_limited,
             stats_.handshake_timeouts, stats_.initials_refused, stats_.requests_incomplete,
             stats_.dropped);
  loop_.defer(std::move(done));
}

}  // namespace corral::quic
