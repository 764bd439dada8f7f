// Integration tests (STYLE rule 10): an EventLoop, a Server and Sites run in-process on
// 127.0.0.1:0; the client is a raw non-blocking socket that sends exact bytes. The test drives the
// loop with run_once() until the bytes it expects arrive, bounded by time (never a sleep).
//
// Streams are driven by the test: the /slow route's producer hands its StreamWriter to the test,
// which writes and ends it between loop iterations, so "in flight" is a state, not a timing.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <charconv>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/socket.h"
#include "core/unique_fd.h"
#include "http/admission.h"
#include "http/server.h"
#include "http/site.h"

namespace corral::http {
namespace {

using namespace std::chrono_literals;

// --- A minimal HTTP/1.1 response reader --------------------------------------------------------

struct HttpResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  std::optional<std::string> header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (iequals(k, name)) return v;
    return std::nullopt;
  }
};

// Parses complete responses from the front of `buf` (Content-Length or chunked framing; a response
// without either to a non-HEAD request is not supported). Returns them; `rest` gets what is left.
std::vector<HttpResponse> parse_responses(std::string_view buf, std::string_view* rest = nullptr) {
  std::vector<HttpResponse> out;
  for (;;) {
    size_t end = buf.find("\r\n\r\n");
    if (end == std::string_view::npos) break;
    std::string_view head = buf.substr(0, end);
    HttpResponse r;
    size_t line_end = head.find("\r\n");
    std::string_view status_line = head.substr(0, line_end);
    if (status_line.size() < 12) break;
    std::from_chars(status_line.data() + 9, status_line.data() + 12, r.status);
    std::string_view fields = line_end == std::string_view::npos ? "" : head.substr(line_end + 2);
    while (!fields.empty()) {
      size_t e = fields.find("\r\n");
      std::string_view line = fields.substr(0, e);
      size_t colon = line.find(':');
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      r.headers.emplace_back(std::string(line.substr(0, colon)), std::string(value));
      fields = e == std::string_view::npos ? "" : fields.substr(e + 2);
    }
    std::string_view after = buf.substr(end + 4);
    size_t used = 0;
    if (auto te = r.header("transfer-encoding"); te && *te == "chunked") {
      bool done = false;
      for (;;) {
        size_t le = after.find("\r\n", used);
        if (le == std::string_view::npos) break;
        size_t n = 0;
        std::from_chars(after.data() + used, after.data() + le, n, 16);
        if (after.size() < le + 2 + n + 2) break;
        r.body.append(after.substr(le + 2, n));
        used = le + 2 + n + 2;
        if (n == 0) {
          done = true;
          break;
        }
      }
      if (!done) break;
    } else if (auto cl = r.header("content-length");
               cl && r.status >= 200 && r.status != 204 && r.status != 304) {
      size_t n = std::stoul(*cl);
      if (after.size() < n) break;
      r.body.assign(after.substr(0, n));
      used = n;
    }
    out.push_back(std::move(r));
    buf = after.substr(used);
  }
  if (rest) *rest = buf;
  return out;
}

// --- The test site -----------------------------------------------------------------------------

// The /slow route's producer registers its writer here; the test writes and ends it.
struct SlowStreams {
  std::vector<StreamWriter*> writers;
  size_t aborted = 0;
};

class TestProducer final : public StreamProducer {
 public:
  TestProducer(SlowStreams& streams, std::string first)
      : streams_(streams), first_(std::move(first)) {}
  void on_start(StreamWriter& w) override {
    w.write(first_);
    streams_.writers.push_back(&w);
  }
  void on_abort() override {
    ++streams_.aborted;
    std::erase_if(streams_.writers, [](StreamWriter*) { return true; });
  }

 private:
  SlowStreams& streams_;
  std::string first_;
};

std::shared_ptr<const Site> make_site(std::string version, SlowStreams& streams) {
  SiteBuilder b;
  b.route("GET /version", [version](Request&) { return Response::text(version); });
  b.route("GET /echo/{word}",
          [](Request& req) { return Response::text(std::string(req.param("word"))); });
  b.route("POST /upload",
          [](Request& req) { return Response::text("got " + std::to_string(req.body.size())); });
  b.route("GET /slow", [version, &streams](Request&) {
    return Response::stream(std::make_unique<TestProducer>(streams, version + "-start;"),
                            "text/plain");
  });
  auto built = b.build();
  EXPECT_TRUE(built.ok());
  return built.value();
}

// --- The harness -------------------------------------------------------------------------------

class Client {
 public:
  explicit Client(uint16_t port) {
    fd_ = core::UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // Loopback connect completes from the listen backlog, before the server accepts.
    connected_ = ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) | O_NONBLOCK);
    int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_.get(); }

  void send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_.get(), data.data(), data.size(), MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << "send failed";
      data.remove_prefix(static_cast<size_t>(n));
    }
  }
  // One non-blocking read; false on EOF/error.
  bool read_some() {
    char buf[64 * 1024];
    for (;;) {
      ssize_t n = ::read(fd_.get(), buf, sizeof buf);
      if (n > 0) {
        in_.append(buf, static_cast<size_t>(n));
        ++reads_;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      eof_ = true;
      return false;
    }
  }
  bool readable() const {
    pollfd p{fd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
  std::string& received() { return in_; }
  std::vector<HttpResponse> responses() const { return parse_responses(in_); }
  bool eof() const { return eof_; }
  size_t reads() const { return reads_; }

 private:
  core::UniqueFd fd_;
  std::string in_;
  bool connected_ = false;
  bool eof_ = false;
  size_t reads_ = 0;
};

class ServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    options.access_log = false;
    server_ = std::make_unique<Server>(loop_, log_, std::move(options));
    auto addr = server_->listen(core::parse_address("127.0.0.1:0").value());
    ASSERT_TRUE(addr.ok()) << addr.error().reason;
    port_ = static_cast<uint16_t>(addr->port());
  }
  void TearDown() override {
    streams_.writers.clear();
    server_.reset();
    for (int i = 0; i < 5; ++i) loop_.run_once(0);  // free destroyed connections
  }

  std::unique_ptr<Client> connect() {
    auto c = std::make_unique<Client>(port_);
    EXPECT_TRUE(c->connected());
    return c;
  }

  // Runs the loop (and reads every client) until `done` holds or `limit` passes.
  bool drive(const std::function<bool()>& done, std::chrono::milliseconds limit = 10000ms,
             std::vector<Client*> clients = {}) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      loop_.run_once(5);
      for (Client* c : clients)
        if (!c->eof()) c->read_some();
    }
    return done();
  }
  // Drives until `c` has at least `n` complete responses.
  std::vector<HttpResponse> await(Client& c, size_t n, std::chrono::milliseconds limit = 10000ms) {
    drive([&] { return c.responses().size() >= n; }, limit, {&c});
    return c.responses();
  }
  bool await_eof(Client& c, std::chrono::milliseconds limit = 10000ms) {
    return drive([&] { return c.eof(); }, limit, {&c});
  }
  // Runs the loop a little while without expecting anything (to show nothing happens).
  void settle(std::vector<Client*> clients, int rounds = 20) {
    for (int i = 0; i < rounds; ++i) {
      loop_.run_once(2);
      for (Client* c : clients)
        if (!c->eof()) c->read_some();
    }
  }

  static std::string get(std::string_view path, std::string_view host = "localhost",
                         std::string_view extra = "") {
    return "GET " + std::string(path) + " HTTP/1.1\r\nHost: " + std::string(host) + "\r\n" +
           std::string(extra) + "\r\n";
  }

  core::EventLoop loop_;
  core::Logger log_{-1, core::LogLevel::kOff};
  SlowStreams streams_;
  std::unique_ptr<Server> server_;
  uint16_t port_ = 0;
};

// --- Tests -------------------------------------------------------------------------------------

TEST_F(ServerTest, ServesOneRequest) {
  start();
  server_->publish(make_site("v1", streams_));
  auto c = connect();
  c->send(get("/version"));
  auto rs = await(*c, 1);
  ASSERT_EQ(rs.size(), 1u) << c->received();
  EXPECT_EQ(rs[0].status, 200);
  EXPECT_EQ(rs[0].body, "v1");
  EXPECT_EQ(rs[0].header("content-length"), "2");
  EXPECT_TRUE(rs[0].header("date").has_value());
  EXPECT_FALSE(rs[0].header("connection").has_value());  // HTTP/1.1 keep-alive is the default
}

TEST_F(ServerTest, PipelinedResponsesInOrderInOneBatch) {
  start();
  server_->publish(make_site("v1", streams_));
  auto c = connect();
  c->send(get("/echo/one") + get("/echo/two") +
          "POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello" +
          get("/echo/four"));
  // Wait until the server has answered (the client socket becomes readable), then read once.
  ASSERT_TRUE(drive([&] { return c->readable(); }));
  // The server read every pipelined request in one read() and answered them all in the same loop
  // iteration (one write), so the first readable moment already holds all four responses.
  char buf[64 * 1024];
  ssize_t n = ::read(c->fd(), buf, sizeof buf);
  ASSERT_GT(n, 0);
  auto rs = parse_responses(std::string_view(buf, static_cast<size_t>(n)));
  ASSERT_EQ(rs.size(), 4u) << std::string_view(buf, static_cast<size_t>(n));
  EXPECT_EQ(rs[0].body, "one");
  EXPECT_EQ(rs[1].body, "two");
  EXPECT_EQ(rs[2].body, "got 5");
  EXPECT_EQ(rs[3].body, "four");
  EXPECT_EQ(server_->stats().requests, 4u);
}

TEST_F(ServerTest, KeepAliveServesSequentialRequestsOnOneConnection) {
  start();
  server_->publish(make_site("v1", streams_));
  auto c = connect();
  for (int i = 1; i <= 5; ++i) {
    c->send(get("/echo/n" + std::to_string(i)));
    auto rs = await(*c, static_cast<size_t>(i));
    ASSERT_EQ(rs.size(), static_cast<size_t>(i)) << c->received();
    EXPECT_EQ(rs.back().body, "n" + std::to_string(i));
  }
  EXPECT_FALSE(c->eof());
  EXPECT_EQ(server_->stats().accepted, 1u);
  EXPECT_EQ(server_->stats().active, 1u);
}

TEST_F(ServerTest, Http10WithoutKeepAliveIsClosedAfterTheResponse) {
  start();
  server_->publish(make_site("v1", streams_));
  auto c = connect();
  c->send("GET /version HTTP/1.0\r\n\r\n");
  auto rs = await(*c, 1);
  ASSERT_EQ(rs.size(), 1u) << c->received();
  EXPECT_EQ(rs[0].status, 200);
  EXPECT_EQ(rs[0].header("connection"), "close");
  EXPECT_TRUE(await_eof(*c));
}

TEST_F(ServerTest, BodySplitAcrossWritesAndExpectContinue) {
  start();
  server_->publish(make_site("v1", streams_));
  auto c = connect();
  c->send(
      "POST /upload HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
      "Content-Length: 6\r\n\r\n");
  ASSERT_TRUE(drive([&] { return c->received().find("100 Continue") != std::string::npos; },
                    10000ms, {c.get()}))
      << c->received();
  c->send("abc");
  settle({c.get()}, 5);
  c->send("def");
  ASSERT_TRUE(
      drive([&] { return c->received().find("got 6") != std::string::npos; }, 10000ms, {c.get()}))
      << c->received();
}

TEST_F(ServerTest, FramingErrorIsAnsweredAndClosed) {
  start();
  server_->publish(make_site("v1", streams_));
  auto c = connect();
  c->send("GET /version HTTP/1.1\r\nHost : localhost\r\n\r\n" + get("/version"));
  auto rs = await(*c, 1);
  ASSERT_GE(rs.size(), 1u) << c->received();
  EXPECT_EQ(rs[0].status, 400);
  EXPECT_EQ(rs[0].header("connection"), "close");
  EXPECT_TRUE(await_eof(*c));
  EXPECT_EQ(c->responses().size(), 1u);  // nothing after the error was parsed
}

TEST_F(ServerTest, SiteSwapKeepsInFlightStreamOnOldSite) {
  start();
  auto old_site = make_site("old", streams_);
  std::weak_ptr<const Site> old_weak = old_site;
  server_->publish(std::move(old_site));

  auto a = connect();
  a->send(get("/slow"));
  ASSERT_TRUE(drive(
      [&] {
        return !streams_.writers.empty() && a->received().find("old-start;") != std::string::npos;
      },
      10000ms, {a.get()}))
      << a->received();
  StreamWriter* old_writer = streams_.writers.front();

  server_->publish(make_site("new", streams_));
  EXPECT_FALSE(old_weak.expired()) << "the in-flight request must keep its site alive";

  // A new connection sees the new site while the old stream is still running.
  auto b = connect();
  b->send(get("/version"));
  auto rb = await(*b, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].body, "new");

  // The old stream finishes with old content.
  old_writer->write("old-more;");
  old_writer->end();
  streams_.writers.clear();
  auto ra = await(*a, 1);
  ASSERT_EQ(ra.size(), 1u) << a->received();
  EXPECT_EQ(ra[0].status, 200);
  EXPECT_EQ(ra[0].header("transfer-encoding"), "chunked");
  EXPECT_EQ(ra[0].body, "old-start;old-more;");

  // The next request on the same connection sees the new site.
  a->send(get("/version"));
  ra = await(*a, 2);
  ASSERT_EQ(ra.size(), 2u) << a->received();
  EXPECT_EQ(ra[1].body, "new");
  settle({a.get(), b.get()}, 5);
  EXPECT_TRUE(old_weak.expired()) << "nothing serves the old site any more";
}

TEST_F(ServerTest, RequestsBeforePublishWaitThenAreServed) {
  start();
  auto c = connect();
  c->send(get("/echo/early") + get("/echo/second"));
  settle({c.get()}, 30);
  EXPECT_TRUE(c->received().empty()) << c->received();
  EXPECT_FALSE(c->eof());
  server_->publish(make_site("v1", streams_));
  auto rs = await(*c, 2);
  ASSERT_EQ(rs.size(), 2u) << c->received();
  EXPECT_EQ(rs[0].status, 200);
  EXPECT_EQ(rs[0].body, "early");
  EXPECT_EQ(rs[1].body, "second");
}

TEST_F(ServerTest, ReadyTimeoutGives503) {
  start({.ready_timeout_ms = 100});
  auto c = connect();
  auto t0 = std::chrono::steady_clock::now();
  c->send(get("/version"));
  auto rs = await(*c, 1);
  ASSERT_EQ(rs.size(), 1u) << c->received();
  EXPECT_EQ(rs[0].status, 503);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);
  EXPECT_TRUE(await_eof(*c));
  // A site published later serves new connections.
  server_->publish(make_site("v1", streams_));
  auto d = connect();
  d->send(get("/version"));
  auto rd = await(*d, 1);
  ASSERT_EQ(rd.size(), 1u);
  EXPECT_EQ(rd[0].status, 200);
}

TEST_F(ServerTest, GracefulCloseClosesIdleAtOnceAndLetsBusyFinish) {
  start();
  server_->publish(make_site("v1", streams_));
  auto idle = connect();
  idle->send(get("/version"));
  ASSERT_EQ(await(*idle, 1).size(), 1u);
  auto busy = connect();
  busy->send(get("/slow"));
  ASSERT_TRUE(drive([&] { return !streams_.writers.empty(); }, 10000ms, {busy.get()}));
  ASSERT_EQ(server_->stats().active, 2u);

  bool done = false;
  server_->close([&] { done = true; });
  EXPECT_TRUE(server_->closing());
  EXPECT_TRUE(await_eof(*idle, 5000ms)) << "an idle keep-alive connection closes at once";
  settle({busy.get()}, 10);
  EXPECT_FALSE(busy->eof());
  EXPECT_FALSE(done);

  // New connections are no longer accepted.
  auto late = std::make_unique<Client>(port_);
  EXPECT_FALSE(late->connected());

  streams_.writers.front()->write("tail;");
  streams_.writers.front()->end();
  streams_.writers.clear();
  auto rs = await(*busy, 1);
  ASSERT_EQ(rs.size(), 1u) << busy->received();
  EXPECT_EQ(rs[0].body, "v1-start;tail;");
  EXPECT_TRUE(await_eof(*busy));
  // The server half-closed and lingers (reading what the client still sends) until the client
  // closes too; then the close is complete.
  busy.reset();
  EXPECT_TRUE(drive([&] { return done; }, 5000ms));
  EXPECT_EQ(server_->stats().active, 0u);
}

TEST_F(ServerTest, GracefulCloseTimeoutClosesBusyConnections) {
  start({.close_timeout_ms = 100});
  server_->publish(make_site("v1", streams_));
  auto busy = connect();
  busy->send(get("/slow"));
  ASSERT_TRUE(drive([&] { return !streams_.writers.empty(); }, 10000ms, {busy.get()}));
  bool done = false;
  server_->close([&] { done = true; });
  EXPECT_TRUE(drive([&] { return done && busy->eof(); }, 10000ms, {busy.get()}));
  EXPECT_EQ(streams_.aborted, 1u);
}

TEST_F(ServerTest, RemovedAllowedHostClosesItsConnections) {
  start();
  server_->publish(make_site("v1", streams_));
  auto allow = [](std::vector<std::string> hosts) {
    auto p = std::make_shared<AdmissionPolicy>();
    p->allowed_hosts = std::move(hosts);
    return std::shared_ptr<const AdmissionPolicy>(std::move(p));
  };
  server_->set_policy(allow({"example.com", "other.test"}));

  auto ex = connect();
  ex->send(get("/version", "example.com"));
  ASSERT_EQ(await(*ex, 1).size(), 1u) << ex->received();
  EXPECT_EQ(ex->responses()[0].status, 200);
  auto other = connect();
  other->send(get("/version", "other.test:8080"));
  ASSERT_EQ(await(*other, 1).size(), 1u);
  auto local = connect();
  local->send(get("/version", "localhost"));
  ASSERT_EQ(await(*local, 1).size(), 1u);

  server_->set_policy(allow({"other.test"}));
  EXPECT_TRUE(await_eof(*ex)) << "admitted under example.com, which is no longer allowed";
  settle({other.get(), local.get()}, 10);
  EXPECT_FALSE(other->eof());
  EXPECT_FALSE(local->eof());

  // A request for the removed host on a new connection is refused.
  auto again = connect();
  again->send(get("/version", "example.com"));
  auto rs = await(*again, 1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, 403);
  // The remaining connections are still served.
  other->send(get("/echo/still", "other.test:8080"));
  ASSERT_EQ(await(*other, 2).size(), 2u);
  EXPECT_EQ(other->responses()[1].body, "still");
}

TEST_F(ServerTest, RemovedHostLetsABusyResponseFinishFirst) {
  start();
  server_->publish(make_site("v1", streams_));
  auto p = std::make_shared<AdmissionPolicy>();
  p->allowed_hosts = {"example.com"};
  server_->set_policy(p);
  auto c = connect();
  c->send(get("/slow", "example.com"));
  ASSERT_TRUE(drive([&] { return !streams_.writers.empty(); }, 10000ms, {c.get()}));
  server_->set_policy(std::make_shared<AdmissionPolicy>());
  settle({c.get()}, 10);
  EXPECT_FALSE(c->eof());
  streams_.writers.front()->end();
  streams_.writers.clear();
  auto rs = await(*c, 1);
  ASSERT_EQ(rs.size(), 1u) << c->received();
  EXPECT_EQ(rs[0].body, "v1-start;");
  EXPECT_TRUE(await_eof(*c));
}

TEST_F(ServerTest, MaxConnectionsRefusesTheExtraOne) {
  start({.max_connections = 2});
  server_->publish(make_site("v1", streams_));
  auto a = connect();
  auto b = connect();
  ASSERT_TRUE(drive([&] { return server_->stats().active == 2; }));
  auto extra = connect();
  auto rs = await(*extra, 1);
  ASSERT_EQ(rs.size(), 1u) << extra->received();
  EXPECT_EQ(rs[0].status, 503);
  EXPECT_TRUE(await_eof(*extra));
  EXPECT_EQ(server_->stats().refused, 1u);

  a->send(get("/echo/a"));
  b->send(get("/echo/b"));
  ASSERT_EQ(await(*a, 1).size(), 1u);
  ASSERT_EQ(await(*b, 1).size(), 1u);
  EXPECT_EQ(a->responses()[0].body, "a");
  EXPECT_EQ(b->responses()[0].body, "b");

  // A slot freed is a slot usable again.
  a.reset();
  ASSERT_TRUE(drive([&] { return server_->stats().active == 1; }));
  auto c = connect();
  c->send(get("/echo/c"));
  auto rc = await(*c, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].body, "c");
}

TEST_F(ServerTest, RouteHeadersAreJudgedOnceBeforeTheyReachTheWire) {
  // The response plan (http/response_plan.h) refuses a header that could split the head (500,
  // the connection goes on) and drops the framing and connection fields a route may not set.
  start();
  SiteBuilder b;
  b.route("GET /split", [](Request&) {
    Response r = Response::text("secret");
    r.header("X-Injected", "a\r\nSet-Cookie: evil=1");
    return r;
  });
  b.route("GET /framing", [](Request&) {
    Response r = Response::text("hi");
    r.header("Transfer-Encoding", "chunked");
    r.header("Content-Length", "99");
    r.header("Connection", "close");
    r.header("X-Kept", "1");
    return r;
  });
  auto site = b.build();
  ASSERT_TRUE(site.ok());
  server_->publish(site.value());
  auto c = connect();
  c->send(get("/split") + get("/framing") + get("/framing"));
  auto rs = await(*c, 3);
  ASSERT_EQ(rs.size(), 3u) << c->received();
  EXPECT_EQ(rs[0].status, 500);
  EXPECT_EQ(rs[0].body, "Internal Server Error\n");
  EXPECT_FALSE(rs[0].header("set-cookie"));
  EXPECT_FALSE(rs[0].header("x-injected"));
  EXPECT_EQ(rs[1].status, 200);
  EXPECT_EQ(rs[1].body, "hi");
  EXPECT_EQ(rs[1].header("content-length"), "2");
  EXPECT_FALSE(rs[1].header("transfer-encoding"));
  EXPECT_FALSE(rs[1].header("connection"));
  EXPECT_EQ(rs[1].header("x-kept"), "1");
  EXPECT_EQ(rs[2].body, "hi");
  EXPECT_EQ(c->received().find("secret"), std::string::npos);
  EXPECT_FALSE(c->eof());

  // HEAD: the 500's length, and no body.
  auto h = connect();
  h->send("HEAD /split HTTP/1.1\r\nHost: localhost\r\n\r\n");
  ASSERT_TRUE(drive([&] { return h->received().find("\r\n\r\n") != std::string::npos; }, 10000ms,
                    {h.get()}));
  settle({h.get()});
  EXPECT_EQ(h->received().rfind("HTTP/1.1 500 ", 0), 0u) << h->received();
  EXPECT_NE(h->received().find("Content-Length: 22\r\n"), std::string::npos);
  EXPECT_EQ(h->received().size(), h->received().find("\r\n\r\n") + 4) << h->received();
}

TEST(ServerHandleRequest, AdmissionThenSiteWithoutASocket) {
  SlowStreams streams;
  auto site = make_site("v1", streams);
  AdmissionPolicy policy;
  policy.allowed_hosts = {"example.com"};
  auto peer = core::parse_address("127.0.0.1:40000").value();

  auto make = [](std::string_view method, std::string_view target, std::string_view host) {
    Request req;
    req.method_name = method;
    req.method = parse_method(method);
    req.target = target;
    if (!host.empty()) req.headers.add("Host", host);
    return req;
  };

  Request ok = make("GET", "/echo/hi%20there", "example.com");
  Response r = handle_request(policy, *site, ok, peer);
  EXPECT_EQ(r.status, 200);
  ASSERT_TRUE(std::holds_alternative<std::string>(r.body));
  EXPECT_EQ(std::get<std::string>(r.body), "hi there");
  EXPECT_EQ(ok.host, "example.com");
  EXPECT_EQ(ok.remote_address, "127.0.0.1");

  Request evil = make("GET", "/version", "evil.test");
  EXPECT_EQ(handle_request(policy, *site, evil, peer).status, 403);
  Request trace = make("TRACE", "/version", "example.com");
  EXPECT_EQ(handle_request(policy, *site, trace, peer).status, 501);
  Request dots = make("GET", "/echo/../version", "localhost");
  EXPECT_EQ(handle_request(policy, *site, dots, peer).status, 400);
  Request missing = make("GET", "/nope", "localhost");
  EXPECT_EQ(handle_request(policy, *site, missing, peer).status, 404);
  Request wrong_method = make("DELETE", "/version", "localhost");
  EXPECT_EQ(handle_request(policy, *site, wrong_method, peer).status, 405);
}

}  // namespace
}  // namespace corral::http
