// How serve() reports a problem before anything serves: on stderr as "corral: <where>: <problem>"
// (or, for a listen address, in the log), and the exit status that goes with it (app.h).
#pragma once

#include <string>

#include "core/log.h"
#include "core/result.h"
#include "core/socket.h"

namespace corral::app {

// Prints the problem; returns kExitBadConfig.
int print_problem(const std::string& where, const std::string& problem);
// A state directory problem; kExitUnsafeState for an unsafe one, else kExitBadConfig.
int state_problem(const core::Error& e);
// A listen address another corral holds (fanout/listen_claim.h) or another program is bound to
// (EADDRINUSE): a line on stderr naming it and what to do, and kExitAddressHeld; any other
// failure is logged (`listen_failed`) and 1.
int listen_problem(core::Logger& log, const core::SocketAddress& address, const core::Error& e);

}  // namespace corral::app
