// The configured worker kinds ([workers.<kind>] in the TOML) as the worker manager's and the proxy
// routes' KindConfig (with the code directory, reload mode and timeout a rollout uses). Pure
// conversion; the worker path itself lives in src/workers/.
#pragma once

#include <vector>

#include "cli/config.h"
#include "workers/manager.h"

namespace corral::cli {

std::vector<workers::KindConfig> kind_configs(const std::vector<WorkerKind>& kinds);

}  // namespace corral::cli
