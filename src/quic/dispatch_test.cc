#include "quic/dispatch.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace corral::quic {
namespace {

constexpr uint32_t kTag = 0x5eedf00d;

// Slot 2 of 4, generation index `generation`.
DispatchSelf self(unsigned generation, bool closing = false) {
  DispatchSelf s;
  s.slot = 2;
  s.generation = generation;
  s.steering = true;
  s.closing = closing;
  return s;
}

// A short-header datagram for one of our CIDs of `slot` and generation index `generation`; the
// generation serving the owner's slot is `serving`.
DatagramFacts ours(int slot, unsigned generation, unsigned serving = 0) {
  DatagramFacts d;
  d.owner = slot;
  d.ours = true;
  d.cid_generation = generation;
  d.serving = serving;
  return d;
}

DatagramFacts client_initial(int owner, unsigned serving) {
  DatagramFacts d;
  d.owner = owner;
  d.long_header = true;
  d.serving = serving;
  return d;
}

TEST(Dispatch, MakeCidCarriesTheGenerationIndex) {
  for (unsigned g = 0; g < kGenerations; ++g) {
    for (int i = 0; i < 200; ++i) {
      uint8_t cid[kCidLength];
      make_cid(cid, 5, kTag, g);
      EXPECT_EQ(cid_generation(cid), g);
      EXPECT_EQ(cid_slot(cid), 5u);
      EXPECT_TRUE(cid_is_ours(cid, kCidLength, kTag));
    }
  }
  EXPECT_EQ(generation_index(1), 1u);
  EXPECT_EQ(generation_index(5), 1u);  // generation 5 reuses generation 1's index
  EXPECT_EQ(generation_index(8), 0u);
  // The rest of byte 0 stays random.
  int high_bits = 0;
  for (int i = 0; i < 64; ++i) {
    uint8_t cid[kCidLength];
    make_cid(cid, 0, kTag, 1);
    high_bits |= cid[0] & ~kGenerationMask & 0xFF;
  }
  EXPECT_EQ(high_bits, static_cast<int>(0xFF & ~kGenerationMask));
}

TEST(Dispatch, GenerationDoesNotChangeTheOwner) {
  SteeringKey key{kTag, 7, 4};
  for (unsigned g = 0; g < kGenerations; ++g) {
    uint8_t pkt[1 + kCidLength + 20] = {0x40};
    make_cid(pkt + 1, 3, kTag, g);
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

TEST(Dispatch, AnotherSlotGoesToThePairOfTheCidsGeneration) {
  for (unsigned g = 0; g < kGenerations; ++g) {
    auto r = dispatch(self(1), ours(3, g, /*serving=*/2));
    EXPECT_EQ(r.route, Route::kToSlot);
    EXPECT_EQ(r.slot, 3);
    EXPECT_EQ(r.generation, g);
  }
}

TEST(Dispatch, ClientInitialForAnotherSlotGoesToTheGenerationServingIt) {
  for (bool closing : {false, true}) {
    for (unsigned serving = 0; serving < kGenerations; ++serving) {
      auto r = dispatch(self(1, closing), client_initial(0, serving));
      EXPECT_EQ(r.route, Route::kToSlot);
      EXPECT_EQ(r.slot, 0);
      EXPECT_EQ(r.generation, serving);
    }
  }
}

TEST(Dispatch, OtherGenerationsOfOurSlot) {
  // A draining process hands the newer generations' datagrams over (three reloads later: the
  // process of index 1 drains next to 2 and 3 (draining too) and 0 (serving))...
  for (unsigned g : {2u, 3u, 0u}) {
    auto r = dispatch(self(1, /*closing=*/true), ours(2, g, 0));
    EXPECT_EQ(r.route, Route::kToOtherGeneration);
    EXPECT_EQ(r.slot, 2);
    EXPECT_EQ(r.generation, g);
  }
  // ...and so does the serving one: the older ones still drain.
  for (unsigned g : {1u, 2u, 3u}) {
    auto r = dispatch(self(0), ours(2, g, 0));
    EXPECT_EQ(r.route, Route::kToOtherGeneration);
    EXPECT_EQ(r.generation, g);
  }
}

TEST(Dispatch, ForwardedDatagramsAreNeverForwardedAgain) {
  for (auto d : {ours(2, 0), ours(3, 0), ours(3, 1), client_initial(0, 0), client_initial(2, 3)}) {
    d.forwarded = true;
    EXPECT_EQ(dispatch(self(1, true), d).route, Route::kHere);
  }
}

TEST(Dispatch, NewConnectionsWhileClosingGoToTheServingGeneration) {
  auto r = dispatch(self(1, /*closing=*/true), client_initial(2, 3));
  EXPECT_EQ(r.route, Route::kToOtherGeneration);
  EXPECT_EQ(r.generation, 3u);
  // Not closing: accepted here, as before.
  EXPECT_EQ(dispatch(self(1), client_initial(2, 1)).route, Route::kHere);
  // Closing but nobody newer is published (a single-generation embedding): here.
  EXPECT_EQ(dispatch(self(1, true), client_initial(2, 1)).route, Route::kHere);
  // A client's Initial after our Retry (our CID, our generation) while closing: also the
  // serving one's.
  auto retried = ours(2, 1, 0);
  retried.long_header = true;
  r = dispatch(self(1, true), retried);
  EXPECT_EQ(r.route, Route::kToOtherGeneration);
  EXPECT_EQ(r.generation, 0u);
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
