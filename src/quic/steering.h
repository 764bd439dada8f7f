// Steering: which server process owns a QUIC datagram. One function, shared by the eBPF program
// (bpf/steer.bpf.c, its twin in C) and by userspace (the forwarding fallback), unit-tested against
// the same vectors so both always agree.
//
// Server-issued connection IDs are kCidLength bytes:
//   byte 0       random, except bits 0..1: the generation index of the SIGHUP generation that
//                issued it (generation % kGenerations: up to kGenerations processes of a slot,
//                the newest and the ones still draining, share its UDP socket; the index tells
//                whose connection a datagram is: dispatch.h)
//   byte 1       slot (the server process index, stable across respawns)
//   bytes 2..5   deployment tag, network order (tells our CIDs from client-chosen ones of the
//                same length: gtlsclient's Initial DCIDs are 18 bytes too)
//   bytes 6..17  random
// A packet carrying one of our CIDs belongs to its slot byte. A long-header packet with any other
// DCID (a client's first Initial, >= 8 bytes by RFC 9000) belongs to initial_hash(first 8 bytes)
// % slots (FNV-1a, then a final mix), keyed with a secret seed so clients cannot aim Initials at
// one process. Anything else has no owner (the kernel's 4-tuple hash picks; userspace handles it
// locally).
#pragma once

#include <cstddef>
#include <cstdint>

namespace corral::quic {

constexpr size_t kCidLength = 18;
constexpr uint32_t kMaxSlots = 64;
// Bits of byte 0 that carry the generation index. Two bits: four generations of a slot at once
// (the serving one and up to three draining), each with its own forwarding pair per slot. Three
// bits would double the pairs: 64 slots x 8 x 2 fds = 1024 descriptors in the supervisor, the
// default RLIMIT_NOFILE soft limit, where four cost 512 (docs/steering.md, "Reloads").
constexpr unsigned kGenerationBits = 2;
constexpr unsigned kGenerations = 1u << kGenerationBits;
constexpr unsigned kGenerationMask = kGenerations - 1;
inline unsigned generation_index(uint64_t generation) {
  return static_cast<unsigned>(generation & kGenerationMask);
}

struct SteeringKey {
  uint32_t tag = 0;    // deployment tag, random per supervisor start
  uint32_t seed = 0;   // initial_hash key, random per supervisor start
  uint32_t slots = 1;  // number of server processes
};

// A fresh server CID for `slot` issued by the generation of index `generation`
// (generation_index()); random bytes from gnutls_rnd (fork-safe).
void make_cid(uint8_t out[kCidLength], uint32_t slot, uint32_t tag, unsigned generation);
// Whether `cid` is one of ours (length and tag), and its slot.
bool cid_is_ours(const uint8_t* cid, size_t len, uint32_t tag);
inline uint32_t cid_slot(const uint8_t* cid) {
  return cid[1];
}
// The generation index of one of our CIDs.
inline unsigned cid_generation(const uint8_t* cid) {
  return cid[0] & kGenerationMask;
}
// The keyed hash of a client-chosen DCID's first 8 bytes (the BPF program computes the same).
uint32_t initial_hash(const uint8_t dcid8[8], uint32_t seed);

constexpr int kNoOwner = -1;
// The slot that owns datagram `pkt` (starting at the QUIC first byte), or kNoOwner.
int packet_owner(const uint8_t* pkt, size_t len, const SteeringKey& key);

}  // namespace corral::quic
