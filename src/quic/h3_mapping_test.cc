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

std::optional<std::string> field(const FieldList& f, std::string_view name) {
  for (const auto& [k, v] : f)
    if (k == name) return v;
  return std::nullopt;
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

TEST(ResponseHead, DefaultsLikeTheTcpConnection) {
  http::Response r = http::Response::text("hi");
  r.header("X-Custom", "1");
  r.header("Connection", "close");  // connection-specific: never over h3
  r.header("Bad", "a\r\nb");
  HeadDefaults d;
  d.date = "Mon, 30 Nov 2026 00:00:00 GMT";
  FieldList f;
  response_head(200, r, r.content_type(), 2, nullptr, {}, d, f);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].first, ":status");
  EXPECT_EQ(f[0].second, "200");
  EXPECT_EQ(field(f, "server"), "corral");
  EXPECT_EQ(field(f, "date"), d.date);
  EXPECT_EQ(field(f, "content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(field(f, "content-length"), "2");
  EXPECT_EQ(field(f, "x-content-type-options"), "nosniff");
  EXPECT_EQ(field(f, "referrer-policy"), "strict-origin-when-cross-origin");
  EXPECT_EQ(field(f, "x-custom"), "1");
  EXPECT_FALSE(field(f, "connection"));
  EXPECT_FALSE(field(f, "bad"));
  for (const auto& [k, v] : f)
    for (char c : k) EXPECT_FALSE(c >= 'A' && c <= 'Z') << k;
}

TEST(ResponseHead, HtmlGetsTheCspNonce) {
  http::Response r = http::Response::html("<p>x</p>");
  FieldList f;
  response_head(200, r, r.content_type(), 8, nullptr, "abc123", {}, f);
  auto csp = field(f, "content-security-policy");
  ASSERT_TRUE(csp);
  EXPECT_NE(csp->find("'nonce-abc123'"), std::string::npos);

  http::Response own = http::Response::html("<p>x</p>");
  own.header("Content-Security-Policy", "default-src 'none'");
  response_head(200, own, own.content_type(), 8, nullptr, "abc123", {}, f);
  EXPECT_EQ(field(f, "content-security-policy"), "default-src 'none'");

  http::Response text = http::Response::text("x");
  response_head(200, text, text.content_type(), 1, nullptr, "abc123", {}, f);
  EXPECT_FALSE(field(f, "content-security-policy"));
}

TEST(ResponseHead, NoLengthForUnknownStreams) {
  http::Response r = http::Response::status_only(204);
  FieldList f;
  response_head(204, r, {}, -1, nullptr, {}, {}, f);
  EXPECT_FALSE(field(f, "content-length"));
  EXPECT_FALSE(field(f, "content-type"));
}

class FilePlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/h3planXXXXXX";
    root_ = mkdtemp(tmpl);
    std::ofstream(root_ + "/f.txt") << "0123456789abcdefghij";  // 20 bytes
    req_.method = http::Method::kGet;
    req_.method_name = "GET";
    req_.target = req_.path = "/f.txt";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  http::ResolvedFile resolve() {
    http::FileSpec spec;
    spec.root = root_;
    spec.path = "f.txt";
    return http::resolve_file(req_, spec);
  }
  std::string root_;
  http::Request req_;
};

TEST_F(FilePlanTest, WholeFile) {
  auto f = resolve();
  auto p = plan_file(f, false);
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.length, 20);
  ASSERT_EQ(p.segments.size(), 1u);
  EXPECT_EQ(p.segments[0].offset, 0u);
  EXPECT_EQ(p.segments[0].length, 20u);
  EXPECT_TRUE(p.has_body);
  auto head = plan_file(resolve(), true);
  EXPECT_EQ(head.length, 20);
  EXPECT_FALSE(head.has_body);
  EXPECT_TRUE(head.segments.empty());
}

TEST_F(FilePlanTest, SingleRange) {
  req_.headers.add("Range", "bytes=5-9");
  auto p = plan_file(resolve(), false);
  EXPECT_EQ(p.status, 206);
  EXPECT_EQ(p.length, 5);
  ASSERT_EQ(p.segments.size(), 1u);
  EXPECT_EQ(p.segments[0].offset, 5u);
  EXPECT_EQ(p.segments[0].length, 5u);
  bool found = false;
  for (const auto& [k, v] : p.extra)
    if (k == "Content-Range") found = v == "bytes 5-9/20";
  EXPECT_TRUE(found);
}

TEST_F(FilePlanTest, MultipleRanges) {
  req_.headers.add("Range", "bytes=0-1,10-11");
  auto p = plan_file(resolve(), false);
  EXPECT_EQ(p.status, 206);
  EXPECT_EQ(p.content_type.rfind("multipart/byteranges; boundary=", 0), 0u);
  ASSERT_EQ(p.segments.size(), 5u);  // head, range, head, range, tail
  uint64_t total = 0;
  for (const auto& s : p.segments) total += s.text.empty() ? s.length : s.text.size();
  EXPECT_EQ(static_cast<int64_t>(total), p.length);
  EXPECT_EQ(p.segments[3].offset, 10u);
}

TEST_F(FilePlanTest, UnsatisfiableRangeIs416WithoutBody) {
  req_.headers.add("Range", "bytes=100-200");
  auto p = plan_file(resolve(), false);
  EXPECT_EQ(p.status, 416);
  EXPECT_EQ(p.length, 0);
  EXPECT_FALSE(p.has_body);
}

TEST_F(FilePlanTest, IfRangeMismatchServesWholeFile) {
  req_.headers.add("Range", "bytes=5-9");
  req_.headers.add("If-Range", "\"not-the-etag\"");
  auto p = plan_file(resolve(), false);
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.length, 20);
}

TEST_F(FilePlanTest, NotModified) {
  auto etag = [&] {
    auto f = resolve();
    for (const auto& [k, v] : f.headers)
      if (k == "ETag") return v;
    return std::string();
  }();
  req_.headers.add("If-None-Match", etag);
  auto p = plan_file(resolve(), false);
  EXPECT_EQ(p.status, 304);
  EXPECT_EQ(p.length, -1);
  EXPECT_FALSE(p.has_body);
}

TEST_F(FilePlanTest, MissingIs404WithText) {
  http::FileSpec spec;
  spec.root = root_;
  spec.path = "nope";
  auto p = plan_file(http::resolve_file(req_, spec), false);
  EXPECT_EQ(p.status, 404);
  ASSERT_EQ(p.segments.size(), 1u);
  EXPECT_EQ(p.segments[0].text, "Not Found\n");
  EXPECT_EQ(p.length, 10);
}

}  // namespace
}  // namespace corral::quic
