#include "quic/steering.h"

#include <gnutls/crypto.h>

#include <cstring>

namespace corral::quic {

void make_cid(uint8_t out[kCidLength], uint32_t slot, uint32_t tag, unsigned generation) {
  (void)gnutls_rnd(GNUTLS_RND_NONCE, out, kCidLength);
  out[0] = static_cast<uint8_t>((out[0] & ~kGenerationMask) | (generation & kGenerationMask));
  out[1] = static_cast<uint8_t>(slot);
  out[2] = static_cast<uint8_t>(tag >> 24);
  out[3] = static_cast<uint8_t>(tag >> 16);
  out[4] = static_cast<uint8_t>(tag >> 8);
  out[5] = static_cast<uint8_t>(tag);
}

bool cid_is_ours(const uint8_t* cid, size_t len, uint32_t tag) {
  if (len != kCidLength) return false;
  uint32_t t = (uint32_t{cid[2]} << 24) | (uint32_t{cid[3]} << 16) | (uint32_t{cid[4]} << 8) |
               uint32_t{cid[5]};
  return t == tag;
}

uint32_t initial_hash(const uint8_t dcid8[8], uint32_t seed) {
  // FNV-1a (32-bit) over the seed's 4 bytes (big-endian) then the 8 DCID bytes, then fmix32; the
  // BPF twin unrolls the same.
  uint32_t h = 2166136261u;
  for (int i = 0; i < 4; ++i) {
    h ^= (seed >> (24 - 8 * i)) & 0xff;
    h *= 16777619u;
  }
  for (int i = 0; i < 8; ++i) {
    h ^= dcid8[i];
    h *= 16777619u;
  }
  // FNV-1a's low k bits depend only on the low k bits of each input byte, and `% slots` with a
  // power-of-two slot count keeps exactly those: DCIDs that differ only in their high bits would
  // all land on one process. A final mix (murmur3's fmix32) brings the well-mixed high bits down.
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

int packet_owner(const uint8_t* pkt, size_t len, const SteeringKey& key) {
  if (len < 1 || key.slots == 0) return kNoOwner;
  if (pkt[0] & 0x80) {
    // Long header: flags(1) version(4) dcid_len(1) dcid.
    if (len < 6) return kNoOwner;
    size_t dlen = pkt[5];
    if (dlen > 20 || len < 6 + dlen) return kNoOwner;
    const uint8_t* dcid = pkt + 6;
    if (cid_is_ours(dcid, dlen, key.tag)) {
      uint32_t s = cid_slot(dcid);
      return s < key.slots ? static_cast<int>(s) : kNoOwner;
    }
    if (dlen < 8) return kNoOwner;
    return static_cast<int>(initial_hash(dcid, key.seed) % key.slots);
  }
  // Short header: flags(1) dcid (our length, not on the wire).
  if (len < 1 + kCidLength) return kNoOwner;
  if (!cid_is_ours(pkt + 1, kCidLength, key.tag)) return kNoOwner;
  uint32_t s = cid_slot(pkt + 1);
  return s < key.slots ? static_cast<int>(s) : kNoOwner;
}

}  // namespace corral::quic
