#include "app/systemd.h"

#include <sys/socket.h>

#include <cerrno>

namespace corral::app {

namespace {

int socket_option(int fd, int option) {
  int value = -1;
  socklen_t len = sizeof value;
  if (getsockopt(fd, SOL_SOCKET, option, &value, &len) != 0) return -1;
  return value;
}

}  // namespace

core::Result<SystemdContext> take_systemd(const std::vector<core::SocketAddress>& addresses) {
  SystemdContext out;
  out.notifier = core::Notifier::take_from_environment();
  auto passed = core::take_passed_sockets();
  if (!passed) return passed.error();
  out.passed.resize(addresses.size());
  for (auto& s : passed.value()) {
    int fd = s.fd.get();
    std::string which = "socket " + std::to_string(fd) +
                        (s.name.empty() ? std::string() : " (named \"" + s.name + "\")");
    auto local = core::local_address(fd);
    int domain = socket_option(fd, SO_DOMAIN);
    if (!local || (domain != AF_INET && domain != AF_INET6) ||
        socket_option(fd, SO_TYPE) != SOCK_STREAM || socket_option(fd, SO_ACCEPTCONN) != 1)
      return core::Error{EINVAL, which +
                                     " is not a listening TCP socket (corral takes ListenStream= "
                                     "sockets)"};
    which += " on " + local->to_string();
    size_t index = addresses.size();
    if (s.name == "http") {
      index = 0;
    } else if (s.name == "https") {
      if (addresses.size() < 2)
        return core::Error{EINVAL, which + " is for HTTPS, but no tls_listen is configured"};
      index = 1;
    } else {
      for (size_t a = 0; a < addresses.size(); ++a)
        if (addresses[a].port() != 0 && addresses[a].to_string() == local->to_string()) index = a;
    }
    if (index == addresses.size())
      return core::Error{EINVAL, which +
                                     " matches no listen address: name it http or https "
                                     "(FileDescriptorName=), or configure the address it is "
                                     "bound to"};
    if (out.passed[index])
      return core::Error{EINVAL, which + " is a second socket for " + addresses[index].to_string()};
    out.passed[index] = std::move(s.fd);
  }
  return out;
}

SystemdReport::SystemdReport(core::Notifier& notifier, core::EventLoop& loop,
                             std::function<std::string()> status)
    : notifier_(notifier), status_(std::move(status)), watchdog_(notifier, loop) {
  timer_.bind(loop.timers(), [this] {
    update();
    timer_.arm_after(1000);
  });
  if (notifier_.enabled()) timer_.arm_after(0);
}

}  // namespace corral::app
