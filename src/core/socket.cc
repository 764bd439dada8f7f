#include "core/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>

#include <charconv>
#include <cstring>

namespace corral::core {

int SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::string SocketAddress::ip() const {
  char buf[INET6_ADDRSTRLEN] = "";
  if (family() == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof buf);
  else if (family() == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf,
              sizeof buf);
  return buf;
}

std::string SocketAddress::to_string() const {
  // fmt rather than operator+ chains: GCC 12 warns falsely (-Wrestrict) on those at -O3.
  if (family() == AF_INET6) return fmt::format("[{}]:{}", ip(), port());
  return fmt::format("{}:{}", ip(), port());
}

bool SocketAddress::is_loopback() const {
  if (family() == AF_INET) {
    auto a = ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (family() == AF_INET6) {
    auto& a = reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a);
  }
  return false;
}

Result<SocketAddress> parse_address(std::string_view text) {
  std::string_view host = "127.0.0.1";
  std::string_view port_s = text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return Error{EINVAL, "expected [ipv6]:port"};
    host = text.substr(1, close - 1);
    port_s = text.substr(close + 2);
  } else if (auto colon = text.rfind(':'); colon != std::string_view::npos) {
    if (colon > 0) host = text.substr(0, colon);
    port_s = text.substr(colon + 1);
  }
  if (host == "localhost") host = "127.0.0.1";
  unsigned port = 0;
  auto [p, ec] = std::from_chars(port_s.data(), port_s.data() + port_s.size(), port);
  if (ec != std::errc() || p != port_s.data() + port_s.size() || port > 65535 || port_s.empty())
    return Error{EINVAL, "invalid port '" + std::string(port_s) + "'"};
  SocketAddress out;
  std::string h(host);
  auto* in4 = reinterpret_cast<sockaddr_in*>(&out.storage);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
  if (inet_pton(AF_INET, h.c_str(), &in4->sin_addr) == 1) {
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<uint16_t>(port));
    out.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, h.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    out.len = sizeof(sockaddr_in6);
  } else {
    return Error{EINVAL, "invalid address '" + h + "' (expected an IP address or localhost)"};
  }
  return out;
}

Result<UniqueFd> listen_tcp(const SocketAddress& addr, const ListenOptions& opts) {
  UniqueFd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errno_error("socket");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (opts.reuse_port && setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0)
    return errno_error("setsockopt(SO_REUSEPORT)");
  if (addr.family() == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) < 0)
    return errno_error(("bind " + addr.to_string()).c_str());
  if (::listen(fd.get(), opts.backlog) < 0) return errno_error("listen");
  return fd;
}

Result<UniqueFd> listen_unix(const std::string& path, int backlog) {
  sockaddr_un sun{};
  if (path.size() >= sizeof sun.sun_path)
    return Error{ENAMETOOLONG, "socket path too long: " + path};
  // Bound under a temporary name and renamed into place once it listens: whoever sees the path
  // can connect (between bind and listen a connect is refused). Without room for the suffix, in
  // place.
  std::string bound = path.size() + 4 < sizeof sun.sun_path ? path + ".new" : path;
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path, bound.c_str(), bound.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errno_error("socket(AF_UNIX)");
  ::unlink(bound.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sun), sizeof sun) < 0)
    return errno_error(("bind " + bound).c_str());
  ::chmod(bound.c_str(), 0600);
  if (::listen(fd.get(), backlog) < 0) return errno_error("listen");
  if (bound != path && ::rename(bound.c_str(), path.c_str()) < 0) {
    auto e = errno_error(("rename " + bound).c_str());
    ::unlink(bound.c_str());
    return e;
  }
  return fd;
}

Result<UniqueFd> connect_unix(const std::string& path) {
  sockaddr_un sun{};
  if (path.size() >= sizeof sun.sun_path)
    return Error{ENAMETOOLONG, "socket path too long: " + path};
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return errno_error("socket(AF_UNIX)");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sun), sizeof sun) < 0)
    return errno_error(("connect " + path).c_str());
  return fd;
}

Result<SocketAddress> local_address(int fd) {
  SocketAddress a;
  a.len = sizeof a.storage;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len) < 0)
    return errno_error("getsockname");
  return a;
}

}  // namespace corral::core
