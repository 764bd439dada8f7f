#include "http/metrics.h"

namespace corral::http {

namespace {
ProcessMetrics own_block;  // the process's until adopt_metrics(): counted, never read
std::vector<std::string> kind_names;
}  // namespace

ProcessMetrics* detail::current_metrics = &own_block;

void adopt_metrics(ProcessMetrics* block, std::vector<std::string> kinds) {
  if (!block) return;
  for (auto& g : block->gauges.connections_open) store(g, 0);
  store(block->gauges.websockets_open, 0);
  detail::current_metrics = block;
  kind_names = std::move(kinds);
}

int metrics_kind(std::string_view address) {
  std::string_view kind = address.substr(0, address.find(':'));
  for (size_t i = 0; i < kind_names.size() && i < kMetricsKinds; ++i)
    if (kind_names[i] == kind) return static_cast<int>(i);
  return -1;
}

}  // namespace corral::http
