// BPF steering: the SK_REUSEPORT program (bpf/steer.bpf.c, embedded in the binary) loaded for one
// reuseport group, with its `cfg` map filled from the SteeringKey and its `socks` sockarray holding
// the group's sockets in slot order. The kernel then hands every datagram to the socket of the
// process that owns it (packet_owner(), the C++ twin, decides the same).
//
// Lifetime: the supervisor loads it before forking, once per QUIC address (IPv4 and IPv6 listeners
// are separate groups, each needs its own sockarray), and keeps the handle for its whole life. The
// program stays attached to the group as long as any of its sockets is open; the handle only keeps
// the map fds (to replace a slot's socket, should that ever be needed). Loading needs CAP_BPF (or
// CAP_SYS_ADMIN); nothing after that does. Not thread-safe (libbpf's print hook is process-wide).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/result.h"
#include "quic/steering.h"

struct bpf_object;

namespace corral::quic {

class BpfSteering {
 public:
  BpfSteering() = default;
  BpfSteering(BpfSteering&& other) noexcept;
  BpfSteering& operator=(BpfSteering&& other) noexcept;
  BpfSteering(const BpfSteering&) = delete;
  BpfSteering& operator=(const BpfSteering&) = delete;
  ~BpfSteering();

  bool loaded() const { return obj_ != nullptr; }
  int socks_map_fd() const { return socks_fd_; }
  int cfg_map_fd() const { return cfg_fd_; }
  int program_fd() const { return prog_fd_; }
  // Puts `fd` (bound, SO_REUSEPORT, in this group) into `slot`, replacing what was there.
  core::Result<void> set_slot(uint32_t slot, int fd);

 private:
  friend core::Result<BpfSteering> load_bpf_steering(const std::vector<int>&, const SteeringKey&,
                                                     core::Logger*);
  bpf_object* obj_ = nullptr;
  int socks_fd_ = -1;
  int cfg_fd_ = -1;
  int prog_fd_ = -1;
};

// Whether this process may load BPF programs (CAP_BPF or CAP_SYS_ADMIN in its effective set).
bool has_bpf_capability();

// Loads the program for one reuseport group: `udp_fds[i]` is slot i's socket (all bound to the same
// address with SO_REUSEPORT, key.slots of them). Fills cfg and socks, attaches the program to the
// group (SO_ATTACH_REUSEPORT_EBPF on udp_fds[0]). On failure the reason says why, e.g.
// "no CAP_BPF: load: Operation not permitted"; nothing is attached then. libbpf's own messages go
// to `log` at debug level instead of stderr (its warnings also end up in the error text).
core::Result<BpfSteering> load_bpf_steering(const std::vector<int>& udp_fds, const SteeringKey& key,
                                            core::Logger* log = nullptr);

}  // namespace corral::quic
