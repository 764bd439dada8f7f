#include "core/systemd.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/event_loop.h"

namespace corral::core {

namespace {

// A decimal number with nothing after it, or nullopt.
bool parse_u64(const char* text, uint64_t& out) {
  if (!text || !*text) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-') return false;
  out = v;
  return true;
}

}  // namespace

Notifier Notifier::take_from_environment() {
  Notifier n;
  const char* socket_path = getenv("NOTIFY_SOCKET");
  std::string path = socket_path ? socket_path : "";
  uint64_t watchdog_usec = 0, watchdog_pid = 0;
  bool watchdog = parse_u64(getenv("WATCHDOG_USEC"), watchdog_usec) && watchdog_usec > 0;
  if (watchdog && getenv("WATCHDOG_PID")) {
    watchdog = parse_u64(getenv("WATCHDOG_PID"), watchdog_pid) &&
               watchdog_pid == static_cast<uint64_t>(getpid());
  }
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  // Only absolute paths and abstract names: a relative path would depend on the working directory.
  if (path.size() < 2 || (path[0] != '/' && path[0] != '@') ||
      path.size() >= sizeof(sockaddr_un::sun_path))
    return n;
  if (path[0] == '@') path[0] = '\0';
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return n;
  n.fd_.reset(fd);
  n.address_ = std::move(path);
  if (watchdog) n.watchdog_ms_ = std::max<uint64_t>(watchdog_usec / 2 / 1000, 1);
  return n;
}

bool Notifier::send(std::string_view state) const {
  if (!fd_.valid()) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, address_.data(), address_.size());
  // An abstract name's length is exact (its NUL is part of it); a path's ends at its own NUL.
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size() +
                                    (address_[0] == '\0' ? 0 : 1));
  ssize_t n = ::sendto(fd_.get(), state.data(), state.size(), MSG_NOSIGNAL,
                       reinterpret_cast<const sockaddr*>(&addr), len);
  return n == static_cast<ssize_t>(state.size());
}

void Notifier::reloading() const {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t usec =
      static_cast<uint64_t>(ts.tv_sec) * 1'000'000 + static_cast<uint64_t>(ts.tv_nsec) / 1'000;
  send("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec));
}

void Notifier::status(const std::string& line) {
  if (!enabled() || line == last_status_) return;
  if (send("STATUS=" + line)) last_status_ = line;
}

Watchdog::Watchdog(const Notifier& notifier, EventLoop& loop)
    : notifier_(notifier), timer_(loop.timers(), [this] { ping(); }) {
  if (notifier_.enabled() && notifier_.watchdog_interval_ms() > 0) ping();
}

void Watchdog::ping() {
  notifier_.send("WATCHDOG=1");
  timer_.arm_after(notifier_.watchdog_interval_ms());
}

Result<std::vector<PassedSocket>> take_passed_sockets() {
  std::vector<PassedSocket> out;
  const char* fds_text = getenv("LISTEN_FDS");
  const char* pid_text = getenv("LISTEN_PID");
  std::string names = getenv("LISTEN_FDNAMES") ? getenv("LISTEN_FDNAMES") : "";
  bool present = fds_text != nullptr;
  uint64_t count = 0, pid = 0;
  bool ours = present && parse_u64(pid_text, pid) && pid == static_cast<uint64_t>(getpid());
  bool valid_count = present && parse_u64(fds_text, count);
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDNAMES");
  if (!present || !ours) return out;  // meant for another process (the one that exec'd us)
  constexpr int kFirst = 3;           // SD_LISTEN_FDS_START
  if (!valid_count || count > 1024)
    return Error{EINVAL, "LISTEN_FDS: \"" + std::string(fds_text) + "\" is not a socket count"};
  std::vector<std::string> split;
  for (size_t start = 0; !names.empty();) {
    size_t colon = names.find(':', start);
    split.push_back(names.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  for (uint64_t i = 0; i < count; ++i) {
    int fd = kFirst + static_cast<int>(i);
    int flags = fcntl(fd, F_GETFD);
    if (flags < 0)
      return Error{EBADF, "LISTEN_FDS: descriptor " + std::to_string(fd) + " is not open"};
    (void)fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);  // every process accepts from it
    PassedSocket s;
    s.fd.reset(fd);
    if (i < split.size()) s.name = split[i];
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace corral::core
