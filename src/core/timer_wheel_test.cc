#include "core/timer_wheel.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace corral::core {
namespace {

TEST(TimerWheel, FiresAtDeadlineNotBefore) {
  TimerWheel w(1000);
  int fired = 0;
  Timer t(w, [&] { ++fired; });
  t.arm_after(50);
  EXPECT_EQ(w.next_timeout(), 50);
  w.advance(1049);
  EXPECT_EQ(fired, 0);
  w.advance(1050);
  EXPECT_EQ(fired, 1);
  EXPECT_FALSE(t.armed());
}

TEST(TimerWheel, CancelAndRearmAreConstantTimeAndExact) {
  TimerWheel w(0);
  int fired = 0;
  Timer t(w, [&] { ++fired; });
  t.arm_after(10);
  t.cancel();
  EXPECT_EQ(w.armed_count(), 0u);
  EXPECT_EQ(w.next_timeout(), -1);
  t.arm_after(20);
  t.arm_after(30);  // moves, does not duplicate
  EXPECT_EQ(w.armed_count(), 1u);
  w.advance(25);
  EXPECT_EQ(fired, 0);
  w.advance(30);
  EXPECT_EQ(fired, 1);
}

TEST(TimerWheel, LongTimersSurviveRotations) {
  TimerWheel w(0);
  int fired = 0;
  Timer t(w, [&] { ++fired; });
  t.arm_after(60'000);  // ~15 rotations of the 4096-slot wheel
  for (uint64_t now = 1; now < 60'000; now += 7) w.advance(now);
  EXPECT_EQ(fired, 0);
  w.advance(60'000);
  EXPECT_EQ(fired, 1);
}

TEST(TimerWheel, BigJumpFiresEverythingDue) {
  TimerWheel w(0);
  int fired = 0;
  std::vector<std::unique_ptr<Timer>> timers;
  for (int i = 0; i < 10'000; ++i) {
    timers.push_back(std::make_unique<Timer>(w, [&] { ++fired; }));
    timers.back()->arm_after(1 + (i * 37) % 20'000);
  }
  w.advance(10'000);
  int due = 0;
  for (int i = 0; i < 10'000; ++i) due += (1 + (i * 37) % 20'000) <= 10'000;
  EXPECT_EQ(fired, due);
  w.advance(20'001);
  EXPECT_EQ(fired, 10'000);
  EXPECT_EQ(w.armed_count(), 0u);
}

TEST(TimerWheel, CallbackMayCancelOthersAndRearmItself) {
  TimerWheel w(0);
  int a_fired = 0, b_fired = 0;
  Timer b(w, [&] { ++b_fired; });
  Timer a(w, nullptr);
  a.bind(w, [&] {
    ++a_fired;
    b.cancel();
    if (a_fired < 3) a.arm_after(5);
  });
  a.arm_after(5);
  b.arm_after(5);  // same slot as a, after it
  w.advance(5);
  EXPECT_EQ(a_fired, 1);
  EXPECT_EQ(b_fired, 0);
  w.advance(10);
  w.advance(15);
  EXPECT_EQ(a_fired, 3);
}

TEST(TimerWheel, DestroyingAnArmedTimerUnlinksIt) {
  TimerWheel w(0);
  {
    Timer t(w, [] { FAIL(); });
    t.arm_after(3);
  }
  EXPECT_EQ(w.armed_count(), 0u);
  w.advance(10);
}

}  // namespace
}  // namespace corral::core
