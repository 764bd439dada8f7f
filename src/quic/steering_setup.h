// Steering setup: the one call the cli makes in the supervisor, after the QUIC sockets exist and
// before it forks, to decide how datagrams reach their owning process.
//
//   auto   BPF if it loads (CAP_BPF), else forwarding, with a warning saying why
//   bpf    BPF or fail (a configuration error)
//   forward  no BPF: processes forward misrouted datagrams to their owner
//   off    the kernel's 4-tuple hash alone (shows the flaw: a migrated or rebound connection
//   reaches
//          its process one time in N)
//
// The forwarding path stays on in BPF mode as a safety net (a datagram can still be misrouted by
// the kernel's fallback hash, e.g. when the BPF lookup fails). The Steering it returns holds the
// random tag and seed every process must share, and the loaded programs (one per QUIC address:
// IPv4 and IPv6 listeners are separate reuseport groups); keep it alive in the supervisor for its
// whole life (fanout::QuicSockets::steering is the place).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.h"
#include "core/result.h"
#include "quic/bpf_steering.h"
#include "quic/context.h"
#include "quic/steering.h"

namespace corral::quic {

enum class SteeringRequest { kAuto, kBpf, kForward, kOff };
// "auto", "bpf", "forward", "off".
core::Result<SteeringRequest> parse_steering_request(std::string_view text);
const char* steering_request_name(SteeringRequest r);

struct Steering {
  SteeringMode mode = SteeringMode::kForward;
  SteeringKey key;                    // tag and seed random per supervisor start (gnutls_rnd)
  std::vector<BpfSteering> programs;  // kBpf: one per QUIC address, in address order
  std::string fallback_reason;        // kAuto that ended in kForward: why BPF did not load

  // The steering part of the ProcessContext of slot `slot`'s process of SIGHUP generation
  // `generation` (slot, generation, key, mode and the fds it inherited: fanout::ChildContext's
  // udp_fds, forward_rx, forward_tx, serving). The caller adds secrets and credentials.
  ProcessContext context(int slot, uint64_t generation, std::vector<int> udp_fds, int forward_rx,
                         std::vector<ForwardPair> forward_tx,
                         ServingGenerations serving = nullptr) const;
};

// `groups[a]`: QUIC address a's UDP sockets in slot order (fanout::QuicSockets::group(a)), each
// with `slots` sockets. Fails only for kBpf when the program does not load, or for malformed
// groups. Logs the outcome (quic_steering, or quic_steering_fallback as a warning).
core::Result<std::shared_ptr<Steering>> setup_steering(const std::vector<std::vector<int>>& groups,
                                                       uint32_t slots, SteeringRequest request,
                                                       core::Logger& log);

}  // namespace corral::quic
