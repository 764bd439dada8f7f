// The raw-bytes client of the in-process integration tests: a loopback TCP connection to the
// server under test, and reads that run the server's event loop while they wait (client and
// server share one thread).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <string_view>
#include <thread>

#include "core/event_loop.h"

namespace corral::testing {

// A non-blocking client socket connected to 127.0.0.1:`port` (the kernel completes a loopback
// connect before the server accepts, so this never waits for the loop).
inline int connect_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

// Runs `loop` and reads `fd` until what was read contains `marker`, the peer closes, or 5 s pass.
inline std::string read_until(core::EventLoop& loop, int fd, std::string_view marker) {
  std::string got;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (got.find(marker) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    loop.run_once(5);
    char buf[65536];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
    if (n == 0) break;
  }
  return got;
}

// Waits (at most 2 s) until what was sent on `fd` sits in the peer's receive queue (nothing
// unsent or unacknowledged, SIOCOUTQ 0): the server's next loop round sees it readable. Loopback
// delivery can lag on a busy machine; tests that need requests to arrive in one round wait here.
inline void wait_delivered(int fd) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int queued = 0;
  while (::ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  EXPECT_EQ(queued, 0) << "sent bytes not delivered to the server's socket";
}

}  // namespace corral::testing
