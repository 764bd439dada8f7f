// What one server process needs to serve HTTP/3 as slot `slot` of a fan-out: made by the
// supervisor before it forks (sockets, forwarding pairs, secrets, the BPF program) and inherited.
#pragma once

#include <array>
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

// Each slot has two forwarding pairs, one per generation parity (generation & 1): a SIGHUP's new
// process of a slot and the old one it replaces read different pairs, and the CIDs each issues
// carry its parity (steering.h, dispatch.h).
using ForwardPair = std::array<int, 2>;  // write ends by parity

struct ProcessContext {
  int slot = 0;
  uint64_t generation = 1;  // the supervisor's SIGHUP generation (1 at start)
  SteeringKey key;
  SteeringMode mode = SteeringMode::kForward;
  std::vector<int> udp_fds;  // this slot's UDP sockets, one per address (owned by the process)
  int forward_rx = -1;       // this slot's forwarding socket of our parity (read end)
  std::vector<ForwardPair> forward_tx;  // per slot and parity, the write ends
  std::shared_ptr<const Secrets> secrets;
  std::shared_ptr<tls::Credentials> credentials;
  std::shared_ptr<tls::TicketKey> ticket_key;

  unsigned parity() const { return static_cast<unsigned>(generation & 1); }
};

}  // namespace corral::quic
