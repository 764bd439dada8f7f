#include "quic/dispatch.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace corral::quic {
namespace {

constexpr uint32_t kTag = 0x5eedf00d;

// Slot 2 of 4, generation `parity`.
DispatchSelf self(unsigned parity, bool closing = false) {
  DispatchSelf s;
  s.slot = 2;
  s.parity = parity;
  s.steering = true;
  s.closing = closing;
  return s;
}

// A short-header datagram for one of our CIDs of `slot` and generation parity `parity`.
DatagramFacts ours(int slot, unsigned parity) {
  DatagramFacts d;
  d.owner = slot;
  d.ours = true;
  d.cid_parity = parity;
  return d;
}

DatagramFacts client_initial(int owner) {
  DatagramFacts d;
  d.owner = owner;
  d.long_header = true;
  return d;
}

TEST(Dispatch, MakeCidCarriesTheParity) {
  for (unsigned parity : {0u, 1u}) {
    for (int i = 0; i < 200; ++i) {
      uint8_t cid[kCidLength];
      make_cid(cid, 5, kTag, parity);
      EXPECT_EQ(cid_parity(cid), parity);
      EXPECT_EQ(cid_slot(cid), 5u);
      EXPECT_TRUE(cid_is_ours(cid, kCidLength, kTag));
    }
  }
  // The rest of byte 0 stays random.
  int high_bits = 0;
  for (int i = 0; i < 64; ++i) {
    uint8_t cid[kCidLength];
    make_cid(cid, 0, kTag, 1);
    high_bits |= cid[0] & 0xFE;
  }
  EXPECT_EQ(high_bits, 0xFE);
}

TEST(Dispatch, ParityDoesNotChangeTheOwner) {
  SteeringKey key{kTag, 7, 4};
  for (unsigned parity : {0u, 1u}) {
    uint8_t pkt[1 + kCidLength + 20] = {0x40};
    make_cid(pkt + 1, 3, kTag, parity);
    EXPECT_EQ(packet_owner(pkt, sizeof pkt, key), 3);
  }
}

TEST(Dispatch, OwnConnectionOfOwnGenerationStaysHere) {
  auto d = ours(2, 1);
  d.known = true;
  EXPECT_EQ(dispatch(self(1), d).route, Route::kHere);
  d.known = false;  // unknown: a stateless reset, here
  EXPECT_EQ(dispatch(self(1), d).route, Route::kHere);
  EXPECT_EQ(dispatch(self(1, true), d).route, Route::kHere);
}

TEST(Dispatch, AnotherSlotGoesToThePairOfTheCidsParity) {
  for (unsigned parity : {0u, 1u}) {
    auto r = dispatch(self(1), ours(3, parity));
    EXPECT_EQ(r.route, Route::kToSlot);
    EXPECT_EQ(r.slot, 3);
    EXPECT_EQ(r.parity, parity);
  }
}

TEST(Dispatch, ClientInitialForAnotherSlotGoesToTheNewestGeneration) {
  auto r = dispatch(self(1), client_initial(0));
  EXPECT_EQ(r.route, Route::kToSlot);
  EXPECT_EQ(r.slot, 0);
  EXPECT_EQ(r.parity, 1u);
  r = dispatch(self(1, /*closing=*/true), client_initial(0));
  EXPECT_EQ(r.route, Route::kToSlot);
  EXPECT_EQ(r.parity, 0u);
}

TEST(Dispatch, OtherGenerationOfOurSlot) {
  // The old process (closing) hands the new generation's datagrams over...
  auto r = dispatch(self(1, /*closing=*/true), ours(2, 0));
  EXPECT_EQ(r.route, Route::kToOtherGeneration);
  EXPECT_EQ(r.slot, 2);
  EXPECT_EQ(r.parity, 0u);
  // ...and so does the new one: the old one may still drain.
  r = dispatch(self(0), ours(2, 1));
  EXPECT_EQ(r.route, Route::kToOtherGeneration);
  EXPECT_EQ(r.parity, 1u);
}

TEST(Dispatch, ForwardedDatagramsAreNeverForwardedAgain) {
  for (auto d : {ours(2, 0), ours(3, 0), ours(3, 1), client_initial(0), client_initial(2)}) {
    d.forwarded = true;
    EXPECT_EQ(dispatch(self(1, true), d).route, Route::kHere);
  }
}

TEST(Dispatch, NewConnectionsWhileClosingGoToTheNewGeneration) {
  auto r = dispatch(self(1, /*closing=*/true), client_initial(2));
  EXPECT_EQ(r.route, Route::kToOtherGeneration);
  EXPECT_EQ(r.parity, 0u);
  // Not closing: accepted here, as before.
  EXPECT_EQ(dispatch(self(1), client_initial(2)).route, Route::kHere);
  // A client's Initial after our Retry (our CID, our parity) while closing: also the new one's.
  auto retried = ours(2, 1);
  retried.long_header = true;
  EXPECT_EQ(dispatch(self(1, true), retried).route, Route::kToOtherGeneration);
  // One we already have stays.
  retried.known = true;
  EXPECT_EQ(dispatch(self(1, true), retried).route, Route::kHere);
}

TEST(Dispatch, SteeringOffStillForwardsBetweenGenerations) {
  auto s = self(1, true);
  s.steering = false;
  EXPECT_EQ(dispatch(s, ours(3, 1)).route, Route::kHere);  // another slot: not ours to fix
  EXPECT_EQ(dispatch(s, ours(2, 0)).route, Route::kToOtherGeneration);
}

}  // namespace
}  // namespace corral::quic
