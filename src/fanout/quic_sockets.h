// QUIC sockets of a fan-out: per QUIC address one UDP reuseport group with a socket per slot, and
// per slot an AF_UNIX datagram socketpair for forwarding misrouted datagrams to their owner.
//
// Made by the supervisor before it forks and kept open for its whole life (closed only when it
// terminates): a respawned process gets the very same sockets, so the reuseport group never
// changes (the BPF sockarray's slot i stays socket i, the kernel hash never reshuffles) and what
// the kernel queued for a dead process waits for its replacement. A SIGHUP generation keeps them
// too (they are not part of the ListenerSet a reload may replace). The fan-out knows nothing of
// QUIC itself: the steering program is loaded on these sockets by the quic component, called
// from the cli (quic/steering_setup.h), and kept alive through `steering` below.
//
// Layout: udp[slot][address]; forward_rx[slot][g] (the owner reads), forward_tx[slot][g] (every
// process writes). kGenerations pairs per slot, one per SIGHUP generation index (generation %
// kGenerations): while old processes of slot i drain next to the new one, each reads its own pair,
// so a datagram forwarded to one generation is not read by another (the supervisor never runs two
// processes of a slot with the same index). Both ends of every pair stay here, so a send to a dead
// process's pair queues (or, when full, drops) instead of failing.
//
// `serving[slot]`: the generation serving slot i now, in one shared anonymous mapping made here
// before any fork, so the supervisor's writes are seen by every process (a draining process hands
// new connections to that generation).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/result.h"
#include "core/socket.h"
#include "core/unique_fd.h"
#include "fanout/listen_claim.h"

namespace corral::fanout {

// Generations of a slot that may run at once (the serving one and the draining ones): the
// generation index bits of a QUIC CID (quic::kGenerations; the cli checks they agree).
constexpr size_t kGenerations = 4;
inline size_t generation_index(uint64_t generation) {
  return static_cast<size_t>(generation % kGenerations);
}

// The shared per-slot "serving generation" words (see above); unmapped when destroyed.
class ServingTable {
 public:
  ServingTable() = default;
  ServingTable(const ServingTable&) = delete;
  ServingTable& operator=(const ServingTable&) = delete;
  ~ServingTable();
  core::Result<void> map(int slots);
  void set(int slot, uint64_t generation);
  const std::atomic<uint64_t>* words() const { return words_; }

 private:
  std::atomic<uint64_t>* words_ = nullptr;
  size_t bytes_ = 0;
};

struct QuicSocketOptions {
  int udp_buffer = 4 << 20;      // SO_RCVBUF/SO_SNDBUF (FORCE variants when privileged)
  int forward_buffer = 1 << 20;  // the pairs' SO_SNDBUF/SO_RCVBUF
};

struct QuicSockets {
  std::vector<core::SocketAddress> addresses;                        // as bound (port 0 resolved)
  std::vector<std::vector<core::UniqueFd>> udp;                      // udp[slot][address]
  std::vector<std::array<core::UniqueFd, kGenerations>> forward_rx;  // [slot][generation index]
  std::vector<std::array<core::UniqueFd, kGenerations>> forward_tx;  // [slot][generation index]
  std::unique_ptr<ServingTable> serving;                             // [slot], always mapped
  std::shared_ptr<void> steering;                    // opaque: what the cli loaded on these sockets
  std::vector<std::shared_ptr<ListenClaim>> claims;  // "udp-<address>", one per address

  int slots() const { return static_cast<int>(udp.size()); }
  // One reuseport group: address `a`'s sockets in slot order (for the BPF sockarray).
  std::vector<int> group(size_t a) const;
  void close();
};

// Binds every address once per slot (SO_REUSEPORT, in slot order; a port 0 is resolved by slot 0
// and shared by the others) with IP_PKTINFO/IPV6_RECVPKTINFO, IP_RECVTOS/IPV6_RECVTCLASS, path MTU
// probing and large buffers, and makes the forwarding pairs (kGenerations per slot) and the
// serving table (every slot: generation 1). All non-blocking and close-on-exec. Each address is
// claimed first (listen_claim.h; a port 0 once it is resolved): held by another corral, it fails
// with kErrorClaimed.
core::Result<QuicSockets> make_quic_sockets(const std::vector<core::SocketAddress>& addresses,
                                            int slots, const QuicSocketOptions& options = {});

}  // namespace corral::fanout
