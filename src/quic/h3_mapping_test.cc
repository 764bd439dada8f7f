#include "quic/h3_mapping.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "http/file_response.h"

namespace corral::quic {
namespace {

using P = RequestHead::Pseudo;

RequestHead get(std::string_view path, std::string_view authority = "localhost:4433") {
  RequestHead h;
  h.add(P::kMethod, ":method", "GET");
  h.add(P::kScheme, ":scheme", "https");
  h.add(P::kAuthority, ":authority", authority);
  h.add(P::kPath, ":path", path);
  return h;
}

TEST(RequestHead, MapsPseudoHeadersLikeTheHttp11Parser) {
  RequestHead h = get("/a/b?x=1&y");
  h.add(P::kNone, "accept", "text/plain");
  h.add(P::kNone, "cookie", "a=1");
  http::Request req;
  ASSERT_EQ(h.build(req, {}), 0);
  EXPECT_EQ(req.method, http::Method::kGet);
  EXPECT_EQ(req.method_name, "GET");
  EXPECT_EQ(req.target, "/a/b?x=1&y");
  EXPECT_EQ(req.path, "/a/b");
  EXPECT_EQ(req.query, "x=1&y");
  EXPECT_EQ(req.header("Host"), "localhost:4433");
  EXPECT_EQ(req.header("accept"), "text/plain");
  EXPECT_EQ(req.headers.size(), 3u);
  EXPECT_EQ(req.version_major, 3);
}

TEST(RequestHead, NoQuery) {
  RequestHead h = get("/plain");
  http::Request req;
  ASSERT_EQ(h.build(req, {}), 0);
  EXPECT_EQ(req.path, "/plain");
  EXPECT_TRUE(req.query.empty());
}

TEST(RequestHead, MissingPseudoHeadersAre400) {
  {
    RequestHead h;
    h.add(P::kMethod, ":method", "GET");
    h.add(P::kScheme, ":scheme", "https");
    http::Request req;
    EXPECT_EQ(h.build(req, {}), 400);  // no :path
  }
  {
    RequestHead h;
    h.add(P::kPath, ":path", "/");
    http::Request req;
    EXPECT_EQ(h.build(req, {}), 400);  // no :method
  }
  {
    RequestHead h = get("/");
    h.add(P::kPath, ":path", "/again");
    http::Request req;
    EXPECT_EQ(h.build(req, {}), 400);  // duplicated
  }
  {
    RequestHead h;
    h.add(P::kMethod, ":method", "GET");
    h.add(P::kNone, "accept", "*/*");
    h.add(P::kPath, ":path", "/");  // after a regular field
    h.add(P::kScheme, ":scheme", "https");
    http::Request req;
    EXPECT_EQ(h.build(req, {}), 400);
  }
  {
    RequestHead h = get("/");
    h.add(P::kUnknown, ":bogus", "x");
    http::Request req;
    EXPECT_EQ(h.build(req, {}), 400);
  }
}

TEST(RequestHead, ConnectGoesToAdmission) {
  // CONNECT has no :path or :scheme; admission refuses the method (501), as over TCP.
  RequestHead h;
  h.add(P::kMethod, ":method", "CONNECT");
  h.add(P::kAuthority, ":authority", "example.com:443");
  http::Request req;
  EXPECT_EQ(h.build(req, {}), 0);
  EXPECT_EQ(req.method, http::Method::kConnect);
}

TEST(RequestHead, HostAndAuthority) {
  RequestHead same = get("/");
  same.add(P::kNone, "host", "localhost:4433");
  http::Request req;
  ASSERT_EQ(same.build(req, {}), 0);
  EXPECT_EQ(req.headers.count("host"), 1u);

  RequestHead differs = get("/");
  differs.add(P::kNone, "host", "evil.example");
  http::Request req2;
  ASSERT_EQ(differs.build(req2, {}), 0);
  EXPECT_EQ(req2.headers.count("host"), 2u);  // admission answers 400 (duplicate Host)
}

TEST(RequestHead, Limits) {
  RequestHead h = get("/");
  for (int i = 0; i < 5; ++i) h.add(P::kNone, "x-a", std::string(100, 'v'));
  http::Request req;
  RequestHead::Limits small;
  small.max_fields = 4;
  EXPECT_EQ(h.build(req, small), 431);
  RequestHead::Limits bytes;
  bytes.max_bytes = 300;
  EXPECT_EQ(h.build(req, bytes), 431);
  EXPECT_EQ(h.field("X-A"), std::string(100, 'v'));
}

http::PlanContext h3_context() {
  http::PlanContext c;
  c.protocol = http::Protocol::kHttp3;
  c.date = "Mon, 30 Nov 2026 00:00:00 GMT";
  return c;
}

http::Request get_request(http::Method m = http::Method::kGet) {
  http::Request req;
  req.method = m;
  req.method_name = http::method_name(m);
  req.target = req.path = "/x";
  return req;
}

TEST(H3Head, DefaultsLikeTheTcpConnection) {
  http::Response r = http::Response::text("hi");
  r.header("X-Custom", "1");
  r.header("Connection", "close");  // connection-specific: never over h3
  http::Request req = get_request();
  http::ResponsePlan plan;
  http::plan_response(r, req, h3_context(), plan);
  H3Head f(plan);
  ASSERT_GT(f.size(), 0u);
  EXPECT_EQ(f.name(0), ":status");
  EXPECT_EQ(f.value(0), "200");
  EXPECT_EQ(f.field("server"), "corral");
  EXPECT_EQ(f.field("date"), "Mon, 30 Nov 2026 00:00:00 GMT");
  EXPECT_EQ(f.field("content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(f.field("content-length"), "2");
  EXPECT_EQ(f.field("x-content-type-options"), "nosniff");
  EXPECT_EQ(f.field("referrer-policy"), "strict-origin-when-cross-origin");
  EXPECT_EQ(f.field("x-custom"), "1");
  EXPECT_FALSE(f.field("connection"));
  EXPECT_FALSE(f.field("transfer-encoding"));
  for (size_t i = 0; i < f.size(); ++i)
    for (char c : f.name(i)) EXPECT_FALSE(c >= 'A' && c <= 'Z') << f.name(i);
  // content-length sits where HTTP/1.1 writes its framing: right after content-type.
  for (size_t i = 0; i + 1 < f.size(); ++i)
    if (f.name(i) == "content-type") {
      EXPECT_EQ(f.name(i + 1), "content-length");
    }
}

TEST(H3Head, AnUnsafeHeaderIs500) {
  http::Response r = http::Response::text("hi");
  r.header("Bad", "a\r\nb");
  http::Request req = get_request();
  http::ResponsePlan plan;
  http::plan_response(r, req, h3_context(), plan);
  H3Head f(plan);
  EXPECT_EQ(f.value(0), "500");
  EXPECT_FALSE(f.field("bad"));
  EXPECT_EQ(f.field("content-length"), "22");  // "Internal Server Error\n"
}

TEST(H3Head, HtmlGetsTheCspNonce) {
  http::Response r = http::Response::html("<p>x</p>");
  http::Request req = get_request();
  http::ResponsePlan plan;
  http::plan_response(r, req, h3_context(), plan);
  H3Head f(plan);
  auto csp = f.field("content-security-policy");
  ASSERT_TRUE(csp);
  EXPECT_NE(csp->find("'nonce-" + std::string(req.csp_nonce()) + "'"), std::string::npos);

  http::Response own = http::Response::html("<p>x</p>");
  own.header("Content-Security-Policy", "default-src 'none'");
  http::ResponsePlan own_plan;
  http::plan_response(own, req, h3_context(), own_plan);
  EXPECT_EQ(H3Head(own_plan).field("content-security-policy"), "default-src 'none'");
}

TEST(H3Head, NoLengthFor204OrUnknownStreams) {
  http::Response r = http::Response::status_only(204);
  http::Request req = get_request();
  http::ResponsePlan plan;
  http::plan_response(r, req, h3_context(), plan);
  H3Head f(plan);
  EXPECT_EQ(f.value(0), "204");
  EXPECT_FALSE(f.field("content-length"));
  EXPECT_FALSE(f.field("content-type"));

  class Idle final : public http::StreamProducer {
   public:
    void on_start(http::StreamWriter&) override {}
  };
  http::Response s = http::Response::stream(std::make_unique<Idle>());
  http::ResponsePlan stream_plan;
  http::plan_response(s, req, h3_context(), stream_plan);
  H3Head sf(stream_plan);
  EXPECT_FALSE(sf.field("content-length"));
  EXPECT_FALSE(sf.field("transfer-encoding"));
}

TEST(H3Head, AFileRangeKeepsItsFieldsAfterThePlanIsGone) {
  char tmpl[] = "/tmp/h3headXXXXXX";
  std::string root = mkdtemp(tmpl);
  std::ofstream(root + "/f.txt") << "0123456789abcdefghij";
  http::Request req = get_request();
  req.target = req.path = "/f.txt";
  req.headers.add("Range", "bytes=5-9");
  http::FileSpec spec;
  spec.root = root;
  spec.path = "f.txt";
  http::Response r = http::Response::file(std::move(spec));
  std::optional<H3Head> head;
  {
    http::ResponsePlan plan;
    http::plan_response(r, req, h3_context(), plan);
    head.emplace(plan);
  }
  EXPECT_EQ(head->value(0), "206");
  EXPECT_EQ(head->field("content-length"), "5");
  EXPECT_EQ(head->field("content-range"), "bytes 5-9/20");
  EXPECT_EQ(head->field("accept-ranges"), "bytes");
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace corral::quic
