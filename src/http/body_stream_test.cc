// Streamed request bodies (body_stream.h) through a real Connection on a loopback socket, in
// process: backpressure (a consumer that does not take pieces stops the reading), byte-by-byte
// chunked bodies, the end and abort signals, the route's max_body, 100-continue.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/socket.h"
#include "http/body_stream.h"
#include "http/server.h"
#include "http/site.h"

namespace corral::http {
namespace {

// What the test's consumers saw.
struct Seen {
  std::string body;
  size_t pieces = 0;
  size_t largest = 0;
  int ends = 0;
  int aborts = 0;
  std::string why;
  bool take = true;  // false: on_body_data says stop
  BodyStream* stream = nullptr;
  bool read_at_start = true;
};

// The route's deferred response: reads the body, answers its length at the end.
class Reader final : public DeferredProducer, private BodyConsumer {
 public:
  Reader(Request& req, Seen& seen) : stream_(req.body_stream), seen_(seen) {
    seen_.stream = stream_;
  }
  ~Reader() override {
    if (stream_) stream_->read(nullptr);
  }
  void start(Responder& r) override {
    responder_ = &r;
    if (!stream_) return responder_->respond(Response::text("whole " + std::to_string(0)));
    if (seen_.read_at_start) stream_->read(this);
  }
  void on_abort() override { responder_ = nullptr; }

 private:
  bool on_body_data(std::string_view piece) override {
    seen_.body.append(piece);
    ++seen_.pieces;
    seen_.largest = std::max(seen_.largest, piece.size());
    return seen_.take;
  }
  void on_body_end() override {
    stream_ = nullptr;
    seen_.stream = nullptr;
    ++seen_.ends;
    if (responder_) responder_->respond(Response::text(std::to_string(seen_.body.size())));
  }
  void on_body_abort(std::string_view why) override {
    stream_ = nullptr;
    seen_.stream = nullptr;
    ++seen_.aborts;
    seen_.why = std::string(why);
  }
  BodyStream* stream_;
  Seen& seen_;
  Responder* responder_ = nullptr;
};

class BodyStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions opts;
    opts.access_log = false;
    opts.limits.max_body = 1 << 20;
    server_ = std::make_unique<Server>(loop_, log_, opts);
    port_ = server_->listen(core::parse_address("127.0.0.1:0").value())->port();
    SiteBuilder b;
    RouteOptions stream{.stream_body = true, .max_body = uint64_t{64} << 20};
    b.route(
        "POST /up",
        [this](Request& req) { return Response::deferred(std::make_unique<Reader>(req, seen_)); },
        stream);
    b.route(
        "POST /small",
        [this](Request& req) { return Response::deferred(std::make_unique<Reader>(req, seen_)); },
        RouteOptions{.stream_body = true, .max_body = 1000});
    b.route(
        "POST /refuse", [](Request&) { return Response::status_only(403); }, stream);
    b.route("POST /buffered", [](Request& req) {
      return Response::text((req.body_stream ? "stream " : "whole ") +
                            std::to_string(req.body.size()));
    });
    server_->publish(b.build().value());
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void connect() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int small = 16 * 1024;  // a small send buffer: backpressure shows sooner
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    fcntl(fd_, F_SETFL, O_NONBLOCK);
  }
  // Sends what the socket takes now; the bytes sent.
  size_t send_some(std::string_view data) {
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    return n > 0 ? static_cast<size_t>(n) : 0;
  }
  void send_all(std::string_view data) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!data.empty() && std::chrono::steady_clock::now() < deadline) {
      data.remove_prefix(send_some(data));
      loop_.run_once(1);
    }
    ASSERT_TRUE(data.empty());
  }
  void spin(int rounds) {
    for (int i = 0; i < rounds; ++i) loop_.run_once(1);
  }
  template <class F>
  bool spin_until(F done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < deadline) loop_.run_once(2);
    return done();
  }
  // Reads what the server sent until it contains `marker` or closes.
  std::string read_until(std::string_view marker) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got_.find(marker) == std::string::npos && !peer_closed_ &&
           std::chrono::steady_clock::now() < deadline) {
      loop_.run_once(2);
      char buf[65536];
      ssize_t n;
      while ((n = ::recv(fd_, buf, sizeof buf, 0)) > 0) got_.append(buf, static_cast<size_t>(n));
      if (n == 0) peer_closed_ = true;
    }
    return got_;
  }

  core::EventLoop loop_;
  core::Logger log_{2, core::LogLevel::kError};
  std::unique_ptr<Server> server_;
  int port_ = 0;
  int fd_ = -1;
  Seen seen_;
  std::string got_;
  bool peer_closed_ = false;
};

TEST_F(BodyStreamTest, AConsumerThatDoesNotTakeStopsTheReading) {
  connect();
  seen_.take = false;
  const size_t size = 4 << 20;
  std::string head =
      "POST /up HTTP/1.1\r\nHost: localhost\r\nContent-Length: " + std::to_string(size) +
      "\r\n\r\n";
  send_all(head);
  std::string block(64 * 1024, 'b');
  size_t sent = 0;
  // The client pushes as much as it can for a while; the server stops after the first piece.
  for (int i = 0; i < 300 && sent < size; ++i) {
    sent += send_some(std::string_view(block).substr(0, std::min(block.size(), size - sent)));
    loop_.run_once(1);
  }
  EXPECT_EQ(seen_.pieces, 1u);
  EXPECT_LE(seen_.body.size(), 16u * 1024);
  // What the client could send is bounded by the sockets' buffers, not the body's size.
  EXPECT_LT(sent, size / 2) << "the server kept reading a body nobody took";
  // Going on: the rest comes piece by piece (each at most one read) and the body ends.
  seen_.take = true;
  ASSERT_NE(seen_.stream, nullptr);
  seen_.stream->resume();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sent < size && std::chrono::steady_clock::now() < deadline) {
    sent += send_some(std::string_view(block).substr(0, std::min(block.size(), size - sent)));
    loop_.run_once(1);
  }
  EXPECT_TRUE(spin_until([&] { return seen_.ends == 1; }));
  EXPECT_EQ(seen_.body.size(), size);
  EXPECT_LE(seen_.largest, 16u * 1024);
  EXPECT_NE(read_until("\r\n\r\n" + std::to_string(size)).find("200 OK"), std::string::npos);
}

TEST_F(BodyStreamTest, AChunkedBodyByteByByte) {
  connect();
  std::string req =
      "POST /up HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n1\r\n \r\nb\r\nworld, byte\r\n0\r\nTrailer: x\r\n\r\n";
  for (char c : req) {
    send_all(std::string_view(&c, 1));
    spin(2);
  }
  EXPECT_TRUE(spin_until([&] { return seen_.ends == 1; }));
  EXPECT_EQ(seen_.body, "hello world, byte");
  EXPECT_EQ(seen_.aborts, 0);
  std::string out = read_until("\r\n\r\n17");
  EXPECT_NE(out.find("HTTP/1.1 200"), std::string::npos) << out;
  // keep-alive: the next request on the connection is served (the trailer was not taken for one)
  send_all("POST /buffered HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_NE(read_until("whole 3").find("whole 3"), std::string::npos) << got_;
}

TEST_F(BodyStreamTest, TheClientLeavingAbortsTheBody) {
  connect();
  send_all("POST /up HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n");
  send_all(std::string(30000, 'x'));
  EXPECT_TRUE(spin_until([&] { return seen_.body.size() == 30000; }));
  ::close(fd_);
  fd_ = -1;
  EXPECT_TRUE(spin_until([&] { return seen_.aborts == 1; }));
  EXPECT_EQ(seen_.ends, 0);
}

TEST_F(BodyStreamTest, MalformedChunkedIs400AndAborts) {
  connect();
  send_all(
      "POST /up HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\nzz\r\n");
  std::string out = read_until("\r\n\r\n");
  EXPECT_NE(out.find("HTTP/1.1 400"), std::string::npos) << out;
  EXPECT_EQ(seen_.aborts, 1);
  EXPECT_EQ(seen_.ends, 0);  // (the "abc" decoded with the error is not delivered: refused)
  read_until("never");
  EXPECT_TRUE(peer_closed_);
}

TEST_F(BodyStreamTest, TheRoutesMaxBody) {
  // Content-Length over the route's limit: 413 at once, the route never runs.
  connect();
  send_all("POST /small HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1001\r\n\r\n");
  EXPECT_NE(read_until("\r\n\r\n").find("HTTP/1.1 413"), std::string::npos) << got_;
  EXPECT_EQ(seen_.stream, nullptr);
  ::close(fd_);
  // Chunked past it: cut with 413 once it passes.
  got_.clear();
  peer_closed_ = false;
  connect();
  send_all("POST /small HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n");
  send_all("258\r\n" + std::string(600, 'a') + "\r\n");
  EXPECT_TRUE(spin_until([&] { return seen_.body.size() == 600; }));
  send_all("258\r\n" + std::string(600, 'a') + "\r\n");
  EXPECT_NE(read_until("\r\n\r\n").find("HTTP/1.1 413"), std::string::npos) << got_;
  EXPECT_EQ(seen_.aborts, 1);
  // A buffered route keeps the server's limit (1 MiB here) and gets its body whole.
  ::close(fd_);
  got_.clear();
  peer_closed_ = false;
  connect();
  send_all("POST /buffered HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_NE(read_until("whole 5").find("whole 5"), std::string::npos) << got_;
}

TEST_F(BodyStreamTest, ContinueIsSentWhenTheBodyIsAskedFor) {
  connect();
  send_all(
      "POST /up HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_NE(read_until("100 Continue\r\n\r\n").find("HTTP/1.1 100 Continue"), std::string::npos);
  send_all("abcd");
  EXPECT_NE(read_until("\r\n\r\n4").find("HTTP/1.1 200"), std::string::npos) << got_;
  // A route that answers without reading: no 100, the answer, and the connection closes (the
  // body the client may still send is never parsed as a request).
  got_.clear();
  send_all(
      "POST /refuse HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\nExpect: "
      "100-continue\r\n\r\n");
  std::string out = read_until("never");
  EXPECT_EQ(out.find("100 Continue"), std::string::npos) << out;
  EXPECT_NE(out.find("HTTP/1.1 403"), std::string::npos) << out;
  EXPECT_NE(out.find("Connection: close"), std::string::npos) << out;
  EXPECT_TRUE(peer_closed_);
}

TEST_F(BodyStreamTest, NothingIsReadBeforeTheConsumerAsks) {
  connect();
  seen_.read_at_start = false;
  send_all("POST /up HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n0123456789");
  spin(20);
  ASSERT_NE(seen_.stream, nullptr);
  EXPECT_EQ(seen_.pieces, 0u);
  EXPECT_EQ(seen_.stream->length(), std::optional<uint64_t>(10));
}

}  // namespace
}  // namespace corral::http
