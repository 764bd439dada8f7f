#include "fanout/cpus.h"

#include <sched.h>

#include <string>

namespace corral::fanout {

core::Result<std::vector<int>> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) < 0) return core::errno_error("sched_getaffinity");
  std::vector<int> cpus;
  for (int i = 0; i < CPU_SETSIZE; ++i)
    if (CPU_ISSET(i, &set)) cpus.push_back(i);
  return cpus;
}

core::Result<int> resolve_process_count(int requested, const std::vector<int>& cpus, bool pin) {
  if (requested < 0) return core::Error{EINVAL, "processes: must be 0 (one per CPU) or more"};
  int n = requested == 0 ? static_cast<int>(cpus.size()) : requested;
  if (n > kMaxProcesses)
    return core::Error{EINVAL, "processes: " + std::to_string(n) + " is more than the maximum of " +
                                   std::to_string(kMaxProcesses)};
  if (n == 0) return core::Error{EINVAL, "processes: no CPU is available to this process"};
  if (pin && n > static_cast<int>(cpus.size()))
    return core::Error{EINVAL, "pin: process " + std::to_string(cpus.size()) +
                                   " would need a CPU, but only " + std::to_string(cpus.size()) +
                                   " CPUs are allowed to this process"};
  return n;
}

core::Result<void> pin_to_cpu(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return core::Error{EINVAL, "cpu out of range"};
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) < 0) return core::errno_error("sched_setaffinity");
  return {};
}

}  // namespace corral::fanout
