// Fuzzes what corral itself decides about an untrusted UDP datagram before ngtcp2 sees it
// (src/quic/steering.h, forward.h, dispatch.h): the owning slot, the forwarding wire format and
// the dispatch of a datagram between slots and generations. Byte 0 picks the number of slots
// (1..64) and this process's slot, generation index, the serving generation and state; the rest
// is the datagram.
//
// Invariants: packet_owner is kNoOwner or below the slot count, and for a datagram that carries
// one of our CIDs it is that CID's slot byte (when in range); a datagram forwarded to us is never
// forwarded again; a route to another slot names a slot in range and never our own; a route to
// another generation stays in our slot with an index in range that is not ours; every datagram
// survives the forwarding encoding unchanged, and decode_forwarded never reads past what it was
// given.
#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "quic/dispatch.h"
#include "quic/forward.h"
#include "quic/steering.h"

namespace {

using namespace corral::quic;

void check(bool ok) {
  if (!ok) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t ctl = data[0];
  const uint8_t* pkt = data + 1;
  const size_t len = size - 1;

  SteeringKey key{.tag = 0xc0ffee01u, .seed = 0x9e3779b9u, .slots = 1u + (ctl & 0x3fu)};
  const int owner = packet_owner(pkt, len, key);
  check(owner == kNoOwner || (owner >= 0 && static_cast<uint32_t>(owner) < key.slots));

  // Where our CID sits: after the long header's length byte, or right after the first byte.
  bool ours = false;
  unsigned generation = 0;
  bool long_header = len > 0 && (pkt[0] & 0x80);
  if (long_header && len >= 6 && pkt[5] <= 20 && len >= 6u + pkt[5]) {
    ours = cid_is_ours(pkt + 6, pkt[5], key.tag);
    if (ours) {
      generation = cid_generation(pkt + 6);
      if (cid_slot(pkt + 6) < key.slots) check(owner == static_cast<int>(cid_slot(pkt + 6)));
    }
  } else if (!long_header && len >= 1 + kCidLength) {
    ours = cid_is_ours(pkt + 1, kCidLength, key.tag);
    if (ours) {
      generation = cid_generation(pkt + 1);
      check(owner ==
            (cid_slot(pkt + 1) < key.slots ? static_cast<int>(cid_slot(pkt + 1)) : kNoOwner));
    }
  }

  DispatchSelf self;
  self.slot = static_cast<int>((ctl >> 6) % key.slots);
  self.generation = (ctl >> 1) & kGenerationMask;
  self.steering = key.slots > 1;
  self.closing = ctl & 0x80;
  for (int variant = 0; variant < 4; ++variant) {
    DatagramFacts facts;
    facts.forwarded = variant & 1;
    facts.known = variant & 2;
    facts.owner = owner;
    facts.ours = ours;
    facts.cid_generation = generation;
    facts.serving = (ctl >> 3) & kGenerationMask;
    facts.long_header = long_header;
    Dispatch d = dispatch(self, facts);
    if (facts.forwarded) check(d.route == Route::kHere);
    if (d.route == Route::kToSlot) {
      check(d.slot != self.slot && d.slot >= 0 && static_cast<uint32_t>(d.slot) < key.slots);
      check(d.generation < kGenerations);
    }
    if (d.route == Route::kToOtherGeneration)
      check(d.slot == self.slot && d.generation < kGenerations && d.generation != self.generation);
  }

  // The forwarding format: the datagram comes back byte for byte with its addresses.
  ForwardHeader h;
  auto* local = reinterpret_cast<sockaddr_in*>(&h.local.storage);
  local->sin_family = AF_INET;
  local->sin_port = htons(8443);
  local->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  h.local.len = sizeof(sockaddr_in);
  auto* remote = reinterpret_cast<sockaddr_in6*>(&h.remote.storage);
  remote->sin6_family = AF_INET6;
  remote->sin6_port = htons(50000);
  remote->sin6_addr = in6addr_loopback;
  h.remote.len = sizeof(sockaddr_in6);
  h.ecn = ctl & 3;
  std::vector<uint8_t> wire(len + 512);
  size_t n = encode_forwarded(h, pkt, len, wire.data(), wire.size());
  check(n > len);
  ForwardHeader back;
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
  check(decode_forwarded(wire.data(), n, back, &payload, &payload_len));
  check(payload_len == len && (len == 0 || memcmp(payload, pkt, len) == 0));
  check(back.ecn == h.ecn && back.local.len == h.local.len && back.remote.len == h.remote.len);

  // The raw input as a forwarded message (what a confused peer could write to our pair): decoding
  // either fails or hands out a payload inside the input. A copy of exactly `size` bytes lets
  // ASan catch any read past it.
  std::vector<uint8_t> raw(data, data + size);
  if (decode_forwarded(raw.data(), raw.size(), back, &payload, &payload_len))
    check(payload >= raw.data() && payload + payload_len <= raw.data() + raw.size());
  return 0;
}
