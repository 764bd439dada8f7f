// KindCounters (kind_counters.h): every reason a label value of a fixed list, whatever the
// worker or the caller says.
#include "workers/kind_counters.h"

#include <gtest/gtest.h>

namespace corral::workers {
namespace {

size_t at(const std::string_view* list, size_t n, std::string_view v) {
  for (size_t i = 0; i < n; ++i)
    if (list[i] == v) return i;
  return n;
}

TEST(KindCountersTest, FailuresAreCountedByAKnownCodeOrAsFatalOrOther) {
  KindCounters c;
  constexpr size_t n = std::size(KindCounters::kFailureReasons);
  c.failed("start_timeout", false);
  c.failed("start_timeout", true);  // a worker's `fatal` that says start_timeout: fatal
  c.failed("memory_limit", true);   // the manager's reading of a fatal under the memory limit
  c.failed("anything-a-worker-says", false);
  c.failed("", false);
  EXPECT_EQ(c.failures[at(KindCounters::kFailureReasons, n, "start_timeout")], 1u);
  EXPECT_EQ(c.failures[at(KindCounters::kFailureReasons, n, "fatal")], 1u);
  EXPECT_EQ(c.failures[at(KindCounters::kFailureReasons, n, "memory_limit")], 1u);
  EXPECT_EQ(c.failures[at(KindCounters::kFailureReasons, n, "other")], 2u);
}

TEST(KindCountersTest, StopsStartsAndStartLatency) {
  KindCounters c;
  constexpr size_t n = std::size(KindCounters::kStopReasons);
  c.stopped("idle");
  c.stopped("idle");
  c.stopped("a reason nobody listed");
  EXPECT_EQ(c.stops[at(KindCounters::kStopReasons, n, "idle")], 2u);
  EXPECT_EQ(c.stops[at(KindCounters::kStopReasons, n, "other")], 1u);
  c.started(false);
  c.started(true);
  c.started(true);
  EXPECT_EQ(c.starts[0], 1u);
  EXPECT_EQ(c.starts[1], 2u);
  c.ready(false, 30);  // ms: the 50 ms bucket (index 3: 5, 10, 25, 50)
  EXPECT_EQ(c.start_duration[0].counts[3], 1u);
  EXPECT_EQ(c.start_duration[0].sum_us, 30'000u);
  EXPECT_EQ(c.start_duration[1].sum_us, 0u);
}

}  // namespace
}  // namespace corral::workers
