#include "quic/steering_setup.h"

#include <gtest/gtest.h>

#include "fanout/quic_sockets.h"

namespace corral::quic {
namespace {

core::Logger quiet_log() {
  return core::Logger(2, core::LogLevel::kError);
}

TEST(SteeringSetup, ParsesRequests) {
  EXPECT_EQ(parse_steering_request("auto").value(), SteeringRequest::kAuto);
  EXPECT_EQ(parse_steering_request("bpf").value(), SteeringRequest::kBpf);
  EXPECT_EQ(parse_steering_request("forward").value(), SteeringRequest::kForward);
  EXPECT_EQ(parse_steering_request("off").value(), SteeringRequest::kOff);
  auto bad = parse_steering_request("ebpf");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().reason.find("auto, bpf, forward or off"), std::string::npos);
  EXPECT_STREQ(steering_name(SteeringMode::kBpf), "bpf");
  EXPECT_STREQ(steering_name(SteeringMode::kForward), "forward");
  EXPECT_STREQ(steering_name(SteeringMode::kOff), "off");
}

fanout::QuicSockets sockets(int slots) {
  auto r = fanout::make_quic_sockets(
      {core::parse_address("127.0.0.1:0").value(), core::parse_address("[::1]:0").value()}, slots);
  EXPECT_TRUE(r.ok()) << r.error().reason;
  return std::move(r.value());
}

TEST(SteeringSetup, ForwardAndOffLoadNothing) {
  auto q = sockets(3);
  auto log = quiet_log();
  for (auto req : {SteeringRequest::kForward, SteeringRequest::kOff}) {
    auto s = setup_steering({q.group(0), q.group(1)}, 3, req, log);
    ASSERT_TRUE(s.ok()) << s.error().reason;
    EXPECT_EQ((*s)->mode,
              req == SteeringRequest::kOff ? SteeringMode::kOff : SteeringMode::kForward);
    EXPECT_TRUE((*s)->programs.empty());
    EXPECT_EQ((*s)->key.slots, 3u);
  }
}

TEST(SteeringSetup, TagAndSeedAreRandomPerSetup) {
  auto q = sockets(2);
  auto log = quiet_log();
  auto a = setup_steering({q.group(0)}, 2, SteeringRequest::kForward, log);
  auto b = setup_steering({q.group(0)}, 2, SteeringRequest::kForward, log);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE((*a)->key.tag == (*b)->key.tag && (*a)->key.seed == (*b)->key.seed);
}

TEST(SteeringSetup, RejectsMalformedGroups) {
  auto q = sockets(2);
  auto log = quiet_log();
  EXPECT_FALSE(setup_steering({q.group(0)}, 3, SteeringRequest::kForward, log).ok());
  EXPECT_FALSE(setup_steering({}, 0, SteeringRequest::kForward, log).ok());
  EXPECT_FALSE(setup_steering({}, kMaxSlots + 1, SteeringRequest::kForward, log).ok());
}

TEST(SteeringSetup, ContextCarriesTheSharedKey) {
  auto q = sockets(2);
  auto log = quiet_log();
  auto s = setup_steering({q.group(0)}, 2, SteeringRequest::kForward, log);
  ASSERT_TRUE(s.ok());
  auto ctx = (*s)->context(1, 6, {7, 8}, 9, {{10, 11, 12, 13}, {14, 15, 16, 17}});
  EXPECT_EQ(ctx.slot, 1);
  EXPECT_EQ(ctx.generation, 6u);
  EXPECT_EQ(ctx.generation_index(), 2u);
  EXPECT_EQ(ctx.serving_index(0), 2u);  // nobody publishes it: our own
  EXPECT_EQ(ctx.key.tag, (*s)->key.tag);
  EXPECT_EQ(ctx.key.seed, (*s)->key.seed);
  EXPECT_EQ(ctx.key.slots, 2u);
  EXPECT_EQ(ctx.mode, SteeringMode::kForward);
  EXPECT_EQ(ctx.udp_fds, (std::vector<int>{7, 8}));
  EXPECT_EQ(ctx.forward_rx, 9);
  EXPECT_EQ(ctx.forward_tx, (std::vector<ForwardPair>{{10, 11, 12, 13}, {14, 15, 16, 17}}));
  std::atomic<uint64_t> serving[2] = {7, 9};
  ctx.serving = serving;
  EXPECT_EQ(ctx.serving_index(0), 3u);
  EXPECT_EQ(ctx.serving_index(1), 1u);
}

TEST(SteeringSetup, BpfLoadsOneProgramPerAddress) {
  if (!has_bpf_capability()) GTEST_SKIP() << "needs CAP_BPF (or root)";
  auto q = sockets(4);
  auto log = quiet_log();
  for (auto req : {SteeringRequest::kBpf, SteeringRequest::kAuto}) {
    auto fresh = sockets(4);  // a group takes one program's sockarray only once
    auto s = setup_steering({fresh.group(0), fresh.group(1)}, 4, req, log);
    ASSERT_TRUE(s.ok()) << s.error().reason;
    EXPECT_EQ((*s)->mode, SteeringMode::kBpf);
    EXPECT_EQ((*s)->programs.size(), 2u);
    EXPECT_TRUE((*s)->fallback_reason.empty());
  }
}

TEST(SteeringSetup, AutoFallsBackToForwardWithAReason) {
  // Sockets already in another program's sockarray cannot join a second one (EBUSY); without
  // CAP_BPF the load itself fails. Either way auto ends in forward mode and says why.
  auto q = sockets(2);
  auto log = quiet_log();
  std::shared_ptr<Steering> first;
  if (has_bpf_capability()) {
    auto s = setup_steering({q.group(0)}, 2, SteeringRequest::kBpf, log);
    ASSERT_TRUE(s.ok()) << s.error().reason;
    first = s.value();
  }
  auto s = setup_steering({q.group(0)}, 2, SteeringRequest::kAuto, log);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->mode, SteeringMode::kForward);
  EXPECT_FALSE((*s)->fallback_reason.empty());
  if (!has_bpf_capability()) {
    EXPECT_NE((*s)->fallback_reason.find("no CAP_BPF"), std::string::npos) << (*s)->fallback_reason;
  }
  auto strict = setup_steering({q.group(0)}, 2, SteeringRequest::kBpf, log);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.error().reason.find("BPF steering: "), std::string::npos);
}

}  // namespace
}  // namespace corral::quic
