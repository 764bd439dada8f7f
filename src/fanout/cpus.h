// CPU sets for the fan-out: how many server processes to run and where to pin them.
#pragma once

#include <vector>

#include "core/result.h"

namespace corral::fanout {

// The most processes a supervisor runs: the CPUs an 8-byte sched_setaffinity mask covers.
constexpr int kMaxProcesses = 64;

// The CPUs this process may run on (sched_getaffinity), ascending.
core::Result<std::vector<int>> allowed_cpus();

// `requested` 0 means one per allowed CPU. More than kMaxProcesses is refused; with `pin`, more
// processes than allowed CPUs is refused (process i is pinned to the i-th allowed CPU).
core::Result<int> resolve_process_count(int requested, const std::vector<int>& cpus, bool pin);

// Pins the calling thread (the process, before it starts threads) to `cpu`.
core::Result<void> pin_to_cpu(int cpu);

}  // namespace corral::fanout
