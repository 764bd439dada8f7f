#include "fanout/listen_claim.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace corral::fanout {

namespace {

socklen_t abstract_address(const std::string& name, sockaddr_un& sun) {
  sun = {};
  sun.sun_family = AF_UNIX;
  std::string full = "corral-listen-" + name;
  size_t n = std::min(full.size(), sizeof sun.sun_path - 1);
  std::memcpy(sun.sun_path + 1, full.data(), n);  // sun_path[0] = 0: the abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// The pid that listens on the claim `name`: 0 if nobody does (any more), -1 if someone does but
// its pid could not be read (its backlog is full, or SO_PEERCRED failed).
pid_t claim_owner(const std::string& name) {
  sockaddr_un sun;
  socklen_t len = abstract_address(name, sun);
  core::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return -1;
  // Non-blocking: a Unix stream connect completes at once, or fails with EAGAIN when the
  // owner's backlog is full, and never waits for the owner.
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sun), len) < 0)
    return errno == ECONNREFUSED ? 0 : -1;
  ucred cred{};
  socklen_t cred_len = sizeof cred;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) < 0 || cred.pid <= 0)
    return -1;
  return cred.pid;
}

}  // namespace

std::string claim_name(std::string_view proto, const core::SocketAddress& address) {
  return std::string(proto) + "-" + address.to_string();
}

core::Result<std::shared_ptr<ListenClaim>> claim_listen(std::string_view proto,
                                                        const core::SocketAddress& address) {
  std::string name = claim_name(proto, address);
  sockaddr_un sun;
  socklen_t len = abstract_address(name, sun);
  // Twice at most: an owner that was exiting when our bind failed may be gone by the probe.
  for (int attempt = 0; attempt < 2; ++attempt) {
    core::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) return core::errno_error("socket(AF_UNIX)");
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sun), len) == 0) {
      if (::listen(fd.get(), 64) < 0) return core::errno_error("listen (claim)");
      return std::make_shared<ListenClaim>(std::move(name), std::move(fd));
    }
    if (errno != EADDRINUSE) return core::errno_error(("claim " + name).c_str());
    pid_t owner = claim_owner(name);
    if (owner == 0) continue;
    std::string who =
        owner > 0 ? "another corral (pid " + std::to_string(owner) + ")" : "another corral";
    return core::Error{kErrorClaimed, "listen " + address.to_string() + " (" + std::string(proto) +
                                          ") is held by " + who};
  }
  return core::Error{kErrorClaimed, "listen " + address.to_string() + " (" + std::string(proto) +
                                        "): its claim changed hands while it was taken"};
}

void ListenClaim::watch(core::EventLoop& loop) {
  if (loop_ || !fd_) return;
  if (loop.add(fd_.get(), EPOLLIN, this)) loop_ = &loop;
}

void ListenClaim::unwatch() {
  if (!loop_) return;
  loop_->remove(fd_.get());
  loop_ = nullptr;
}

void ListenClaim::on_io(uint32_t) {
  // Another instance's probe: it has read our pid already (SO_PEERCRED needs no data).
  for (int i = 0; i < 64; ++i) {
    int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    ::close(c);
  }
}

}  // namespace corral::fanout
