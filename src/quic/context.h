// What one server process needs to serve HTTP/3 as slot `slot` of a fan-out: made by the
// supervisor before it forks (sockets, forwarding pairs, secrets, the BPF program) and inherited.
#pragma once

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

struct ProcessContext {
  int slot = 0;
  SteeringKey key;
  SteeringMode mode = SteeringMode::kForward;
  std::vector<int> udp_fds;     // this slot's UDP sockets, one per address (owned by the process)
  int forward_rx = -1;          // this slot's forwarding socket (read end)
  std::vector<int> forward_tx;  // per slot, the write ends (forward_tx[slot] unused)
  std::shared_ptr<const Secrets> secrets;
  std::shared_ptr<tls::Credentials> credentials;
  std::shared_ptr<tls::TicketKey> ticket_key;
};

}  // namespace corral::quic
