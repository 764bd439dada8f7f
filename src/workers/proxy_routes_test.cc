// The proxy routes in-process: a real front Server with a kind's routes, its LinkResolver over a
// socketpair whose other end the test reads as the supervisor would. The authorize hook decides
// before anything is sent on the link: a refused or throwing hook is a 403 and no resolve.
#include "workers/proxy_routes.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/socket.h"
#include "http/server.h"
#include "loopback.h"
#include "workers/process_services.h"

namespace corral::workers {
namespace {

class ProxyRoutes : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    supervisor_.reset(sv[1]);
    services_ = std::make_unique<ProcessServices>(loop_, core::UniqueFd(sv[0]), slot_, false);
  }

  // Serves one kind "doc" on /doc/{id}/* and /pair/{a}/{b}/* with `hook`; X-User names the
  // principal.
  void serve(KindConfig::Authorize hook) {
    KindConfig kind;
    kind.name = "doc";
    kind.command = {"/bin/true"};
    kind.routes = {"/doc/{id}/*", "/pair/{a}/{b}/*"};
    kind.authorize = std::move(hook);
    http::SiteBuilder site;
    site.authenticate([](const http::Request& req) -> std::optional<http::Principal> {
      auto user = req.header("x-user");
      if (!user) return std::nullopt;
      return http::Principal{std::string(*user), {}};
    });
    add_proxy_routes(site, {kind}, slot_, log_);
    http::ServerOptions opts;
    opts.access_log = false;
    server_ = std::make_unique<http::Server>(loop_, log_, opts);
    port_ = server_->listen(core::parse_address("127.0.0.1:0").value())->port();
    server_->publish(site.build().value());
  }

  int send_request(std::string_view headers, std::string_view path = "/doc/42/edit") {
    std::string request = "GET " + std::string(path) + " HTTP/1.1\r\nHost: localhost\r\n";
    request.append(headers).append("\r\n");
    int fd = testing::connect_loopback(port_);
    EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
    return fd;
  }

  // What the supervisor's end got (running the loop until a message, at most `wait_ms`).
  std::string supervisor_reads(int wait_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    char buf[65536];
    do {
      loop_.run_once(5);
      ssize_t n = ::recv(supervisor_.get(), buf, sizeof buf, 0);
      if (n > 0) return std::string(buf, static_cast<size_t>(n));
    } while (std::chrono::steady_clock::now() < deadline);
    return {};
  }

  std::string logged() {
    log_.flush();
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(log_pipe_.read.get(), buf, sizeof buf)) > 0)
      out.append(buf, static_cast<size_t>(n));
    return out;
  }

  // The log goes to a pipe the test reads (authorize_failed lines).
  struct LogPipe {
    core::UniqueFd read, write;
    LogPipe() {
      int p[2];
      EXPECT_EQ(::pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
      read.reset(p[0]);
      write.reset(p[1]);
    }
  };
  core::EventLoop loop_;
  LogPipe log_pipe_;
  core::Logger log_{log_pipe_.write.get(), core::LogLevel::kError};
  std::shared_ptr<ResolverSlot> slot_ = std::make_shared<ResolverSlot>();
  core::UniqueFd supervisor_;
  std::unique_ptr<ProcessServices> services_;
  std::unique_ptr<http::Server> server_;
  int port_ = 0;
};

TEST_F(ProxyRoutes, AnAllowedRequestIsResolvedOverTheLinkWithItsPrincipal) {
  std::optional<std::string> seen;
  std::string seen_address;
  serve([&](const std::optional<std::string>& principal, std::string_view address) {
    seen = principal;
    seen_address = address;
    return principal == "alice";
  });
  int fd = send_request("X-User: alice\r\n");
  std::string message = supervisor_reads(5000);
  EXPECT_NE(message.find("\"type\":\"resolve\""), std::string::npos) << message;
  EXPECT_NE(message.find("\"address\":\"doc:42\""), std::string::npos) << message;
  EXPECT_EQ(seen, "alice");
  EXPECT_EQ(seen_address, "doc:42");
  std::string refused =
      R"({"type":"refused","id":1,"status":503,"error":{"message":"down","code":"test"}})";
  ASSERT_EQ(::send(supervisor_.get(), refused.data(), refused.size(), 0),
            static_cast<ssize_t>(refused.size()));
  std::string got = testing::read_until(loop_, fd, "\"test\"");
  ::close(fd);
  EXPECT_NE(got.find("HTTP/1.1 503"), std::string::npos) << got;
  EXPECT_EQ(services_->resolver().sent(), 1u);
}

TEST_F(ProxyRoutes, ARefusalIs403AndNothingIsResolved) {
  std::vector<std::optional<std::string>> seen;
  serve([&](const std::optional<std::string>& principal, std::string_view) {
    seen.push_back(principal);
    return principal == "alice";
  });
  for (const char* headers : {"X-User: bob\r\n", ""}) {  // a principal, then anonymous
    int fd = send_request(headers);
    std::string got = testing::read_until(loop_, fd, "\"forbidden\"");
    ::close(fd);
    EXPECT_NE(got.find("HTTP/1.1 403"), std::string::npos) << got;
    EXPECT_NE(got.find(R"({"error":{"code":"forbidden","message":"Not allowed."}})"),
              std::string::npos)
        << got;
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], "bob");
  EXPECT_EQ(seen[1], std::nullopt);
  EXPECT_EQ(supervisor_reads(0), "");  // the 403 is read: a resolve would be queued by now
  EXPECT_EQ(services_->resolver().sent(), 0u);
}

TEST_F(ProxyRoutes, AThrowingHookIs403AndALoggedFailureWithoutItsText) {
  serve([](const std::optional<std::string>&, std::string_view) -> bool {
    throw std::invalid_argument("the secret the hook saw");
  });
  int fd = send_request("X-User: alice\r\n");
  std::string got = testing::read_until(loop_, fd, "\"forbidden\"");
  ::close(fd);
  EXPECT_NE(got.find("HTTP/1.1 403"), std::string::npos) << got;
  EXPECT_EQ(got.find("secret"), std::string::npos) << got;
  std::string log = logged();
  EXPECT_NE(log.find("authorize_failed"), std::string::npos) << log;
  EXPECT_NE(log.find("kind=doc"), std::string::npos) << log;
  EXPECT_NE(log.find("address=\"doc:42\""), std::string::npos) << log;
  EXPECT_NE(log.find("std::invalid_argument"), std::string::npos) << log;
  EXPECT_EQ(log.find("secret"), std::string::npos) << log;
  EXPECT_EQ(supervisor_reads(0), "");  // the 403 is read: a resolve would be queued by now
  EXPECT_EQ(services_->resolver().sent(), 0u);
}

// With two {param}s a ':' in one would make two paths one address ("pair:x:y:z" for x:y + z and
// x + y:z): 400 before the hook or the supervisor hears of it. With one it is part of the key.
TEST_F(ProxyRoutes, AColonInOneOfSeveralParamsIs400AndNothingIsResolved) {
  int hooked = 0;
  serve([&](const std::optional<std::string>&, std::string_view) {
    ++hooked;
    return true;
  });
  for (const char* path : {"/pair/x:y/z/", "/pair/x/y%3Az/"}) {
    int fd = send_request("", path);
    std::string got = testing::read_until(loop_, fd, "\"bad_address\"");
    ::close(fd);
    EXPECT_NE(got.find("HTTP/1.1 400"), std::string::npos) << path << got;
  }
  EXPECT_EQ(hooked, 0);
  EXPECT_EQ(supervisor_reads(0), "");
  EXPECT_EQ(services_->resolver().sent(), 0u);
  int fd = send_request("", "/doc/x:y/edit");
  std::string message = supervisor_reads(5000);
  EXPECT_NE(message.find("\"address\":\"doc:x:y\""), std::string::npos) << message;
  ::close(fd);
}

TEST_F(ProxyRoutes, WithoutAHookEveryoneIsResolved) {
  serve(nullptr);
  int fd = send_request("");
  EXPECT_NE(supervisor_reads(5000).find("\"type\":\"resolve\""), std::string::npos);
  ::close(fd);
}

}  // namespace
}  // namespace corral::workers
