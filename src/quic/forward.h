// Forwarding: the fallback (and, in BPF mode, the safety net) that moves a datagram the kernel gave
// to the wrong process to the process that owns it. Every slot has an AF_UNIX SOCK_DGRAM socketpair
// made by the supervisor before it forks: the owner reads its rx end, everyone else writes to its tx
// end. A forwarded datagram is never forwarded again (the receiver handles or drops it), and a
// full queue drops it (MSG_DONTWAIT; QUIC retransmits). The owner answers from its own UDP socket
// with the original local address, so there is no return hop.
//
// Wire format (one datagram): magic "CQF1" (4), ecn (1), local sockaddr length (1) and bytes,
// remote sockaddr length (1) and bytes, then the QUIC datagram.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/socket.h"

namespace corral::quic {

struct ForwardHeader {
  core::SocketAddress local;   // where the client sent it (our address:port)
  core::SocketAddress remote;  // the client
  uint8_t ecn = 0;
};

// Encodes into `out` (capacity `cap`); returns the length, or 0 if it does not fit.
size_t encode_forwarded(const ForwardHeader& h, const uint8_t* data, size_t len, uint8_t* out,
                        size_t cap);
// Decodes one message; `data`/`len` point into `msg`. False: not a forwarded datagram.
bool decode_forwarded(const uint8_t* msg, size_t msg_len, ForwardHeader& h, const uint8_t** data,
                      size_t* len);
// Sends one forwarded datagram to `tx_fd` without blocking. False: dropped (queue full, error).
bool forward_datagram(int tx_fd, const ForwardHeader& h, const uint8_t* data, size_t len);

}  // namespace corral::quic
