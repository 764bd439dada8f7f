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
  EXPECT_TRUE(retry_required(RetryMode::kOn, 0, 1000));
  EXPECT_FALSE(retry_required(RetryMode::kOff, 1'000'000, 1000));
  EXPECT_FALSE(retry_required(RetryMode::kAuto, 1000, 1000));
  EXPECT_TRUE(retry_required(RetryMode::kAuto, 1001, 1000));
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
