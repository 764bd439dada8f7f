#include "quic/stateless.h"

#include <gtest/gtest.h>
#include <ngtcp2/ngtcp2.h>

#include <cstring>

#include "quic/steering.h"

namespace corral::quic {
namespace {

TEST(StatelessReset, SmallerThanTheTrigger) {
  EXPECT_EQ(stateless_reset_length(0), 0u);
  EXPECT_EQ(stateless_reset_length(21), 0u);  // 5 + 16 cannot be smaller than 21
  EXPECT_EQ(stateless_reset_length(22), 21u);
  EXPECT_EQ(stateless_reset_length(40), 39u);
  EXPECT_EQ(stateless_reset_length(1200), 59u);
  // What ngtcp2 writes for that length is exactly that long.
  for (size_t trigger : {22u, 40u, 1200u}) {
    size_t total = stateless_reset_length(trigger);
    uint8_t token[16] = {}, rnd[64] = {}, out[128];
    auto n = ngtcp2_pkt_write_stateless_reset(out, sizeof out, token, rnd,
                                              total - NGTCP2_STATELESS_RESET_TOKENLEN);
    EXPECT_EQ(static_cast<size_t>(n), total);
    EXPECT_LT(static_cast<size_t>(n), trigger);
    EXPECT_EQ(out[0] & 0x80, 0);  // looks like a short header
  }
}

TEST(StatelessReset, TokenDependsOnSecretAndCidOnly) {
  uint8_t secret[32], other[32];
  for (int i = 0; i < 32; ++i) {
    secret[i] = static_cast<uint8_t>(i);
    other[i] = static_cast<uint8_t>(i + 1);
  }
  uint8_t cid[kCidLength];
  make_cid(cid, 3, 0xabcdef01, 1);
  uint8_t a[16], b[16], c[16];
  ASSERT_TRUE(stateless_reset_token(secret, 32, cid, sizeof cid, a));
  ASSERT_TRUE(stateless_reset_token(secret, 32, cid, sizeof cid, b));
  EXPECT_EQ(memcmp(a, b, 16), 0);  // a respawned process computes the same token
  ASSERT_TRUE(stateless_reset_token(other, 32, cid, sizeof cid, c));
  EXPECT_NE(memcmp(a, c, 16), 0);
  cid[10] ^= 1;
  ASSERT_TRUE(stateless_reset_token(secret, 32, cid, sizeof cid, c));
  EXPECT_NE(memcmp(a, c, 16), 0);
  uint8_t too_long[NGTCP2_MAX_CIDLEN + 1] = {};
  EXPECT_FALSE(stateless_reset_token(secret, 32, too_long, sizeof too_long, c));
}

TEST(Retry, Policy) {
  AdmissionFacts f;
  f.mode = RetryMode::kOn;
  EXPECT_EQ(admit_initial(f), Admission::kRetry);
  f.mode = RetryMode::kOff;
  f.initials_this_second = 1'000'000;
  EXPECT_EQ(admit_initial(f), Admission::kAccept);
  f.mode = RetryMode::kAuto;
  f.initials_this_second = 1000;
  EXPECT_EQ(admit_initial(f), Admission::kAccept);
  f.initials_this_second = 1001;
  EXPECT_EQ(admit_initial(f), Admission::kRetry);
  // A validated address never gets a second Retry.
  f.validated = true;
  EXPECT_EQ(admit_initial(f), Admission::kAccept);
}

TEST(Retry, FloodGetsRetryBeforeAnyCap) {
  AdmissionFacts f;  // kAuto, a low Initial rate
  f.unvalidated = f.max_unvalidated;
  EXPECT_EQ(admit_initial(f), Admission::kRetry);
  f.unvalidated = 0;
  f.connections = f.max_connections;
  EXPECT_EQ(admit_initial(f), Admission::kRetry);  // not dropped by the connection cap
  f.validated = true;
  EXPECT_EQ(admit_initial(f), Admission::kRefuse);  // a real address meets the cap
  // Retry off: the caps still bound the state an unvalidated flood makes.
  f = AdmissionFacts{};
  f.mode = RetryMode::kOff;
  f.unvalidated = f.max_unvalidated;
  EXPECT_EQ(admit_initial(f), Admission::kRefuse);
  f.unvalidated = 0;
  f.connections = f.max_connections;
  EXPECT_EQ(admit_initial(f), Admission::kRefuse);
}

TEST(TokenBucket, BurstThenRate) {
  TokenBucket b(1000, 3);  // 1 a millisecond, 3 at once
  EXPECT_TRUE(b.take(10));
  EXPECT_TRUE(b.take(10));
  EXPECT_TRUE(b.take(10));
  EXPECT_FALSE(b.take(10));
  EXPECT_TRUE(b.take(11));
  EXPECT_FALSE(b.take(11));
  EXPECT_TRUE(b.take(100));  // refilled to the burst, not beyond
  EXPECT_TRUE(b.take(100));
  EXPECT_TRUE(b.take(100));
  EXPECT_FALSE(b.take(100));
  TokenBucket slow(2, 1);  // 2 a second: one every 500 ms
  EXPECT_TRUE(slow.take(0));
  EXPECT_FALSE(slow.take(499));
  EXPECT_TRUE(slow.take(500));
  TokenBucket none(0, 0);
  EXPECT_FALSE(none.take(1000));
}

TEST(PerSecond, CountsWithinOneSecond) {
  PerSecond p;
  EXPECT_EQ(p.current(5000), 0u);
  EXPECT_EQ(p.add(5000), 1u);
  EXPECT_EQ(p.add(5999), 2u);
  EXPECT_EQ(p.current(5999), 2u);
  EXPECT_EQ(p.current(6000), 0u);
  EXPECT_EQ(p.add(6000), 1u);
}

}  // namespace
}  // namespace corral::quic
