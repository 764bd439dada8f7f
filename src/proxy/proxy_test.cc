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
  // through the pool takes it). `echo`: the upstream echoed that request's Corral-Seq, as the
  // worker libraries do, so GETs may be pipelined on it.
  core::UniqueFd pooled_upstream(bool echo = false) {
    Answer first;
    start(first, "/1", {.pool = &pool_});
    auto up = accept_upstream();
    if (!up) return up;
    auto seq = seq_of(received(up), "GET /1 ");
    EXPECT_FALSE(seq.empty());  // the first GET of a connection asks
    reply(up, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n" +
                  (echo ? "Corral-Seq: " + seq + "\r\n" : std::string()) + "\r\n1");
    settle();
    EXPECT_EQ(first.body(), "1");
    EXPECT_EQ(pool_.idle(), 1u);
    return up;
  }
  // The Corral-Seq value of the request that starts with `line` in `sent` ("" if none).
  static std::string seq_of(std::string_view sent, std::string_view line) {
    size_t at = sent.find(line);
    if (at == std::string_view::npos) return "";
    size_t end = sent.find("\r\n\r\n", at);
    size_t field = sent.find("Corral-Seq: ", at);
    if (field == std::string_view::npos || field > end) return "";
    field += 12;
    return std::string(sent.substr(field, sent.find("\r\n", field) - field));
  }
  static std::string ok(std::string_view body, std::string_view seq = {}) {
    std::string r = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    if (!seq.empty()) r.append("Corral-Seq: ").append(seq).append("\r\n");
    return r.append("\r\n").append(body);
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

TEST_F(ProxyClock, APooledConnectionIsReusedAndTheRoundsGetsArePipelinedWhenItEchoes) {
  auto up = pooled_upstream(/*echo=*/true);
  ASSERT_TRUE(up);
  // Two GETs in one round: both on the pooled connection, the second behind the first, with a
  // Corral-Seq its answer must echo (the first needs none: nothing is ahead of it).
  Answer a, b;
  start(a, "/a", {.pool = &pool_});
  start(b, "/b", {.pool = &pool_});
  settle();
  EXPECT_FALSE(accept_upstream());  // no new connection
  auto sent = received(up);
  EXPECT_EQ(count(sent, "GET /"), 2u) << sent;
  EXPECT_LT(sent.find("GET /a"), sent.find("GET /b"));
  EXPECT_EQ(seq_of(sent, "GET /a "), "");
  auto seq = seq_of(sent, "GET /b ");
  EXPECT_FALSE(seq.empty()) << sent;
  EXPECT_EQ(pool_.stats().pipelined, 1u);
  // Both answers in one write: each gets its own.
  reply(up, ok("a") + ok("b", seq));
  settle();
  EXPECT_EQ(a.body(), "a");
  EXPECT_EQ(b.body(), "b");
  ASSERT_TRUE(b.got);
  EXPECT_FALSE(b.got->find_header("Corral-Seq"));  // the proxy's business, not the client's
  EXPECT_EQ(pool_.idle(), 1u);
  EXPECT_EQ(pool_.stats().rescued, 0u);
}

TEST_F(ProxyClock, AnUpstreamThatDoesNotEchoIsNeverPipelined) {
  auto up = pooled_upstream(/*echo=*/false);
  ASSERT_TRUE(up);
  Answer a, b;
  start(a, "/a", {.pool = &pool_});
  start(b, "/b", {.pool = &pool_});
  auto other = accept_upstream();  // the second GET gets a connection of its own
  ASSERT_TRUE(other);
  auto sent = received(up);
  EXPECT_EQ(count(sent, "GET /"), 1u) << sent;
  EXPECT_EQ(sent.find("Corral-Seq"), std::string::npos) << sent;  // it is known not to echo
  EXPECT_EQ(count(received(other), "GET /b "), 1u);
  EXPECT_EQ(pool_.stats().pipelined, 0u);
  reply(up, ok("a"));
  reply(other, ok("b"));
  settle();
  EXPECT_EQ(a.body(), "a");
  EXPECT_EQ(b.body(), "b");
}

// A worker that answers one request twice (in one write) while another was pipelined behind it:
// the second answer does not echo that request's Corral-Seq, so it is nobody's; the connection
// closes and the request behind is sent again on a fresh one, where it gets its own answer.
TEST_F(ProxyClock, OneResponseTooManyNeverAnswersTheRequestBehind) {
  auto up = pooled_upstream(/*echo=*/true);
  ASSERT_TRUE(up);
  Answer a, b;
  start(a, "/a", {.pool = &pool_});
  start(b, "/b", {.pool = &pool_});
  settle();
  auto sent = received(up);
  ASSERT_EQ(count(sent, "GET /"), 2u) << sent;
  reply(up, ok("a") + ok("a again") + ok("b", seq_of(sent, "GET /b ")));
  settle();
  EXPECT_EQ(a.body(), "a");
  EXPECT_FALSE(b.got);
  auto again = accept_upstream();
  ASSERT_TRUE(again);
  EXPECT_EQ(count(received(again), "GET /b "), 1u);
  reply(again, ok("b"));
  settle();
  EXPECT_EQ(b.body(), "b");
  EXPECT_EQ(pool_.idle(), 0u);  // the one that answered twice is closed (the fresh one too)
}

// A 204 has no body whatever follows it: bytes after its head, before the answer to the
// request pipelined behind, are not that answer (they do not echo its Corral-Seq).
TEST_F(ProxyClock, BytesAfterA204AreNobodysAnswer) {
  auto up = pooled_upstream(/*echo=*/true);
  ASSERT_TRUE(up);
  Answer a, b;
  start(a, "/a", {.pool = &pool_});
  start(b, "/b", {.pool = &pool_});
  settle();
  auto sent = received(up);
  ASSERT_EQ(count(sent, "GET /"), 2u) << sent;
  reply(up, "HTTP/1.1 204 No Content\r\n\r\n" + ok("not b's") + ok("b", seq_of(sent, "GET /b ")));
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 204);
  EXPECT_FALSE(b.got);
  auto again = accept_upstream();
  ASSERT_TRUE(again);
  reply(again, ok("b"));
  settle();
  EXPECT_EQ(b.body(), "b");
}

// Bytes that were on a pooled connection before the request taken to it left (the previous
// answer's excess, arriving late) are read before it is sent: nobody's answer. The request goes
// on a fresh connection.
TEST_F(ProxyClock, BytesBeforeTheRequestLeftAreNobodysAnswer) {
  auto up = pooled_upstream();
  ASSERT_TRUE(up);
  reply(up, ok("stray"));  // the pool has not seen them yet
  Answer a;
  start(a, "/a", {.pool = &pool_});  // takes the pooled connection; sent after this round
  auto again = accept_upstream();
  ASSERT_TRUE(again);
  EXPECT_EQ(received(up), "");  // never sent on the connection with the stray bytes
  EXPECT_EQ(count(received(again), "GET /a "), 1u);
  reply(again, ok("a"));
  settle();
  EXPECT_EQ(a.body(), "a");
}

TEST_F(ProxyClock, RequestsHeldBehindAStalledResponseAreSentAgainElsewhere) {
  auto up = pooled_upstream(/*echo=*/true);
  ASSERT_TRUE(up);
  Answer slow, behind;
  start(slow, "/slow", {.pool = &pool_});
  start(behind, "/behind", {.pool = &pool_});
  settle();
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
  reply(again, ok("behind"));
  settle();
  EXPECT_EQ(behind.body(), "behind");
  EXPECT_FALSE(slow.got);
  // The stalled connection answers both; the first is taken, the connection is not reused (the
  // upstream still had the request sent again elsewhere).
  reply(up, ok("slow") + ok("x"));
  settle();
  EXPECT_EQ(slow.body(), "slow");
  EXPECT_EQ(behind.body(), "behind");
  EXPECT_EQ(pool_.idle(), 0u);
}

// A connect to a Unix socket whose accept queue is full fails at once (EAGAIN): the requests
// wait for room, in order, and each goes as soon as a connect succeeds again.
TEST_F(ProxyClock, AFullAcceptQueueIsWaitedForInOrder) {
  ASSERT_EQ(::listen(listener_.get(), 0), 0);  // one connection may wait in it
  Answer a, b, c;
  start(a, "/a", {.pool = &pool_});
  start(b, "/b", {.pool = &pool_});
  start(c, "/c", {.pool = &pool_});
  settle();
  EXPECT_EQ(pool_.waiting(), 2u);
  std::vector<core::UniqueFd> ups;
  for (std::string_view path : {"GET /a ", "GET /b ", "GET /c "}) {
    ups.push_back(accept_upstream());
    ASSERT_TRUE(ups.back()) << path;
    EXPECT_EQ(count(received(ups.back()), path), 1u) << path;  // in the order they came
    now_ms_ += UpstreamPool::kRoomRetryMs;  // the next connect: room for one more
    settle();
  }
  for (size_t i = 0; i < 3; ++i) reply(ups[i], ok(std::string(1, static_cast<char>('a' + i))));
  settle();
  EXPECT_EQ(a.body(), "a");
  EXPECT_EQ(b.body(), "b");
  EXPECT_EQ(c.body(), "c");
  EXPECT_EQ(pool_.waiting(), 0u);
}

// Past its response timeout a request that never found room is 503 with Retry-After (or what
// on_busy answers): it was never sent.
TEST_F(ProxyClock, NoRoomWithinTheResponseTimeoutIs503) {
  ASSERT_EQ(::listen(listener_.get(), 0), 0);
  Answer a, b, c;
  start(a, "/a", {.pool = &pool_, .response_timeout_ms = 200});
  start(b, "/b", {.pool = &pool_, .response_timeout_ms = 200});
  ProxyOptions o{.pool = &pool_, .response_timeout_ms = 200, .label = "room:1"};
  std::string told;
  o.on_busy = [&told](std::string_view method, std::string_view label) {
    told = std::string(method) + " " + std::string(label);
    return http::Response::text("busy\n", 503);
  };
  start(c, "/c", std::move(o));
  settle();
  EXPECT_EQ(pool_.waiting(), 2u);
  now_ms_ += 201;
  settle();
  ASSERT_TRUE(a.got && b.got && c.got);
  EXPECT_EQ(a.got->status, 504);  // its connect waited in the queue: sent, never answered
  EXPECT_EQ(b.got->status, 503);
  EXPECT_EQ(b.got->find_header("Retry-After"), "1");
  EXPECT_EQ(c.body(), "busy\n");
  EXPECT_EQ(told, "GET room:1");
  EXPECT_EQ(pool_.waiting(), 0u);
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
