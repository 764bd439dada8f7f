// Integration: WebSocket sockets and the Server's lifecycle, in-process (EventLoop + Server on
// 127.0.0.1:0, a raw client socket). A socket whose route disappears when a new site is published
// is closed with 1012; a graceful server close sends 1001 and waits for the closing handshake.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/socket.h"
#include "http/server.h"
#include "http/site.h"
#include "ws/socket.h"

#include "loopback.h"

namespace corral {
namespace {

class WsLifecycle : public ::testing::Test {
 protected:
  void SetUp() override {
    http::ServerOptions opts;
    opts.access_log = false;
    server_ = std::make_unique<http::Server>(loop_, log_, opts);
    auto addr = server_->listen(core::parse_address("127.0.0.1:0").value());
    ASSERT_TRUE(addr.ok());
    port_ = addr->port();
    server_->publish(site_with_socket(true));
  }

  std::shared_ptr<const http::Site> site_with_socket(bool with) {
    http::SiteBuilder b;
    b.route("GET /hello", [](http::Request&) { return http::Response::text("hello"); });
    if (with) {
      ws::SocketRoute r;
      r.on_open = [this](ws::Socket& s) {
        s.on_close = [this](ws::Socket&, uint16_t code, std::string_view) { closed_code_ = code; };
      };
      ws::add_socket_route(b, "/sock", r);
    }
    return b.build().value();
  }

  // Connects, upgrades, and returns the client fd (non-blocking) after the 101.
  int open_socket() {
    int fd = testing::connect_loopback(port_);
    std::string req =
        "GET /sock HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    EXPECT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    std::string got = read_until(fd, "\r\n\r\n");
    EXPECT_NE(got.find("101 Switching Protocols"), std::string::npos) << got;
    EXPECT_NE(got.find("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), std::string::npos) << got;
    return fd;
  }

  std::string read_until(int fd, std::string_view marker) {
    return testing::read_until(loop_, fd, marker);
  }

  core::EventLoop loop_;
  core::Logger log_{2, core::LogLevel::kError};
  std::unique_ptr<http::Server> server_;
  int port_ = 0;
  int closed_code_ = 0;
};

// The start of a close frame from the server: 0x88, a length, then the code (big-endian).
std::string close_frame_start(uint16_t code, std::string_view reason) {
  return std::string(1, '\x88') + static_cast<char>(2 + reason.size()) +
         static_cast<char>(code >> 8) + static_cast<char>(code & 0xff) + std::string(reason);
}

TEST_F(WsLifecycle, ANewSiteWithoutTheRouteClosesTheSocketWith1012) {
  int fd = open_socket();
  server_->publish(site_with_socket(true));  // the route is still there: nothing happens
  loop_.run_once(10);
  char b;
  EXPECT_LT(::recv(fd, &b, 1, MSG_PEEK), 0);  // no frame
  server_->publish(site_with_socket(false));
  std::string got = read_until(fd, close_frame_start(1012, "service restart"));
  EXPECT_NE(got.find(close_frame_start(1012, "service restart")), std::string::npos);
  EXPECT_EQ(closed_code_, 0);  // not closed until the handshake completes (or times out)
  // Answer the close (masked, code 1012): the server finishes and reports 1012.
  std::string answer("\x88\x82\x01\x02\x03\x04", 6);
  answer += static_cast<char>((1012 >> 8) ^ 0x01);
  answer += static_cast<char>((1012 & 0xff) ^ 0x02);
  ::send(fd, answer.data(), answer.size(), 0);
  read_until(fd, "\xff never");  // until the server closes TCP
  EXPECT_EQ(closed_code_, 1012);
  ::close(fd);
}

TEST_F(WsLifecycle, GracefulCloseSends1001AndWaitsForTheSocket) {
  int fd = open_socket();
  bool done = false;
  server_->close([&] { done = true; });
  std::string got = read_until(fd, close_frame_start(1001, "server closing"));
  EXPECT_NE(got.find(close_frame_start(1001, "server closing")), std::string::npos);
  EXPECT_FALSE(done);  // the socket is still open: close() waits for it
  std::string answer("\x88\x82\x00\x00\x00\x00\x03\xe9", 8);  // 1001, mask of zeros
  ::send(fd, answer.data(), answer.size(), 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done && std::chrono::steady_clock::now() < deadline) loop_.run_once(10);
  EXPECT_TRUE(done);
  EXPECT_EQ(closed_code_, 1001);
  ::close(fd);
}

}  // namespace
}  // namespace corral
