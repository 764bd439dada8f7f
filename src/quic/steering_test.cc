#include "quic/steering.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "quic/steering_vectors.h"

namespace corral::quic {
namespace {

using vectors::kKey;

uint32_t tag_of(const uint8_t* cid) {
  return (uint32_t{cid[2]} << 24) | (uint32_t{cid[3]} << 16) | (uint32_t{cid[4]} << 8) | cid[5];
}

TEST(Steering, MakeCidLayout) {
  // Strings, not vectors of bytes: GCC 12 at -O3 warns (stringop-overread) inside the
  // three-way comparison of std::vector<uint8_t> keys.
  std::set<std::string> seen;
  for (uint32_t slot = 0; slot < kMaxSlots; ++slot) {
    uint8_t cid[kCidLength];
    make_cid(cid, slot, 0xA1B2C3D4u, slot & 1u);
    EXPECT_EQ(cid[1], slot);
    EXPECT_EQ(cid[2], 0xA1);
    EXPECT_EQ(cid[3], 0xB2);
    EXPECT_EQ(cid[4], 0xC3);
    EXPECT_EQ(cid[5], 0xD4);
    EXPECT_EQ(tag_of(cid), 0xA1B2C3D4u);
    EXPECT_EQ(cid_slot(cid), slot);
    EXPECT_TRUE(cid_is_ours(cid, kCidLength, 0xA1B2C3D4u));
    seen.insert(std::string(reinterpret_cast<const char*>(cid), kCidLength));
  }
  EXPECT_EQ(seen.size(), kMaxSlots);  // the random bytes differ
}

TEST(Steering, CidIsOursChecksTagAndLength) {
  uint8_t cid[20];
  make_cid(cid, 3, kKey.tag, 0);
  EXPECT_TRUE(cid_is_ours(cid, kCidLength, kKey.tag));
  EXPECT_FALSE(cid_is_ours(cid, kCidLength, kKey.tag ^ 1));
  EXPECT_FALSE(cid_is_ours(cid, kCidLength, 0));
  EXPECT_FALSE(cid_is_ours(cid, 8, kKey.tag));
  EXPECT_FALSE(cid_is_ours(cid, 17, kKey.tag));
  EXPECT_FALSE(cid_is_ours(cid, 20, kKey.tag));
  cid[4] ^= 0x80;
  EXPECT_FALSE(cid_is_ours(cid, kCidLength, kKey.tag));
}

TEST(Steering, InitialHashVectors) {
  for (const auto& v : vectors::kHashVectors)
    EXPECT_EQ(initial_hash(v.dcid, v.seed), v.hash) << std::hex << "seed " << v.seed;
}

TEST(Steering, InitialHashUsesSeedAndOnlyEightBytes) {
  uint8_t a[20], b[20];
  for (int i = 0; i < 20; ++i) a[i] = b[i] = static_cast<uint8_t>(i * 13);
  b[12] ^= 0xff;  // past the first 8 bytes
  EXPECT_EQ(initial_hash(a, 1), initial_hash(b, 1));
  EXPECT_NE(initial_hash(a, 1), initial_hash(a, 2));
  b[7] ^= 1;
  EXPECT_NE(initial_hash(a, 1), initial_hash(b, 1));
}

TEST(Steering, PacketVectors) {
  for (const auto& v : vectors::kPacketVectors)
    EXPECT_EQ(packet_owner(v.bytes, v.len, kKey), v.owner) << v.name;
}

TEST(Steering, OwnCidsRouteToTheirSlotForEverySlotCount) {
  for (uint32_t slots = 1; slots <= kMaxSlots; ++slots) {
    SteeringKey key{.tag = 0x5eed5eedu, .seed = 7, .slots = slots};
    for (uint32_t slot = 0; slot < kMaxSlots; ++slot) {
      uint8_t pkt[64] = {};
      pkt[0] = 0x40;  // short header
      make_cid(pkt + 1, slot, key.tag, slot & 1u);
      int expect = slot < slots ? static_cast<int>(slot) : kNoOwner;
      EXPECT_EQ(packet_owner(pkt, 40, key), expect) << "short slots=" << slots << " slot=" << slot;
      uint8_t lng[64] = {0xc0, 0, 0, 0, 1, kCidLength};
      make_cid(lng + 6, slot, key.tag, 1);
      EXPECT_EQ(packet_owner(lng, 60, key), expect) << "long slots=" << slots << " slot=" << slot;
    }
  }
}

TEST(Steering, ClientDcidsSpreadOverSlots) {
  // Not a statistical test: every slot must be reachable by some Initial.
  SteeringKey key{.tag = 1, .seed = 0xabcdef01u, .slots = 8};
  std::set<int> owners;
  for (int i = 0; i < 256; ++i) {
    uint8_t pkt[32] = {0xc0, 0, 0, 0, 1, 8};
    pkt[6] = static_cast<uint8_t>(i);
    pkt[13] = static_cast<uint8_t>(i * 31);
    int o = packet_owner(pkt, sizeof pkt, key);
    ASSERT_GE(o, 0);
    ASSERT_LT(o, 8);
    owners.insert(o);
  }
  EXPECT_EQ(owners.size(), 8u);
}

TEST(Steering, NoSlotsNoOwner) {
  SteeringKey key = kKey;
  key.slots = 0;
  for (const auto& v : vectors::kPacketVectors)
    EXPECT_EQ(packet_owner(v.bytes, v.len, key), kNoOwner);
  EXPECT_EQ(packet_owner(nullptr, 0, kKey), kNoOwner);
}

}  // namespace
}  // namespace corral::quic
