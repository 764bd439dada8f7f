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
#include "loopback.h"

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
  int connect_client() { return testing::connect_loopback(port_); }
  std::string read_for(int fd, std::string_view until) {
    return testing::read_until(loop_, fd, until);
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
