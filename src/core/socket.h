// Socket addresses and listening sockets: parsing "host:port" forms, creating non-blocking
// listeners (SO_REUSEADDR, optionally SO_REUSEPORT for the fan-out), and formatting peers.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <string_view>

#include "core/result.h"
#include "core/unique_fd.h"

namespace corral::core {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  int port() const;
  std::string ip() const;         // "127.0.0.1", "::1"
  std::string to_string() const;  // "127.0.0.1:8080", "[::1]:8080"
  bool is_loopback() const;
};

// "127.0.0.1:8080", "[::1]:8080", "localhost:8080", ":8080" (= 127.0.0.1), "8080".
Result<SocketAddress> parse_address(std::string_view text);

struct ListenOptions {
  int backlog = 4096;
  bool reuse_port = false;
};
Result<UniqueFd> listen_tcp(const SocketAddress& addr, const ListenOptions& opts = {});
// A listening Unix stream socket at `path` (an old socket file there is replaced), mode 0600.
Result<UniqueFd> listen_unix(const std::string& path, int backlog = 128);
// A blocking connection to a Unix stream socket.
Result<UniqueFd> connect_unix(const std::string& path);
// The address a socket is bound to (to learn the port after binding port 0).
Result<SocketAddress> local_address(int fd);

}  // namespace corral::core
