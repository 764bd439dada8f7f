// The client's connection handling against a fake gateway on loopback, in-process on the same
// loop: keep-alive reuse, a connection the server closed while idle (the call is sent again),
// failover past an endpoint that refuses, a deadline when nobody answers. The real gateway is in
// node_etcd_test.cc.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cluster/etcd_client.h"
#include "core/event_loop.h"
#include "core/socket.h"

namespace corral::cluster {
namespace {

constexpr const char* kRangeBody =
    R"({"header":{"revision":"7"},"kvs":[{"key":"aw==","value":"dg=="}]})";

// Answers every request with kRangeBody; closes each connection after `answers_per_connection`.
class FakeGateway final : public core::IoHandler {
 public:
  explicit FakeGateway(core::EventLoop& loop) : loop_(loop) {
    auto addr = core::parse_address("127.0.0.1:0");
    listener_ = std::move(*core::listen_tcp(*addr));
    port_ = core::local_address(listener_.get())->port();
    (void)loop_.add(listener_.get(), EPOLLIN, this);
  }
  ~FakeGateway() {
    for (auto& c : conns_) loop_.remove(c->fd.get());
    loop_.remove(listener_.get());
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void on_io(uint32_t) override {
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    ++accepted;
    conns_.push_back(std::make_unique<Conn>(*this, core::UniqueFd(fd)));
    (void)loop_.add(fd, EPOLLIN, conns_.back().get());
  }

  int accepted = 0;
  int requests = 0;
  int answers_per_connection = 1000;

 private:
  struct Conn final : core::IoHandler {
    Conn(FakeGateway& g, core::UniqueFd f) : gw(g), fd(std::move(f)) {}
    void on_io(uint32_t) override {
      if (!fd) return;
      char buf[4096];
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n <= 0) return close();
      in.append(buf, static_cast<size_t>(n));
      for (;;) {
        size_t end = in.find("\r\n\r\n");
        if (end == std::string::npos) return;
        size_t cl = in.find("Content-Length: ");
        size_t len = cl < end ? std::stoul(in.substr(cl + 16)) : 0;
        if (in.size() < end + 4 + len) return;
        in.erase(0, end + 4 + len);
        ++gw.requests;
        std::string body = kRangeBody;
        std::string resp = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body;
        (void)::write(fd.get(), resp.data(), resp.size());
        if (++answered >= gw.answers_per_connection) return close();
      }
    }
    void close() {
      if (!fd) return;
      gw.loop_.remove(fd.get());
      fd.reset();
    }
    FakeGateway& gw;
    core::UniqueFd fd;
    std::string in;
    int answered = 0;
  };

  core::EventLoop& loop_;
  core::UniqueFd listener_;
  int port_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;
};

bool run_until(core::EventLoop& loop, const std::function<bool()>& done) {
  uint64_t end = core::monotonic_ms() + 10000;
  while (!done()) {
    if (core::monotonic_ms() >= end) return false;
    loop.run_once(50);
  }
  return true;
}

std::unique_ptr<Client> client_for(core::EventLoop& loop, std::vector<std::string> endpoints,
                                   uint64_t timeout_ms = 5000) {
  ClientOptions o;
  o.endpoints = std::move(endpoints);
  o.request_timeout_ms = timeout_ms;
  auto c = Client::create(loop, o);
  EXPECT_TRUE(c) << c.error().reason;
  return std::move(*c);
}

core::Result<RangeResponse> range(core::EventLoop& loop, Client& client) {
  std::optional<core::Result<RangeResponse>> out;
  client.range({.key = "k"}, [&](core::Result<RangeResponse> r) { out.emplace(std::move(r)); });
  if (!run_until(loop, [&] { return out.has_value(); })) return core::Error{-1, "no answer"};
  return std::move(*out);
}

// A port nothing listens on (bound, then closed).
std::string refusing_endpoint() {
  auto addr = core::parse_address("127.0.0.1:0");
  auto fd = core::listen_tcp(*addr);
  int port = core::local_address(fd->get())->port();
  return "http://127.0.0.1:" + std::to_string(port);
}

TEST(Client, RejectsEndpointsItCannotUse) {
  core::EventLoop loop;
  EXPECT_FALSE(Client::create(loop, ClientOptions{.endpoints = {}}));
  EXPECT_FALSE(Client::create(loop, ClientOptions{.endpoints = {"https://127.0.0.1:2379"}}));
  EXPECT_FALSE(Client::create(loop, ClientOptions{.endpoints = {"http://etcd.example:2379"}}));
  EXPECT_FALSE(Client::create(loop, ClientOptions{.endpoints = {"http://127.0.0.1:2379/v3"}}));
  EXPECT_TRUE(Client::create(loop, ClientOptions{.endpoints = {"127.0.0.1:2379", "localhost:1"}}));
}

TEST(Client, ReusesOneKeepAliveConnection) {
  core::EventLoop loop;
  FakeGateway gw(loop);
  auto client = client_for(loop, {gw.endpoint()});
  for (int i = 0; i < 5; ++i) {
    auto r = range(loop, *client);
    ASSERT_TRUE(r) << r.error().reason;
    EXPECT_EQ(r->header.revision, 7);
    EXPECT_EQ(r->kvs.at(0).value, "v");
  }
  EXPECT_EQ(gw.requests, 5);
  EXPECT_EQ(gw.accepted, 1);
}

TEST(Client, SendsAgainWhenTheServerClosedAnIdleConnection) {
  core::EventLoop loop;
  FakeGateway gw(loop);
  gw.answers_per_connection = 1;  // then it closes: the client may not have seen the FIN yet
  auto client = client_for(loop, {gw.endpoint()});
  for (int i = 0; i < 3; ++i) {
    auto r = range(loop, *client);
    ASSERT_TRUE(r) << r.error().reason;
  }
  EXPECT_EQ(gw.requests, 3);
  EXPECT_EQ(gw.accepted, 3);
}

TEST(Client, FailsOverPastAnEndpointThatRefuses) {
  core::EventLoop loop;
  FakeGateway gw(loop);
  auto client = client_for(loop, {refusing_endpoint(), gw.endpoint()});
  auto r = range(loop, *client);
  ASSERT_TRUE(r) << r.error().reason;
  EXPECT_EQ(client->current_endpoint(), 1u);
  EXPECT_EQ(gw.requests, 1);
}

TEST(Client, EveryEndpointRefusingFailsTheCall) {
  core::EventLoop loop;
  auto client = client_for(loop, {refusing_endpoint(), refusing_endpoint()});
  auto r = range(loop, *client);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ECONNREFUSED);
}

TEST(Client, ACallNobodyAnswersEndsAtItsDeadline) {
  core::EventLoop loop;
  // Listening, never accepting: the connect succeeds (the backlog), no answer ever comes.
  auto addr = core::parse_address("127.0.0.1:0");
  auto silent = core::listen_tcp(*addr);
  int port = core::local_address(silent->get())->port();
  auto client = client_for(loop, {"http://127.0.0.1:" + std::to_string(port)}, 200);
  auto r = range(loop, *client);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ETIMEDOUT);
}

TEST(Client, CancelledCallsAreNeverCalledBack) {
  core::EventLoop loop;
  FakeGateway gw(loop);
  auto client = client_for(loop, {gw.endpoint()});
  int owner = 0;
  bool called = false;
  client->range(
      {.key = "k"}, [&](core::Result<RangeResponse>) { called = true; }, &owner);
  client->cancel(&owner);
  auto r = range(loop, *client);  // a later call still works, and the loop ran past the first
  ASSERT_TRUE(r);
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace corral::cluster
