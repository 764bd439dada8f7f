// The proxy against an in-process upstream on a Unix socket, on a FAKE clock: the loop never
// sleeps (run_once(0)) and time moves only when the test says, so the response timeout and the
// stall rescue are exact and do not depend on how loaded the machine is. The route's side is a
// Responder of the test's own (no front server): the response is what proxy_to answers.
#include "proxy/proxy.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <variant>

#include "core/event_loop.h"
#include "core/socket.h"

namespace corral::proxy {
namespace {

struct Answer final : http::Responder {
  void respond(http::Response r) override { got = std::move(r); }
  std::optional<http::Response> got;
  std::string body() const { return got ? std::get<std::string>(got->body) : ""; }
};

class ProxyClock : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/corral-proxy-clock-" + std::to_string(getpid()) + ".sock";
    listener_ = core::listen_unix(path_).value();
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  // Starts `method` `target` through proxy_to, as a route would, answering into `a`.
  void start(Answer& a, std::string_view target, ProxyOptions o = {},
             http::Method method = http::Method::kGet) {
    http::Request req;
    req.method = method;
    req.method_name = http::method_name(method);
    req.target = target;
    req.loop = &loop_;
    calls_.push_back(proxy_to(req, path_, std::move(o)));
    std::get<http::DeferredBody>(calls_.back().body).producer->start(a);
  }
  // Runs the loop rounds that are due now (the clock does not move).
  void settle() {
    for (int i = 0; i < 5; ++i) loop_.run_once(0);
  }
  core::UniqueFd accept_upstream() {
    settle();
    return core::UniqueFd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK));
  }
  // What the proxy wrote on `fd` so far.
  static std::string received(const core::UniqueFd& fd) {
    std::string got;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
    return got;
  }
  static void reply(const core::UniqueFd& fd, std::string_view bytes) {
    ASSERT_EQ(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // The upstream's end of a pooled connection, idle after one answered GET (the next request
  // through the pool takes it).
  core::UniqueFd pooled_upstream() {
    Answer first;
    start(first, "/1", {.pool = &pool_});
    auto up = accept_upstream();
    if (!up) return up;
    received(up);
    reply(up, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1");
    settle();
    EXPECT_EQ(first.body(), "1");
    EXPECT_EQ(pool_.idle(), 1u);
    return up;
  }
  static size_t count(std::string_view in, std::string_view what) {
    size_t n = 0;
    for (size_t at = in.find(what); at != std::string_view::npos; at = in.find(what, at + 1)) ++n;
    return n;
  }

  uint64_t now_ms_ = 1'000'000;
  core::EventLoop loop_{[this] { return now_ms_; }};
  UpstreamPool pool_{loop_};
  std::string path_;
  core::UniqueFd listener_;
  std::vector<http::Response> calls_;  // the deferred responses (their producers live here)
};

TEST_F(ProxyClock, OnTimeoutGivesTheResponseInsteadOfTheBare504) {
  Answer a;
  int calls = 0;
  ProxyOptions o;
  o.response_timeout_ms = 200;
  std::string told;
  o.label = "room:7";
  o.on_timeout = [&calls, &told](std::string_view method, std::string_view label) {
    ++calls;
    told = std::string(method) + " " + std::string(label);
    return http::Response::text("the worker did not answer\n", 504);
  };
  start(a, "/hang", std::move(o));
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  now_ms_ += 201;
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 504);
  EXPECT_EQ(a.body(), "the worker did not answer\n");
  EXPECT_FALSE(a.got->find_header("Corral-Proxy-Error"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(told, "GET room:7");  // the request's method and the options' label
}

TEST_F(ProxyClock, NoHeadWithinTheResponseTimeoutIs504) {
  Answer a;
  start(a, "/slow", {.response_timeout_ms = 500});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  EXPECT_EQ(received(up).rfind("GET /slow HTTP/1.1\r\n", 0), 0u);
  now_ms_ += 499;
  settle();
  EXPECT_FALSE(a.got);
  now_ms_ += 2;
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 504);
  EXPECT_EQ(a.got->find_header("Corral-Proxy-Error").value_or(""), "upstream response timeout");
  // The connection is closed: the upstream sees its end.
  settle();
  char c;
  EXPECT_EQ(::recv(up.get(), &c, 1, 0), 0);
}

TEST_F(ProxyClock, AHeadBeforeTheTimeoutStopsIt) {
  Answer a;
  start(a, "/x", {.response_timeout_ms = 500});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  reply(up, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 200);
  EXPECT_EQ(a.body(), "ok");
  now_ms_ += 10'000;
  settle();
  EXPECT_EQ(a.got->status, 200);
}

TEST_F(ProxyClock, APooledConnectionIsReusedAndTheRoundsGetsArePipelined) {
  Answer first;
  start(first, "/1", {.pool = &pool_});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  EXPECT_EQ(count(received(up), "GET /1 "), 1u);
  reply(up, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1");
  settle();
  EXPECT_EQ(first.body(), "1");
  EXPECT_EQ(pool_.idle(), 1u);
  // Two GETs in one round: both on the pooled connection, the second behind the first.
  Answer a, b;
  start(a, "/a", {.pool = &pool_});
  start(b, "/b", {.pool = &pool_});
  settle();
  EXPECT_FALSE(accept_upstream());  // no new connection
  auto sent = received(up);
  EXPECT_EQ(count(sent, "GET /"), 2u) << sent;
  EXPECT_LT(sent.find("GET /a"), sent.find("GET /b"));
  EXPECT_EQ(pool_.stats().pipelined, 1u);
  // Both answers in one write: each gets its own.
  reply(
      up,
      "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb");
  settle();
  EXPECT_EQ(a.body(), "a");
  EXPECT_EQ(b.body(), "b");
  EXPECT_EQ(pool_.idle(), 1u);
  EXPECT_EQ(pool_.stats().rescued, 0u);
}

TEST_F(ProxyClock, RequestsHeldBehindAStalledResponseAreSentAgainElsewhere) {
  Answer slow, behind;
  start(slow, "/slow", {.pool = &pool_});
  start(behind, "/behind", {.pool = &pool_});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  EXPECT_EQ(count(received(up), "GET /"), 2u);
  now_ms_ += UpstreamConnection::kStallMs - 1;
  settle();
  EXPECT_FALSE(accept_upstream());  // not yet
  now_ms_ += 2;
  settle();
  EXPECT_EQ(pool_.stats().rescued, 1u);
  auto again = accept_upstream();  // the one behind, on a connection of its own
  ASSERT_TRUE(again);
  EXPECT_EQ(received(again).rfind("GET /behind HTTP/1.1\r\n", 0), 0u);
  reply(again, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nbehind");
  settle();
  EXPECT_EQ(behind.body(), "behind");
  EXPECT_FALSE(slow.got);
  // The stalled connection answers both; the first is taken, the connection is not reused (the
  // upstream still had the request sent again elsewhere).
  reply(up,
        "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslowHTTP/1.1 200 OK\r\nContent-Length: "
        "1\r\n\r\nx");
  settle();
  EXPECT_EQ(slow.body(), "slow");
  EXPECT_EQ(behind.body(), "behind");
  EXPECT_EQ(pool_.idle(), 0u);
}

TEST_F(ProxyClock, ADeadPooledConnectionIsRetriedOnAFreshOne) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  ::close(sv[1]);  // the upstream closed it; the pool has not seen it yet
  auto dead = UpstreamConnection::adopt(loop_, core::UniqueFd(sv[0]), path_, &pool_);
  ASSERT_TRUE(dead);
  pool_.give(std::move(dead));
  Answer a;
  // A POST too: it never reached anybody, so it is safe to send again.
  start(a, "/post", {.pool = &pool_}, http::Method::kPost);
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  EXPECT_EQ(received(up).rfind("POST /post HTTP/1.1\r\n", 0), 0u);
  reply(up, "HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nmade");
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 201);
  EXPECT_EQ(a.body(), "made");
}

// A pooled connection on which the upstream read a POST and then closed without a byte of an
// answer: it may have acted on it (RFC 9112 §9.3.1), so the client gets 502 and the upstream
// never sees the POST twice. A GET in the same place is sent again.
TEST_F(ProxyClock, APostTheUpstreamReadIsNotSentAgainWhenItClosesWithoutAnswer) {
  auto up = pooled_upstream();
  ASSERT_TRUE(up);
  Answer a;
  start(a, "/post", {.pool = &pool_}, http::Method::kPost);
  settle();
  EXPECT_EQ(received(up).rfind("POST /post HTTP/1.1\r\n", 0), 0u);  // read whole
  up.reset();                                                       // and closed, no answer
  settle();
  EXPECT_FALSE(accept_upstream());  // not sent again
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 502);
}

TEST_F(ProxyClock, AGetTheUpstreamReadIsSentAgainWhenItClosesWithoutAnswer) {
  auto up = pooled_upstream();
  ASSERT_TRUE(up);
  Answer a;
  start(a, "/get", {.pool = &pool_});
  settle();
  EXPECT_EQ(received(up).rfind("GET /get HTTP/1.1\r\n", 0), 0u);
  up.reset();
  auto again = accept_upstream();
  ASSERT_TRUE(again);
  EXPECT_EQ(received(again).rfind("GET /get HTTP/1.1\r\n", 0), 0u);
  reply(again, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  settle();
  EXPECT_EQ(a.body(), "ok");
}

// The upstream closed with the POST still unread in its socket (a Unix socket then gives
// ECONNRESET, not EOF): it never read it, so it is sent again on a fresh connection.
TEST_F(ProxyClock, APostTheUpstreamNeverReadIsSentAgain) {
  auto up = pooled_upstream();
  ASSERT_TRUE(up);
  Answer a;
  start(a, "/post", {.pool = &pool_}, http::Method::kPost);
  settle();
  up.reset();  // closed without reading the POST
  auto again = accept_upstream();
  ASSERT_TRUE(again);
  EXPECT_EQ(received(again).rfind("POST /post HTTP/1.1\r\n", 0), 0u);
  reply(again, "HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nmade");
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 201);
}

TEST_F(ProxyClock, AnUnreachableUpstreamIs502AndAFinderIsAskedAgainOnce) {
  ::unlink(path_.c_str());  // nobody listens
  Answer a;
  start(a, "/x");
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 502);
  // With a finder: asked again once (again = true), then 502.
  http::Request req;
  req.method_name = "GET";
  req.target = "/x";
  req.loop = &loop_;
  std::vector<bool> asked;
  std::vector<std::string> labels;
  ProxyOptions o;
  o.label = "doc:42";
  auto r = proxy_found(
      req,
      [&](const std::string& label, UpstreamAnswer answer, bool again) {
        asked.push_back(again);
        labels.push_back(label);
        answer(path_, std::nullopt);
      },
      std::move(o));
  Answer b;
  std::get<http::DeferredBody>(r.body).producer->start(b);
  settle();
  EXPECT_EQ(asked, (std::vector<bool>{false, true}));
  EXPECT_EQ(labels, (std::vector<std::string>{"doc:42", "doc:42"}));  // the options' label
  ASSERT_TRUE(b.got);
  EXPECT_EQ(b.got->status, 502);
}

}  // namespace
}  // namespace corral::proxy
