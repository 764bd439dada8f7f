// Streamed request bodies through the proxy (proxy.h), against an in-process upstream on a Unix
// socket, on a FAKE clock. The client's side is a BodyStream of the test's own (FakeBody): the
// test hands pieces to the proxy's consumer and sees what it asks (read, resume, detach).
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <variant>

#include "core/event_loop.h"
#include "core/socket.h"
#include "http/body_stream.h"
#include "proxy/proxy.h"

namespace corral::proxy {
namespace {

struct Answer final : http::Responder {
  void respond(http::Response r) override { got = std::move(r); }
  std::optional<http::Response> got;
};

// The client's body as the connection would give it.
class FakeBody final : public http::BodyStream {
 public:
  explicit FakeBody(std::optional<uint64_t> length) : length_(length) {}
  void read(http::BodyConsumer* c) override {
    consumer = c;
    if (c) ++reads;
  }
  void resume() override { ++resumes; }
  std::optional<uint64_t> length() const override { return length_; }
  uint64_t delivered() const override { return delivered_; }
  // Hands `piece` over; the consumer's answer (false: stop).
  bool push(std::string_view piece) {
    delivered_ += piece.size();
    return consumer->on_body_data(piece);
  }
  void end() { std::exchange(consumer, nullptr)->on_body_end(); }
  void abort() { std::exchange(consumer, nullptr)->on_body_abort("client left"); }

  http::BodyConsumer* consumer = nullptr;
  int reads = 0;
  int resumes = 0;

 private:
  std::optional<uint64_t> length_;
  uint64_t delivered_ = 0;
};

class StreamedBody : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/corral-proxy-body-" + std::to_string(getpid()) + ".sock";
    listener_ = core::listen_unix(path_).value();
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  void start(Answer& a, FakeBody* body, std::string_view target, ProxyOptions o = {},
             http::Method method = http::Method::kPost) {
    http::Request req;
    req.method = method;
    req.method_name = http::method_name(method);
    req.target = target;
    req.loop = &loop_;
    req.body_stream = body;
    calls_.push_back(proxy_to(req, path_, std::move(o)));
    std::get<http::DeferredBody>(calls_.back().body).producer->start(a);
  }
  void settle() {
    for (int i = 0; i < 5; ++i) loop_.run_once(0);
  }
  core::UniqueFd accept_upstream() {
    settle();
    return core::UniqueFd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK));
  }
  static std::string received(const core::UniqueFd& fd) {
    std::string got;
    char buf[65536];
    ssize_t n;
    while ((n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
    return got;
  }
  static void reply(const core::UniqueFd& fd, std::string_view bytes) {
    ASSERT_EQ(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  static bool sees_eof(const core::UniqueFd& fd) {
    char buf[65536];
    ssize_t n;
    while ((n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0) {
    }
    return n == 0;
  }

  uint64_t now_ms_ = 1'000'000;
  core::EventLoop loop_{[this] { return now_ms_; }};
  UpstreamPool pool_{loop_};
  std::string path_;
  core::UniqueFd listener_;
  std::vector<http::Response> calls_;
};

TEST_F(StreamedBody, ContentLengthPassesOnAndTheBodyFollowsTheHead) {
  FakeBody body(10);
  Answer a;
  start(a, &body, "/up", {.pool = &pool_});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  ASSERT_NE(body.consumer, nullptr);  // asked for once on a connection
  EXPECT_TRUE(body.push("01234"));
  EXPECT_TRUE(body.push("56789"));
  body.end();
  settle();
  std::string sent = received(up);
  EXPECT_NE(sent.find("Content-Length: 10\r\n"), std::string::npos) << sent;
  EXPECT_EQ(sent.find("Transfer-Encoding"), std::string::npos) << sent;
  EXPECT_EQ(sent.substr(sent.size() - 14), "\r\n\r\n0123456789") << sent;
  reply(up, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 200);
  EXPECT_EQ(pool_.idle(), 1u);  // the body ended: the connection may be reused
}

TEST_F(StreamedBody, ChunkedIsReChunkedPieceByPiece) {
  FakeBody body(std::nullopt);
  Answer a;
  start(a, &body, "/up", {.pool = &pool_});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  body.push("hello");
  body.push(std::string(300, 'x'));
  body.end();
  settle();
  std::string sent = received(up);
  EXPECT_NE(sent.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << sent;
  EXPECT_EQ(sent.find("Content-Length"), std::string::npos) << sent;
  size_t at = sent.find("\r\n\r\n") + 4;
  EXPECT_EQ(sent.substr(at), "5\r\nhello\r\n12c\r\n" + std::string(300, 'x') + "\r\n0\r\n\r\n");
  reply(up, "HTTP/1.1 204 No Content\r\n\r\n");
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 204);
}

TEST_F(StreamedBody, AnUpstreamThatDoesNotReadStopsTheClient) {
  FakeBody body(uint64_t{64} << 20);
  Answer a;
  start(a, &body, "/up");
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  std::string piece(16 * 1024, 'p');
  size_t pushed = 0;
  while (body.push(piece)) {
    pushed += piece.size();
    ASSERT_LT(pushed, size_t{32} << 20) << "the proxy never said stop";
  }
  // Stopped at the high-water mark past what the socket took: bounded.
  EXPECT_GT(pushed, 0u);
  // (resume() while the consumer still takes, after a write that emptied the queue, is a no-op.)
  const int resumes = body.resumes;
  settle();
  EXPECT_EQ(body.resumes, resumes);  // the upstream has not read: no going on
  // The upstream reads: once all is written the client goes on.
  for (int i = 0; i < 100 && body.resumes == resumes; ++i) {
    received(up);
    settle();
  }
  EXPECT_GT(body.resumes, resumes);
  body.abort();  // (a busy upstream connection owns itself: end it)
  settle();
}

TEST_F(StreamedBody, TheClientLeavingClosesTheUpstreamConnection) {
  FakeBody body(1000);
  Answer a;
  start(a, &body, "/up", {.pool = &pool_});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  body.push("part of it");
  settle();
  body.abort();
  settle();
  EXPECT_TRUE(sees_eof(up));  // the upstream sees its request cut
  EXPECT_EQ(pool_.idle(), 0u);
  EXPECT_FALSE(a.got);
}

TEST_F(StreamedBody, AResponseBeforeTheBodysEndDetachesAndIsNotPooled) {
  FakeBody body(1000);
  Answer a;
  start(a, &body, "/up", {.pool = &pool_});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  body.push("some");
  settle();
  reply(up, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\n\r\n");
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 413);
  EXPECT_EQ(body.consumer, nullptr);  // nobody reads the rest
  EXPECT_EQ(pool_.idle(), 0u);        // the upstream has an unfinished request on it
  EXPECT_TRUE(sees_eof(up));
}

TEST_F(StreamedBody, TheResponseTimeoutRunsFromTheLastBodyByte) {
  FakeBody body(1000);
  Answer a;
  start(a, &body, "/up", {.response_timeout_ms = 500});
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  for (int i = 0; i < 4; ++i) {  // 1.6 s of a slow upload: no 504
    now_ms_ += 400;
    settle();
    body.push("x");
  }
  body.end();
  now_ms_ += 499;
  settle();
  EXPECT_FALSE(a.got);
  now_ms_ += 2;
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 504);
}

TEST_F(StreamedBody, ABodyThatBeganToLeaveIsNeverSentAgain) {
  // A pooled connection, then a streamed request on it that the upstream drops before answering.
  Answer first;
  start(first, nullptr, "/1", {.pool = &pool_}, http::Method::kGet);
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  received(up);
  reply(up, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1");
  settle();
  ASSERT_EQ(pool_.idle(), 1u);
  FakeBody body(100);
  Answer a;
  start(a, &body, "/up", {.pool = &pool_});
  settle();
  body.push("gone with the connection");
  settle();
  up.reset();  // the upstream closes without an answer
  settle();
  EXPECT_FALSE(accept_upstream());  // not sent again
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 502);
  EXPECT_EQ(body.consumer, nullptr);
}

TEST_F(StreamedBody, AFinderThatAnswersInsteadNeverAsksForTheBody) {
  FakeBody body(100);
  Answer a;
  http::Request req;
  req.method = http::Method::kPost;
  req.method_name = "POST";
  req.target = "/up";
  req.loop = &loop_;
  req.body_stream = &body;
  UpstreamAnswer later;
  calls_.push_back(
      proxy_found(req, [&](const std::string&, UpstreamAnswer answer, bool) { later = answer; }));
  std::get<http::DeferredBody>(calls_.back().body).producer->start(a);
  settle();
  EXPECT_EQ(body.reads, 0);  // no upstream yet: nothing is read (the client's 100 waits too)
  later("", http::Response::status_only(503));
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 503);
  EXPECT_EQ(body.reads, 0);
  EXPECT_EQ(body.consumer, nullptr);
}

TEST_F(StreamedBody, ABodyNotYetTakenIsSentAgainWithItsRequest) {
  // The upstream was found, but its socket refuses the connect: found again, sent on the new
  // path with its body, which had not begun to leave.
  FakeBody body(5);
  Answer a;
  http::Request req;
  req.method = http::Method::kPost;
  req.method_name = "POST";
  req.target = "/up";
  req.loop = &loop_;
  req.body_stream = &body;
  int asked = 0;
  calls_.push_back(proxy_found(req, [&](const std::string&, UpstreamAnswer answer, bool) {
    ++asked;
    answer(asked == 1 ? std::string("/tmp/corral-proxy-body-nobody.sock") : path_, std::nullopt);
  }));
  std::get<http::DeferredBody>(calls_.back().body).producer->start(a);
  auto up = accept_upstream();
  ASSERT_TRUE(up);
  EXPECT_EQ(asked, 2);
  ASSERT_NE(body.consumer, nullptr);
  body.push("hello");
  body.end();
  settle();
  std::string sent = received(up);
  EXPECT_EQ(sent.substr(sent.size() - 9), "\r\n\r\nhello") << sent;
  reply(up, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  settle();
  ASSERT_TRUE(a.got);
  EXPECT_EQ(a.got->status, 200);
}

}  // namespace
}  // namespace corral::proxy
