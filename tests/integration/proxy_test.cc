// Integration: the reverse proxy to a Unix-socket upstream, in-process. The upstream is corral's
// own Server on a Unix socket (as a worker is); the front Server proxies /p/* to it.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/socket.h"
#include "http/server.h"
#include "http/site.h"
#include "loopback.h"
#include "proxy/proxy.h"
#include "ws/socket.h"

namespace corral::proxy {
namespace {

using http::DeferredProducer;
using http::Request;
using http::Responder;
using http::Response;
using http::Server;
using http::ServerOptions;
using http::SiteBuilder;
using http::StreamProducer;
using http::StreamWriter;

class Proxy : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions opts;
    opts.access_log = false;
    path_ = "/tmp/corral-proxy-test-" + std::to_string(getpid()) + ".sock";
    // As a worker's server: behind corral it echoes the proxy's Corral-Seq, so GETs are pipelined
    // to it (docs/worker-protocol.md, "Pipelining").
    ServerOptions up_opts = opts;
    up_opts.behind_corral = true;
    upstream_ = std::make_unique<Server>(loop_, log_, up_opts);
    ASSERT_TRUE(upstream_->adopt_listener(core::listen_unix(path_).value()).ok());
    SiteBuilder up;
    up.route("GET /hello", [](Request& req) {
      return Response::text("hello from upstream, remote " +
                            std::string(req.header("corral-remote-address").value_or("?")));
    });
    up.route("GET /big", [](Request&) { return Response::text(std::string(1 << 20, 'b')); });
    up.route("POST /echo", [](Request& req) { return Response::text(std::string(req.body)); });
    // The body's size and the names of the headers the upstream saw.
    up.route("POST /size", [](Request& req) {
      std::string seen = std::to_string(req.body.size()) + ";";
      for (const auto& h : req.headers) seen.append(h.name).append(";");
      return Response::text(seen + "end.");
    });
    // Headers both ways: the request's as the upstream saw them, and some of its own.
    up.route("GET /headers", [](Request& req) {
      std::string seen;
      for (const auto& h : req.headers) seen.append(h.name).append(";");
      Response r = Response::text(seen + "end.");
      r.header("X-Custom", "kept").header("Keep-Alive", "timeout=5").header("Trailer", "X-T");
      r.header("Proxy-Authenticate", "Basic").header("X-Content-Type-Options", "upstream's");
      return r;
    });
    up.route("GET /path/{n}", [](Request& req) {
      return Response::text("path " + std::string(req.param("n")) + ";");
    });
    // A stream that sends one line and then stays open.
    up.route("GET /stream", [](Request&) {
      struct Tick final : StreamProducer {
        void on_start(StreamWriter& w) override { w.write("tick\n"); }
        void on_writable(StreamWriter&) override {}
        void on_abort() override {}
      };
      return Response::stream(std::make_unique<Tick>(), "text/plain");
    });
    // Answered when the test says so (slow_).
    up.route("GET /slow", [this](Request&) {
      struct Slow final : DeferredProducer {
        explicit Slow(Responder** slot) : slot_(slot) {}
        void start(Responder& r) override { *slot_ = &r; }
        void on_abort() override { *slot_ = nullptr; }
        Responder** slot_;
      };
      return Response::deferred(std::make_unique<Slow>(&slow_));
    });
    up.route("GET /status/{n}", [](Request& req) {
      return Response::status_only(std::stoi(std::string(req.param("n"))));
    });
    ws::SocketRoute echo;
    echo.on_open = [](ws::Socket& sock) {
      sock.on_message = [](ws::Socket& sock, std::string_view m, bool) { sock.send_text(m); };
    };
    ws::add_socket_route(up, "/sock", echo);
    upstream_->publish(up.build().value());

    front_ = std::make_unique<Server>(loop_, log_, opts);
    port_ = front_->listen(core::parse_address("127.0.0.1:0").value())->port();
    SiteBuilder fr;
    fr.route("/p/*", [this](Request& req) {
      // The upstream sees the path after /p.
      ProxyOptions o{.target = "/" + req.wildcard};
      o.add_header("Corral-Remote-Address", req.remote_address);
      return proxy_to(req, path_, std::move(o));
    });
    fr.route("/pooled/*", [this](Request& req) {
      return proxy_to(req, path_, {.pool = &pool_, .target = "/" + req.wildcard});
    });
    fr.route("/down/*", [](Request& req) { return proxy_to(req, "/tmp/corral-no-such.sock"); });
    // An upstream the test answers byte by byte (raw_accept).
    raw_path_ = path_ + ".raw";
    raw_listener_ = core::listen_unix(raw_path_).value();
    fr.route("/raw/*", [this](Request& req) {
      return proxy_to(req, raw_path_, {.pool = &pool_, .target = "/" + req.wildcard});
    });
    front_->publish(fr.build().value());
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::unlink(raw_path_.c_str());
  }

  // The raw upstream's next connection (running the loop until the proxy connects), with the
  // request read from it up to the end of its head and `body_size` bytes after it.
  core::UniqueFd raw_accept(std::string& request, size_t body_size) {
    core::UniqueFd fd;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!fd && std::chrono::steady_clock::now() < deadline) {
      loop_.run_once(5);
      fd.reset(::accept4(raw_listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    }
    EXPECT_TRUE(fd) << "the proxy never connected to the raw upstream";
    while (fd && std::chrono::steady_clock::now() < deadline) {
      auto end = request.find("\r\n\r\n");
      if (end != std::string::npos && request.size() >= end + 4 + body_size) break;
      loop_.run_once(5);
      char buf[65536];
      ssize_t n;
      while ((n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0)
        request.append(buf, static_cast<size_t>(n));
    }
    return fd;
  }
  static void raw_send(const core::UniqueFd& fd, std::string_view bytes) {
    EXPECT_EQ(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  std::string exchange(const std::string& request, std::string_view until) {
    int fd = testing::connect_loopback(port_);
    EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
    std::string got = testing::read_until(loop_, fd, until);
    ::close(fd);
    return got;
  }

  // The loop's clock: the real one until freeze_clock(), which stops it for a test whose counts
  // must not depend on how long a loop round takes on a loaded machine (the pool's kFastMs and
  // kStallMs are measured on it).
  std::optional<uint64_t> frozen_ms_;
  core::EventLoop loop_{[this] { return frozen_ms_ ? *frozen_ms_ : core::monotonic_ms(); }};
  void freeze_clock() { frozen_ms_ = loop_.now(); }
  core::Logger log_{2, core::LogLevel::kError};
  std::string path_;
  std::string raw_path_;
  core::UniqueFd raw_listener_;
  std::string target_;
  std::unique_ptr<Server> upstream_, front_;
  UpstreamPool pool_{loop_};
  int port_ = 0;
  Responder* slow_ = nullptr;  // the upstream's pending GET /slow

  // Sends `request` on a new client connection, without running the loop, and waits until the
  // server's socket has it: requests sent one after another reach the proxy in one loop round.
  int send_on_new(const std::string& request) {
    int fd = testing::connect_loopback(port_);
    EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
    testing::wait_delivered(fd);
    return fd;
  }
  static std::string get(std::string_view path) {
    return "GET " + std::string(path) + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  }
  // `n` clients send GET /pooled/path/<i> at once (in one loop round); each must get the answer
  // to its own request and nothing else.
  void each_gets_its_own(int n) {
    std::vector<int> fds;
    for (int i = 0; i < n; ++i)
      fds.push_back(send_on_new(get("/pooled/path/" + std::to_string(i))));
    for (int i = 0; i < n; ++i) {
      std::string want = "path " + std::to_string(i) + ";";
      auto got = testing::read_until(loop_, fds[static_cast<size_t>(i)], want);
      EXPECT_NE(got.find(want), std::string::npos) << i << ": " << got;
      EXPECT_EQ(got.find("path", got.find(want) + 1), std::string::npos) << got;  // only its own
      ::close(fds[static_cast<size_t>(i)]);
    }
  }
};

TEST_F(Proxy, ForwardsAndAddsTrustedHeaders) {
  auto got =
      exchange("GET /p/hello HTTP/1.1\r\nHost: localhost\r\nCorral-Remote-Address: forged\r\n\r\n",
               "upstream, remote 127.0.0.1");
  EXPECT_NE(got.find("HTTP/1.1 200 OK"), std::string::npos) << got;
  EXPECT_NE(got.find("hello from upstream, remote 127.0.0.1"), std::string::npos) << got;
  EXPECT_EQ(got.find("forged"), std::string::npos);
}

TEST_F(Proxy, HopByHopHeadersStopAtTheProxyBothWays) {
  auto got = exchange(
      "GET /pooled/headers HTTP/1.1\r\nHost: localhost\r\nX-Mine: 1\r\nTE: trailers\r\n"
      "Keep-Alive: timeout=9\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\n"
      "Corral-Address: forged\r\n\r\n",
      "end.");
  auto body = got.substr(got.find("\r\n\r\n") + 4);
  EXPECT_NE(body.find("X-Mine;"), std::string::npos) << body;
  for (const char* hop : {"TE;", "Keep-Alive;", "Proxy-Authorization;", "Connection;"})
    EXPECT_EQ(body.find(hop), std::string::npos) << hop << " reached the upstream: " << body;
  EXPECT_EQ(body.find("forged"), std::string::npos);
  auto head = got.substr(0, got.find("\r\n\r\n"));
  EXPECT_NE(head.find("X-Custom: kept"), std::string::npos) << head;
  for (const char* hop : {"Keep-Alive:", "Trailer:", "Proxy-Authenticate:", "upstream's"})
    EXPECT_EQ(head.find(hop), std::string::npos) << hop << " reached the client: " << head;
  EXPECT_NE(head.find("X-Content-Type-Options: nosniff"), std::string::npos) << head;
}

TEST_F(Proxy, StreamsALargeBodyWithItsLength) {
  auto got = exchange("GET /p/big HTTP/1.1\r\nHost: localhost\r\n\r\n", std::string(64, 'b'));
  EXPECT_NE(got.find("Content-Length: 1048576"), std::string::npos) << got.substr(0, 300);
  auto deadline_body =
      exchange("GET /p/big HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
               "\xff-until-the-server-closes");
  auto body = deadline_body.substr(deadline_body.find("\r\n\r\n") + 4);
  EXPECT_EQ(body.size(), 1u << 20);
}

TEST_F(Proxy, SendsTheRequestBody) {
  auto got =
      exchange("POST /p/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 11\r\n\r\nhello world",
               "\r\n\r\nhello world");
  EXPECT_NE(got.find("\r\n\r\nhello world"), std::string::npos) << got;
}

TEST_F(Proxy, PassesStatusesAndAnswers502WhenTheUpstreamIsDown) {
  EXPECT_NE(exchange("GET /p/status/404 HTTP/1.1\r\nHost: localhost\r\n\r\n", "Not Found\n")
                .find("HTTP/1.1 404"),
            std::string::npos);
  auto down = exchange("GET /down/x HTTP/1.1\r\nHost: localhost\r\n\r\n", "Bad Gateway\n");
  EXPECT_NE(down.find("HTTP/1.1 502"), std::string::npos) << down;
}

TEST_F(Proxy, APoolReusesOneUpstreamConnectionAndSurvivesItsClose) {
  for (int i = 0; i < 5; ++i) {
    auto got = exchange("GET /pooled/hello HTTP/1.1\r\nHost: localhost\r\n\r\n", "remote ");
    EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  }
  EXPECT_EQ(upstream_->stats().accepted, 1u);  // five requests, one upstream connection
  EXPECT_EQ(pool_.idle(), 1u);
  // The upstream drops its idle connections (as a worker's keep-alive timeout would): the pool
  // notices, or a request that finds the dead connection is sent again on a fresh one.
  upstream_->close([] {});  // idle connections close after the server's 100 ms drain grace
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (pool_.idle() > 0 && std::chrono::steady_clock::now() < deadline) loop_.run_once(10);
  EXPECT_EQ(pool_.idle(), 0u);
}

TEST_F(Proxy, ADeadPooledConnectionIsReplacedTransparently) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  ::close(sv[1]);  // the "upstream" already closed this one
  auto dead = UpstreamConnection::adopt(loop_, core::UniqueFd(sv[0]), path_, &pool_);
  ASSERT_TRUE(dead);
  pool_.give(std::move(dead));
  ASSERT_EQ(pool_.idle(), 1u);
  auto got = exchange(
      "POST /pooled/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\nok", "\r\n\r\nok");
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
}

TEST_F(Proxy, RelaysAWebSocketUpgradeBothWays) {
  // The handshake, then a masked text frame "hi" (mask 01 02 03 04) in the same write.
  std::string req =
      "GET /p/sock HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
  req += std::string("\x81\x82\x01\x02\x03\x04", 6);
  req += static_cast<char>('h' ^ 0x01);
  req += static_cast<char>('i' ^ 0x02);
  auto got = exchange(req, std::string("\x81\x02hi", 4));
  EXPECT_NE(got.find("HTTP/1.1 101"), std::string::npos) << got;
  EXPECT_NE(got.find("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), std::string::npos) << got;
  EXPECT_NE(got.find(std::string("\x81\x02hi", 4)), std::string::npos) << got;
}

TEST_F(Proxy, PipelinesTheGetsOfOneRoundOnFewConnectionsInOrder) {
  // Twelve clients whose requests arrive together (each sits in the server's socket before the
  // loop runs): they leave in one loop round, pipelined up to kMaxPipeline per connection on
  // those whose upstream echoed Corral-Seq, and each client gets its own response. The first
  // answer on a pooled connection says whether it echoes: after one GET, one connection does;
  // the round's 12 go 8 on it and one each on 4 new ones, which echo from then on (the next
  // round: 8 + 4 on two of them). The loop's clock stands still, so no response counts as slow
  // (kFastMs) or stalled (kStallMs) however loaded the machine is: the counts are exact. (With
  // the real clock, CI and a fresh machine saw 12 to 24 connections when a round took longer
  // than 20 ms.)
  freeze_clock();
  EXPECT_NE(exchange(get("/pooled/path/0"), "path 0;").find("path 0;"), std::string::npos);
  each_gets_its_own(12);
  EXPECT_EQ(upstream_->stats().accepted, 5u);
  each_gets_its_own(12);  // on two of the same connections, from the pool
  EXPECT_EQ(upstream_->stats().accepted, 5u);
  EXPECT_EQ(pool_.stats().pipelined, 17u);  // 7, then 7 + 3 behind the first on each
  EXPECT_EQ(pool_.stats().rescued, 0u);
  EXPECT_EQ(pool_.idle(), 5u);
}

TEST_F(Proxy, AHeadPipelinedAmongGetsEndsAtItsHead) {
  // A response to HEAD has a Content-Length but no body: the bytes after its head are the next
  // pipelined response's. (The clock stands still: a round slower than kStallMs on a loaded
  // machine would send those behind again on new connections.)
  freeze_clock();
  // A pooled connection whose upstream echoes Corral-Seq first: requests are pipelined on it.
  EXPECT_NE(exchange(get("/pooled/path/9"), "path 9;").find("path 9;"), std::string::npos);
  std::vector<int> fds;
  for (int i = 0; i < 6; ++i) {
    std::string path = "/pooled/path/" + std::to_string(i);
    fds.push_back(
        send_on_new(i == 2 ? "HEAD " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n" : get(path)));
  }
  for (int i = 0; i < 6; ++i) {
    std::string want = i == 2 ? "\r\n\r\n" : "path " + std::to_string(i) + ";";
    auto got = testing::read_until(loop_, fds[static_cast<size_t>(i)], want);
    EXPECT_NE(got.find(want), std::string::npos) << i << ": " << got;
    if (i == 2) {
      EXPECT_NE(got.find("Content-Length: 7"), std::string::npos) << got;
      EXPECT_EQ(got.find("path"), std::string::npos) << got;  // no body
    }
    ::close(fds[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(upstream_->stats().accepted, 1u);  // all six pipelined on one connection
  EXPECT_EQ(pool_.stats().rescued, 0u);
}

TEST_F(Proxy, AStreamDoesNotHoldTheRequestsPipelinedBehindIt) {
  int streaming = send_on_new(get("/pooled/stream"));
  each_gets_its_own(5);
  auto got = testing::read_until(loop_, streaming, "tick");
  EXPECT_NE(got.find("tick"), std::string::npos) << got;
  ::close(streaming);
  // The next requests are served as usual.
  EXPECT_NE(exchange(get("/pooled/path/9"), "path 9;").find("path 9;"), std::string::npos);
}

TEST_F(Proxy, ASlowResponseDoesNotHoldTheRequestsPipelinedBehindIt) {
  int slow = send_on_new(get("/pooled/slow"));
  each_gets_its_own(5);
  // All five were answered while the slow one is still pending upstream.
  ASSERT_NE(slow_, nullptr);
  slow_->respond(Response::text("slow done"));
  auto got = testing::read_until(loop_, slow, "slow done");
  EXPECT_NE(got.find("slow done"), std::string::npos) << got;
  ::close(slow);
  EXPECT_NE(exchange(get("/pooled/path/7"), "path 7;").find("path 7;"), std::string::npos);
}

TEST_F(Proxy, AClientThatLeavesWhilePipelinedLosesNothingForOthers) {
  int slow = send_on_new(get("/pooled/slow"));
  int leaver = send_on_new(get("/pooled/path/1"));
  int stays = send_on_new(get("/pooled/path/2"));
  loop_.run_once(5);
  ::close(leaver);  // gone while its request waits behind the slow one (or was sent again)
  auto got = testing::read_until(loop_, stays, "path 2;");
  EXPECT_NE(got.find("path 2;"), std::string::npos) << got;
  ::close(stays);
  ASSERT_NE(slow_, nullptr);
  slow_->respond(Response::text("slow done"));
  got = testing::read_until(loop_, slow, "slow done");
  EXPECT_NE(got.find("slow done"), std::string::npos) << got;
  ::close(slow);
  EXPECT_NE(exchange(get("/pooled/path/3"), "path 3;").find("path 3;"), std::string::npos);
}

TEST_F(Proxy, APostIsNeverPipelined) {
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i)
    fds.push_back(
        send_on_new("POST /pooled/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\np" +
                    std::to_string(i)));
  for (int i = 0; i < 4; ++i) {
    std::string want = "\r\n\r\np" + std::to_string(i);
    auto got = testing::read_until(loop_, fds[static_cast<size_t>(i)], want);
    EXPECT_NE(got.find(want), std::string::npos) << got;
    ::close(fds[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(upstream_->stats().accepted, 4u);  // one connection each: nothing waited behind
}

TEST_F(Proxy, ExpectContinueIsAnsweredByTheFrontAndNotPassedOn) {
  // As curl sends a body over 1 MiB: the head with Expect, the body only after 100 Continue.
  // The upstream (corral's Server, as a worker's) must not see Expect: it would get the head
  // ahead of a 2 MiB body and answer its own 100, which the client must never take as final.
  const size_t size = 2u << 20;
  int fd = testing::connect_loopback(port_);
  std::string head =
      "POST /pooled/size HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
      "Content-Length: " +
      std::to_string(size) + "\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
  auto got = testing::read_until(loop_, fd, "\r\n\r\n");
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n");
  std::string body(size, 'x');
  size_t sent = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (sent < body.size() && std::chrono::steady_clock::now() < deadline) {
    ssize_t n = ::send(fd, body.data() + sent, body.size() - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<size_t>(n);
    loop_.run_once(1);
  }
  ASSERT_EQ(sent, body.size());
  got = testing::read_until(loop_, fd, "end.");
  ::close(fd);
  EXPECT_NE(got.find("HTTP/1.1 200 OK"), std::string::npos) << got;
  EXPECT_EQ(got.find("HTTP/1.1 100"), std::string::npos) << got;
  EXPECT_NE(got.find(std::to_string(size) + ";"), std::string::npos) << got;
  EXPECT_EQ(got.find("Expect;"), std::string::npos) << "Expect reached the upstream: " << got;
}

TEST_F(Proxy, AnUpstreamsInterimResponsesAreReadPastToTheFinalOne) {
  int client = testing::connect_loopback(port_);
  std::string req = "POST /raw/w HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\nhi";
  ASSERT_EQ(::send(client, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string seen;
  auto up = raw_accept(seen, 2);
  ASSERT_TRUE(up);
  EXPECT_NE(seen.find("\r\n\r\nhi"), std::string::npos) << seen;
  // 100 and 103 (one with headers and a Content-Length a 1xx cannot have), then, in another
  // read, the answer.
  raw_send(up,
           "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n"
           "Content-Length: 3\r\n\r\n");
  for (int i = 0; i < 10; ++i) loop_.run_once(1);
  raw_send(up, "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-Final: 1\r\n\r\nfinal");
  auto got = testing::read_until(loop_, client, "final");
  EXPECT_EQ(got.rfind("HTTP/1.1 201 Created\r\n", 0), 0u) << got;  // the first and only head
  EXPECT_NE(got.find("X-Final: 1"), std::string::npos) << got;
  EXPECT_EQ(got.find("Link:"), std::string::npos) << got;
  EXPECT_NE(got.find("\r\n\r\nfinal"), std::string::npos) << got;
  // The connection stays usable: the next request on it is answered too.
  std::string again = "GET /raw/x HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ASSERT_EQ(::send(client, again.data(), again.size(), 0), static_cast<ssize_t>(again.size()));
  std::string next;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (next.find("\r\n\r\n") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    loop_.run_once(5);
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(up.get(), buf, sizeof buf, 0)) > 0) next.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(next.rfind("GET /x HTTP/1.1\r\n", 0), 0u) << next;  // on the pooled connection
  raw_send(up, "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext");
  got = testing::read_until(loop_, client, "next");
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("\r\n\r\nnext"), std::string::npos) << got;
  ::close(client);
}

TEST_F(Proxy, AnUpstreamThatOnlySendsInterimResponsesGets502) {
  int client = testing::connect_loopback(port_);
  std::string req = get("/raw/w");
  ASSERT_EQ(::send(client, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string seen;
  auto up = raw_accept(seen, 0);
  ASSERT_TRUE(up);
  std::string flood;
  for (int i = 0; i < 100; ++i) flood += "HTTP/1.1 102 Processing\r\n\r\n";
  raw_send(up, flood);
  auto got = testing::read_until(loop_, client, "Bad Gateway\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 502", 0), 0u) << got;
  ::close(client);
  // A 101 nobody asked for is no answer either.
  client = testing::connect_loopback(port_);
  ASSERT_EQ(::send(client, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  seen.clear();
  auto up2 = raw_accept(seen, 0);
  ASSERT_TRUE(up2);
  raw_send(up2, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n");
  got = testing::read_until(loop_, client, "Bad Gateway\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 502", 0), 0u) << got;
  ::close(client);
}

}  // namespace
}  // namespace corral::proxy
