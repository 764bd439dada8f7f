// The configured worker kinds ([workers.<kind>] in the TOML) as the worker manager's and the proxy
// routes' KindConfig (with the code directory, reload mode and timeout a rollout uses). Pure
// conversion; the worker path itself lives in src/workers/.
#pragma once

#include <string>
#include <vector>

#include "cli/config.h"
#include "workers/manager.h"

namespace corral::cli {

std::vector<workers::KindConfig> kind_configs(const std::vector<WorkerKind>& kinds);

// `corral check`: what a snapshot of each kind's code directory would refuse (a device, a socket,
// a symlink out of the tree, an unreadable file: workers/code_store.h), as
// "workers.<kind>.code: <reason>" problems. Reads the directories; copies nothing.
void check_code_dirs(const std::vector<WorkerKind>& kinds, std::vector<std::string>& problems);

}  // namespace corral::cli
