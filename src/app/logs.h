// The logs' settings (log_format, access_log, access_log_format) applied to a process's Logger:
// by serve() before anything forks (the supervisor's, inherited by every process), and by each
// server process for its generation (a reload may change them).
#pragma once

#include <string>

#include "app/app.h"
#include "core/log.h"

namespace corral::app {

// "" or what failed (the access file could not be opened; the logger keeps its current one).
inline std::string apply_log_options(core::Logger& log, const Options& options) {
  log.set_format(options.log_format);
  log.set_access_format(options.access_log_format);
  return log.set_access_file(options.access_log_path);
}

}  // namespace corral::app
