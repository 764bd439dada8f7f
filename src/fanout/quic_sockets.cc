#include "fanout/quic_sockets.h"

#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <new>
#include <string>

namespace corral::fanout {

namespace {

// Large buffers absorb bursts of Initials and forwarded datagrams. The FORCE variants pass
// net.core.rmem_max/wmem_max and need CAP_NET_ADMIN; without it the plain ones are capped there.
void set_buffer(int fd, int force_opt, int opt, int bytes) {
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof bytes) == 0) return;
  (void)setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof bytes);
}

core::Result<core::UniqueFd> udp_socket(const core::SocketAddress& addr, int buffer) {
  core::UniqueFd fd(::socket(addr.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return core::errno_error("socket(UDP)");
  int one = 1;
  auto opt = [&](int level, int name, int value, const char* what) -> core::Result<void> {
    if (setsockopt(fd.get(), level, name, &value, sizeof value) < 0) return core::errno_error(what);
    return {};
  };
  if (auto r = opt(SOL_SOCKET, SO_REUSEPORT, one, "setsockopt(SO_REUSEPORT)"); !r) return r.error();
  if (addr.family() == AF_INET6) {
    // [::]:P and 0.0.0.0:P are two groups (each with its own BPF program), never one dual-stack.
    if (auto r = opt(IPPROTO_IPV6, IPV6_V6ONLY, one, "setsockopt(IPV6_V6ONLY)"); !r)
      return r.error();
    if (auto r = opt(IPPROTO_IPV6, IPV6_RECVPKTINFO, one, "setsockopt(IPV6_RECVPKTINFO)"); !r)
      return r.error();
    if (auto r = opt(IPPROTO_IPV6, IPV6_RECVTCLASS, one, "setsockopt(IPV6_RECVTCLASS)"); !r)
      return r.error();
    if (auto r = opt(IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE,
                     "setsockopt(IPV6_MTU_DISCOVER)");
        !r)
      return r.error();
  } else {
    if (auto r = opt(IPPROTO_IP, IP_PKTINFO, one, "setsockopt(IP_PKTINFO)"); !r) return r.error();
    if (auto r = opt(IPPROTO_IP, IP_RECVTOS, one, "setsockopt(IP_RECVTOS)"); !r) return r.error();
    if (auto r = opt(IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE, "setsockopt(IP_MTU_DISCOVER)");
        !r)
      return r.error();
  }
  set_buffer(fd.get(), SO_RCVBUFFORCE, SO_RCVBUF, buffer);
  set_buffer(fd.get(), SO_SNDBUFFORCE, SO_SNDBUF, buffer);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) < 0)
    return core::errno_error(("bind udp " + addr.to_string()).c_str());
  return fd;
}

}  // namespace

ServingTable::~ServingTable() {
  if (words_) munmap(words_, bytes_);
}

core::Result<void> ServingTable::map(int slots) {
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared between processes");
  bytes_ = sizeof(std::atomic<uint64_t>) * static_cast<size_t>(std::max(slots, 1));
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return core::errno_error("mmap(serving generations)");
  words_ = static_cast<std::atomic<uint64_t>*>(p);
  for (int i = 0; i < slots; ++i) new (&words_[i]) std::atomic<uint64_t>(1);
  return {};
}

void ServingTable::set(int slot, uint64_t generation) {
  if (words_) words_[slot].store(generation, std::memory_order_relaxed);
}

std::vector<int> QuicSockets::group(size_t a) const {
  std::vector<int> fds;
  for (const auto& slot : udp) fds.push_back(a < slot.size() ? slot[a].get() : -1);
  return fds;
}

void QuicSockets::close() {
  claims.clear();  // not listening any more: another instance may take the addresses
  for (auto& slot : udp)
    for (auto& fd : slot) fd.reset();
  for (auto& pair : forward_rx)
    for (auto& fd : pair) fd.reset();
  for (auto& pair : forward_tx)
    for (auto& fd : pair) fd.reset();
}

core::Result<QuicSockets> make_quic_sockets(const std::vector<core::SocketAddress>& addresses,
                                            int slots, const QuicSocketOptions& options) {
  QuicSockets set;
  set.addresses = addresses;
  set.udp.resize(static_cast<size_t>(slots));
  for (size_t a = 0; a < addresses.size(); ++a) {
    auto claim = [&]() -> core::Result<void> {
      auto c = claim_listen("udp", set.addresses[a]);
      if (!c) return c.error();
      set.claims.push_back(std::move(c.value()));
      return {};
    };
    if (set.addresses[a].port() != 0)
      if (auto r = claim(); !r) return r.error();
    for (int i = 0; i < slots; ++i) {
      auto fd = udp_socket(set.addresses[a], options.udp_buffer);
      if (!fd) return fd.error();
      if (i == 0 && set.addresses[a].port() == 0) {
        auto bound = core::local_address(fd->get());
        if (!bound) return bound.error();
        set.addresses[a] = bound.value();  // the others join the port the kernel chose
        if (auto r = claim(); !r) return r.error();
      }
      set.udp[static_cast<size_t>(i)].push_back(std::move(fd.value()));
    }
  }
  set.forward_rx.resize(static_cast<size_t>(slots));
  set.forward_tx.resize(static_cast<size_t>(slots));
  for (size_t i = 0; i < static_cast<size_t>(slots); ++i) {
    for (size_t g = 0; g < kGenerations; ++g) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        return core::errno_error("socketpair(forward)");
      core::UniqueFd rx(sv[0]), tx(sv[1]);
      // A datagram in flight is charged to the sender's SO_SNDBUF until it is read; the
      // receiver's queue is also capped by net.unix.max_dgram_qlen (512 by default).
      set_buffer(tx.get(), SO_SNDBUFFORCE, SO_SNDBUF, options.forward_buffer);
      set_buffer(rx.get(), SO_RCVBUFFORCE, SO_RCVBUF, options.forward_buffer);
      set.forward_rx[i][g] = std::move(rx);
      set.forward_tx[i][g] = std::move(tx);
    }
  }
  set.serving = std::make_unique<ServingTable>();
  if (auto r = set.serving->map(slots); !r) return r.error();
  return set;
}

}  // namespace corral::fanout
