// systemd's two process interfaces, without libsystemd: the notification datagrams of
// sd_notify(3) (READY=1, RELOADING=1, STOPPING=1, STATUS=, WATCHDOG=1 to $NOTIFY_SOCKET) and the
// listening sockets of sd_listen_fds(3) ($LISTEN_FDS sockets from fd 3, $LISTEN_PID,
// $LISTEN_FDNAMES). Both are read once from the environment at startup and the variables are
// removed, so that no child (server process, worker) inherits them and speaks in corral's name.
//
// Without NOTIFY_SOCKET a Notifier does nothing; sending never blocks (a full socket buffer
// drops the datagram: systemd's state then lags, the server is not held up).
//
// Lifetime: a Notifier lives as long as the process that notifies (the supervisor, or the single
// server process); its Watchdog timer is bound to one event loop and must be destroyed before it.
// Single-threaded; take_from_environment() must run before any thread starts (setenv/unsetenv).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "core/timer_wheel.h"
#include "core/unique_fd.h"

namespace corral::core {

class EventLoop;

class Notifier {
 public:
  Notifier() = default;
  // From NOTIFY_SOCKET (a path, or "@name" for the abstract namespace), WATCHDOG_USEC and
  // WATCHDOG_PID (the watchdog is ours when it is unset or names this process). Unsets all three.
  static Notifier take_from_environment();

  bool enabled() const { return fd_.valid(); }
  // One datagram of newline-separated "KEY=value" assignments. False if it was not sent.
  bool send(std::string_view state) const;
  void ready() const { send("READY=1"); }
  // RELOADING=1 with MONOTONIC_USEC (CLOCK_MONOTONIC in µs), which systemd 253+ compares with the
  // time it asked for the reload.
  void reloading() const;
  void stopping() const { send("STOPPING=1"); }
  // STATUS=<line>, only when it differs from the last one sent.
  void status(const std::string& line);
  // Every WATCHDOG_USEC / 2, or 0 when systemd asked for no watchdog.
  uint64_t watchdog_interval_ms() const { return watchdog_ms_; }

 private:
  UniqueFd fd_;
  std::string address_;  // sockaddr_un's sun_path, a leading NUL for an abstract name
  uint64_t watchdog_ms_ = 0;
  std::string last_status_;
};

// WATCHDOG=1 every watchdog_interval_ms() on `loop` while it lives (nothing without a watchdog).
class Watchdog {
 public:
  Watchdog(const Notifier& notifier, EventLoop& loop);

 private:
  void ping();
  const Notifier& notifier_;
  Timer timer_;
};

// The listening sockets systemd passed (socket activation): fds 3 .. 3 + LISTEN_FDS - 1 when
// LISTEN_PID is this process, each made non-blocking and close-on-exec, with its name from
// LISTEN_FDNAMES ("" when absent). Unsets the three variables. Empty when nothing was passed; an
// error when LISTEN_FDS is malformed.
struct PassedSocket {
  UniqueFd fd;
  std::string name;
};
Result<std::vector<PassedSocket>> take_passed_sockets();

}  // namespace corral::core
