// CodeStoreThread with a real core::EventLoop: the work runs on another thread, in order, and its
// results run on the loop; destroying it stops a running task and joins, and no result of a task
// not delivered runs afterwards.
#include "workers/code_store_thread.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace corral::workers {
namespace {

bool run_until(core::EventLoop& loop, const std::function<bool()>& done) {
  uint64_t deadline = core::monotonic_ms() + 5'000;
  while (!done() && core::monotonic_ms() < deadline) loop.run_once(20);
  return done();
}

TEST(CodeStoreThreadTest, WorkRunsOffTheLoopInOrderAndResultsOnIt) {
  core::EventLoop loop;
  auto t = CodeStoreThread::create(loop);
  ASSERT_TRUE(t.ok()) << t.error().reason;
  const auto loop_thread = std::this_thread::get_id();
  std::vector<int> order;
  std::atomic<int> off_loop{0};
  for (int i = 0; i < 3; ++i) {
    (*t)->post([&, i](std::stop_token) {
      if (std::this_thread::get_id() != loop_thread) ++off_loop;
      return std::function<void()>([&, i] {
        EXPECT_EQ(std::this_thread::get_id(), loop_thread);
        order.push_back(i);
      });
    });
  }
  EXPECT_TRUE(order.empty());  // never before the loop runs
  ASSERT_TRUE(run_until(loop, [&] { return order.size() == 3; }));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(off_loop, 3);
}

TEST(CodeStoreThreadTest, DestroyingItStopsTheRunningTaskAndDropsTheRest) {
  core::EventLoop loop;
  auto t = CodeStoreThread::create(loop);
  ASSERT_TRUE(t.ok()) << t.error().reason;
  std::atomic<bool> running{false}, stopped{false};
  bool delivered = false;
  (*t)->post([&](std::stop_token stop) {
    running = true;
    while (!stop.stop_requested()) std::this_thread::yield();
    stopped = true;
    return std::function<void()>([&] { delivered = true; });
  });
  (*t)->post([&](std::stop_token) { return std::function<void()>([&] { delivered = true; }); });
  while (!running) std::this_thread::yield();
  t->reset();  // joins
  EXPECT_TRUE(stopped);
  loop.run_once(0);
  EXPECT_FALSE(delivered);
}

}  // namespace
}  // namespace corral::workers
