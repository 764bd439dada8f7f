// What serve() takes from systemd (core/systemd.h): the notifier, and the listening sockets it
// passed, matched to the configured addresses. The rule, for each passed socket:
//
//  * named "http" (FileDescriptorName=http in the .socket unit): the `listen` address's socket;
//  * named "https": the `tls_listen` address's (TCP; HTTP/3's UDP sockets are corral's own);
//  * any other name: the configured address it is bound to, compared as "ip:port";
//  * no match, two sockets for one address, or not a listening TCP socket: a startup problem.
//
// A configured address with no passed socket is bound as usual. A passed socket is not claimed
// (fanout/listen_claim.h): systemd holds it, and no other program can bind it meanwhile.
//
// Lifetime: SystemdContext is taken once at the start of serve() and lives as long as it; a
// SystemdReport lives on one event loop (the supervisor's) and is destroyed before it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/event_loop.h"
#include "core/result.h"
#include "core/socket.h"
#include "core/systemd.h"

namespace corral::app {

struct SystemdContext {
  core::Notifier notifier;
  std::vector<core::UniqueFd> passed;  // by address index (listen, tls_listen); invalid: bind
};

// Takes NOTIFY_SOCKET and LISTEN_FDS from the environment (unsetting them) and matches the
// sockets to `addresses` (listen first, then tls_listen) by the rule above. The error names the
// socket and what to do.
core::Result<SystemdContext> take_systemd(const std::vector<core::SocketAddress>& addresses);

// On the supervisor's loop: STATUS=<status()> each second when it changed, and the watchdog.
class SystemdReport {
 public:
  SystemdReport(core::Notifier& notifier, core::EventLoop& loop,
                std::function<std::string()> status);
  void update() { notifier_.status(status_()); }

 private:
  core::Notifier& notifier_;
  std::function<std::string()> status_;
  core::Watchdog watchdog_;
  core::Timer timer_;
};

}  // namespace corral::app
