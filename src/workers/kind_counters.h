// KindCounters: what the worker manager counts per kind for GET /metrics (control/metrics.h): its
// starts (cold: a fork; spare: a warm spare bound), its failures and its stops by reason, and the
// start latency (the `start` message, sent right after the fork or at the bind, to `ready`).
// Counted by the Manager on the supervisor's loop, the only thread that touches them; read by
// the /metrics route on that same loop. Every label value is one of the fixed lists below.
#pragma once

#include <cstdint>
#include <iterator>
#include <string_view>

#include "http/metrics.h"

namespace corral::workers {

struct KindCounters {
  // Where a start came from: kStartFrom[from_spare].
  static constexpr std::string_view kStartFrom[] = {"cold", "spare"};
  // A failure's reason: the public error's code when it is one of these (the manager's own
  // codes), "fatal" for a worker's `fatal` message (its code is the worker's to choose), else
  // "other".
  static constexpr std::string_view kFailureReasons[] = {
      "start_failed", "start_timeout", "ready_timeout", "worker_exited", "link_lost",
      "unresponsive", "memory_limit",  "fatal",         "other"};
  // A stop's reason (Manager::begin_stop's), else "other".
  static constexpr std::string_view kStopReasons[] = {"idle",      "stop",         "failed",
                                                      "evicted",   "rollout",      "close",
                                                      "link_lost", "unresponsive", "other"};

  uint64_t starts[std::size(kStartFrom)] = {};
  uint64_t failures[std::size(kFailureReasons)] = {};
  uint64_t stops[std::size(kStopReasons)] = {};
  http::StartHistogram start_duration[std::size(kStartFrom)] = {};  // by kStartFrom

  void started(bool from_spare) { ++starts[from_spare ? 1 : 0]; }
  void ready(bool from_spare, uint64_t ms) {
    start_duration[from_spare ? 1 : 0].observe(http::kStartBoundsUs, ms * 1000);
  }
  void failed(std::string_view code, bool fatal) {
    failures[fatal && code != "memory_limit" ? index_of(kFailureReasons, "fatal")
                                             : index_of(kFailureReasons, code)]++;
  }
  void stopped(std::string_view why) { ++stops[index_of(kStopReasons, why)]; }

 private:
  // The index of `v` in `list`, or of its last entry ("other").
  template <size_t N>
  static size_t index_of(const std::string_view (&list)[N], std::string_view v) {
    for (size_t i = 0; i + 1 < N; ++i)
      if (list[i] == v) return i;
    return N - 1;
  }
};

}  // namespace corral::workers
