// Integration: deferred responses (the head comes later, as a proxy's does), in-process.
#include <fcntl.h>
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

namespace corral::http {
namespace {

// Responds `body` after `ms`, or counts an abort.
class Later final : public DeferredProducer {
 public:
  Later(core::EventLoop& loop, std::string body, uint32_t ms, int& aborts)
      : timer_(loop.timers(), [this] { responder_->respond(Response::text(body_)); }),
        body_(std::move(body)),
        ms_(ms),
        aborts_(aborts) {}
  void start(Responder& r) override {
    responder_ = &r;
    timer_.arm_after(ms_);
  }
  void on_abort() override {
    ++aborts_;
    timer_.cancel();
  }

 private:
  core::Timer timer_;
  Responder* responder_ = nullptr;
  std::string body_;
  uint32_t ms_;
  int& aborts_;
};

class Deferred : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions opts;
    opts.access_log = false;
    server_ = std::make_unique<Server>(loop_, log_, opts);
    port_ = server_->listen(core::parse_address("127.0.0.1:0").value())->port();
    SiteBuilder b;
    b.route("GET /later/{ms}", [this](Request& req) {
      return Response::deferred(
          std::make_unique<Later>(loop_, "later " + std::string(req.param("ms")),
                                  std::stoi(std::string(req.param("ms"))), aborts_));
    });
    b.route("GET /now", [](Request&) { return Response::text("now"); });
    server_->publish(b.build().value());
  }
  int connect_client() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
  }
  std::string read_for(int fd, std::string_view until) {
    std::string got;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (got.find(until) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      loop_.run_once(5);
      char buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) got.append(buf, static_cast<size_t>(n));
      if (n == 0) break;
    }
    return got;
  }

  core::EventLoop loop_;
  core::Logger log_{2, core::LogLevel::kError};
  std::unique_ptr<Server> server_;
  int port_ = 0;
  int aborts_ = 0;
};

TEST_F(Deferred, PipelinedResponsesStayInOrderBehindADeferredOne) {
  int fd = connect_client();
  std::string reqs =
      "GET /later/50 HTTP/1.1\r\nHost: localhost\r\n\r\nGET /now HTTP/1.1\r\nHost: "
      "localhost\r\n\r\n";
  ASSERT_EQ(::send(fd, reqs.data(), reqs.size(), 0), static_cast<ssize_t>(reqs.size()));
  std::string got = read_for(fd, "\r\n\r\nnow");
  size_t later = got.find("later 50"), now = got.find("\r\n\r\nnow");
  ASSERT_NE(later, std::string::npos) << got;
  ASSERT_NE(now, std::string::npos) << got;
  EXPECT_LT(later, now);
  EXPECT_EQ(aborts_, 0);
  ::close(fd);
}

TEST_F(Deferred, AClientThatLeavesAbortsTheProducer) {
  int fd = connect_client();
  std::string req = "GET /later/5000 HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  for (int i = 0; i < 5; ++i) loop_.run_once(5);
  ::close(fd);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (aborts_ == 0 && std::chrono::steady_clock::now() < deadline) loop_.run_once(10);
  EXPECT_EQ(aborts_, 1);
}

}  // namespace
}  // namespace corral::http
