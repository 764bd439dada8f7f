// What one server process needs to serve HTTP/3 as slot `slot` of a fan-out: made by the
// supervisor before it forks (sockets, forwarding pairs, secrets, the BPF program) and inherited.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quic/steering.h"
#include "tls/credentials.h"

namespace corral::quic {

enum class SteeringMode {
  kBpf,      // the SK_REUSEPORT program steers; forwarding stays on as a safety net
  kForward,  // no BPF: misrouted datagrams are forwarded to their owner
  kOff,      // neither: the kernel's 4-tuple hash alone (shows the flaw; never a default)
};
const char* steering_name(SteeringMode m);

enum class RetryMode { kAuto, kOn, kOff };  // kAuto: on while Initials arrive faster than a limit

struct Secrets {
  uint8_t static_secret[32];  // Retry/NEW_TOKEN tokens and stateless-reset tokens
};

// Each slot has kGenerations forwarding pairs, one per generation index (generation_index()): a
// SIGHUP's new process of a slot and the old ones still draining read different pairs, and the
// CIDs each issues carry its index (steering.h, dispatch.h).
using ForwardPair = std::array<int, kGenerations>;  // write ends by generation index

// Per slot, the SIGHUP generation serving it now (its newest process that is ready), written by
// the supervisor into memory every process shares (fanout/quic_sockets.h): a draining process
// hands new connections to it. Null: nobody publishes it (the process's own is assumed).
using ServingGenerations = const std::atomic<uint64_t>*;

struct ProcessContext {
  int slot = 0;
  uint64_t generation = 1;  // the supervisor's SIGHUP generation (1 at start)
  SteeringKey key;
  SteeringMode mode = SteeringMode::kForward;
  std::vector<int> udp_fds;  // this slot's UDP sockets, one per address (owned by the process)
  int forward_rx = -1;       // this slot's forwarding socket of our generation index (read end)
  std::vector<ForwardPair> forward_tx;   // per slot and generation index, the write ends
  ServingGenerations serving = nullptr;  // [slot], or null
  std::shared_ptr<const Secrets> secrets;
  std::shared_ptr<tls::Credentials> credentials;
  std::shared_ptr<tls::TicketKey> ticket_key;

  unsigned generation_index() const { return quic::generation_index(generation); }
  // The index of the generation serving `slot` now (our own when nobody publishes it).
  unsigned serving_index(int slot) const {
    if (!serving || slot < 0 || static_cast<uint32_t>(slot) >= key.slots) return generation_index();
    return quic::generation_index(serving[slot].load(std::memory_order_relaxed));
  }
};

}  // namespace corral::quic
