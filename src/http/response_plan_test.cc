#include "http/response_plan.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "http/h1_writer.h"

namespace corral::http {
namespace {

PlanContext ctx(Protocol p = Protocol::kHttp1) {
  PlanContext c;
  c.protocol = p;
  c.date = "Mon, 30 Nov 2026 00:00:00 GMT";
  return c;
}

Request get(Method m = Method::kGet) {
  Request req;
  req.method = m;
  req.method_name = method_name(m);
  req.target = req.path = "/x";
  return req;
}

std::string h1(const ResponsePlan& plan, bool http10 = false) {
  core::Buffer out;
  write_h1_head(plan, http10, out);
  return std::string(out.view());
}

class Producer final : public StreamProducer {
 public:
  void on_start(StreamWriter& w) override { w.end(); }
};

class Deferred final : public DeferredProducer {
 public:
  void start(Responder&) override {}
};

class Handler final : public UpgradeHandler {
 public:
  void take_over(UpgradeContext) override {}
};

TEST(ResponsePlan, TextIsOwnedBytesWithItsLengthAndTheDefaults) {
  Response r = Response::text("hello");
  r.header("X-Custom", "1");
  Request req = get();
  ResponsePlan plan;
  plan_response(r, req, ctx(), plan);
  EXPECT_EQ(plan.status, 200);
  EXPECT_EQ(plan.body, BodyKind::kBytes);
  EXPECT_EQ(plan.bytes, "hello");
  EXPECT_EQ(plan.content_length, 5u);
  EXPECT_TRUE(plan.send_body);
  EXPECT_FALSE(plan.close);
  EXPECT_EQ(plan.fields.find("server"), "corral");
  EXPECT_EQ(plan.fields.find("date"), "Mon, 30 Nov 2026 00:00:00 GMT");
  EXPECT_EQ(plan.fields.find("content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(plan.fields.find("x-content-type-options"), "nosniff");
  EXPECT_EQ(plan.fields.find("referrer-policy"), "strict-origin-when-cross-origin");
  EXPECT_EQ(plan.fields.find("x-custom"), "1");
  EXPECT_FALSE(plan.fields.find("alt-svc"));
  EXPECT_FALSE(plan.fields.find("content-security-policy"));
  EXPECT_EQ(plan.take_bytes(), "hello");
}

TEST(ResponsePlan, Http1HeadIsByteForByteTheOldOne) {
  Response r = Response::text("hello");
  Request req = get();
  PlanContext c = ctx();
  c.alt_svc = "h3=\":4433\"";
  ResponsePlan plan;
  plan_response(r, req, c, plan);
  EXPECT_EQ(h1(plan),
            "HTTP/1.1 200 OK\r\nServer: corral\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\n"
            "Alt-Svc: h3=\":4433\"\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: 5\r\nX-Content-Type-Options: nosniff\r\n"
            "Referrer-Policy: strict-origin-when-cross-origin\r\n\r\n");
  std::string old10 = h1(plan, true);
  EXPECT_EQ(old10.rfind("HTTP/1.0 200 OK\r\n", 0), 0u);
  EXPECT_NE(old10.find("Content-Length: 5\r\nConnection: keep-alive\r\n"), std::string::npos);
}

TEST(ResponsePlan, CloseComesFromTheContext) {
  Response r = Response::text("x");
  Request req = get();
  PlanContext c = ctx();
  c.keep_alive = false;
  ResponsePlan plan;
  plan_response(r, req, c, plan);
  EXPECT_TRUE(plan.close);
  EXPECT_NE(h1(plan).find("Connection: close\r\n"), std::string::npos);
}

TEST(ResponsePlan, HeadAnnouncesTheLengthAndSendsNothing) {
  Response r = Response::text("hello");
  Request req = get(Method::kHead);
  ResponsePlan plan;
  plan_response(r, req, ctx(), plan);
  EXPECT_EQ(plan.content_length, 5u);
  EXPECT_FALSE(plan.send_body);
}

TEST(ResponsePlan, NoBodyStatusesHaveNoLengthAndNoBody) {
  for (int status : {204, 304, 100}) {
    Response r = Response::text("ignored", status);
    Request req = get();
    ResponsePlan plan;
    plan_response(r, req, ctx(), plan);
    EXPECT_EQ(plan.status, status);
    EXPECT_FALSE(plan.content_length) << status;
    EXPECT_FALSE(plan.send_body) << status;
    EXPECT_EQ(h1(plan).find("Content-Length"), std::string::npos) << status;
  }
}

TEST(ResponsePlan, EmptyBodyIsLengthZeroAndRelayedHeadKeepsItsLength) {
  Response redirect = Response::redirect("/there");
  Request req = get();
  ResponsePlan plan;
  plan_response(redirect, req, ctx(), plan);
  EXPECT_EQ(plan.status, 302);
  EXPECT_EQ(plan.body, BodyKind::kNone);
  EXPECT_EQ(plan.content_length, 0u);
  EXPECT_EQ(plan.fields.find("location"), "/there");

  // A proxy answering HEAD passes the upstream's Content-Length: announced once, instead of 0.
  Response head;
  head.header("Content-Length", "7");
  Request head_req = get(Method::kHead);
  ResponsePlan head_plan;
  plan_response(head, head_req, ctx(), head_plan);
  EXPECT_EQ(head_plan.content_length, 7u);
  std::string out = h1(head_plan);
  EXPECT_NE(out.find("Content-Length: 7\r\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("Content-Length: 0"), std::string::npos) << out;

  // To a GET the same description has no body: its Content-Length is 0 whatever the route said.
  Response lie;
  lie.header("Content-Length", "7");
  Request get_req = get();
  ResponsePlan lie_plan;
  plan_response(lie, get_req, ctx(), lie_plan);
  EXPECT_EQ(lie_plan.content_length, 0u);
  EXPECT_FALSE(lie_plan.fields.find("content-length"));
}

TEST(ResponsePlan, HtmlGetsTheCspNonceUnlessTheRouteSetsOne) {
  Response r = Response::html("<p>x</p>");
  Request req = get();
  ResponsePlan plan;
  plan_response(r, req, ctx(), plan);
  ASSERT_TRUE(req.has_csp_nonce());
  auto csp = plan.fields.find("content-security-policy");
  ASSERT_TRUE(csp);
  EXPECT_NE(csp->find("'nonce-" + std::string(req.csp_nonce()) + "'"), std::string::npos);
  EXPECT_NE(csp->find("frame-ancestors 'self'"), std::string::npos);  // not truncated

  Response own = Response::html("<p>x</p>");
  own.header("Content-Security-Policy", "default-src 'none'");
  Request req2 = get();
  ResponsePlan own_plan;
  plan_response(own, req2, ctx(), own_plan);
  EXPECT_EQ(own_plan.fields.find("content-security-policy"), "default-src 'none'");
}

TEST(ResponsePlan, StreamOfUnknownLengthIsChunkedOrCloseDelimited) {
  Response r = Response::stream(std::make_unique<Producer>(), "text/event-stream");
  Request req = get();
  ResponsePlan plan;
  plan_response(r, req, ctx(), plan);
  EXPECT_EQ(plan.body, BodyKind::kStream);
  ASSERT_TRUE(plan.producer);
  EXPECT_FALSE(plan.content_length);
  EXPECT_TRUE(plan.send_body);
  EXPECT_EQ(plan.fields.find("content-type"), "text/event-stream");
  core::Buffer out;
  H1Framing f = write_h1_head(plan, false, out);
  EXPECT_TRUE(f.chunked);
  EXPECT_FALSE(f.close);
  EXPECT_NE(out.view().find("Transfer-Encoding: chunked\r\n"), std::string::npos);
  core::Buffer out10;
  H1Framing f10 = write_h1_head(plan, true, out10);
  EXPECT_FALSE(f10.chunked);
  EXPECT_TRUE(f10.close);
  EXPECT_NE(out10.view().find("Connection: close\r\n"), std::string::npos);

  Response sized = Response::stream(std::make_unique<Producer>(), "text/plain", 42);
  ResponsePlan sized_plan;
  plan_response(sized, req, ctx(), sized_plan);
  EXPECT_EQ(sized_plan.content_length, 42u);
  core::Buffer sized_out;
  EXPECT_FALSE(write_h1_head(sized_plan, false, sized_out).chunked);
  EXPECT_NE(sized_out.view().find("Content-Length: 42\r\n"), std::string::npos);

  Request head = get(Method::kHead);
  Response unsent = Response::stream(std::make_unique<Producer>());
  ResponsePlan head_plan;
  plan_response(unsent, head, ctx(), head_plan);
  EXPECT_FALSE(head_plan.send_body);
  core::Buffer head_out;
  EXPECT_FALSE(write_h1_head(head_plan, false, head_out).chunked);  // no body, no coding
}

TEST(ResponsePlan, H1HeadCopiesPiecesOfEveryLength) {
  // write_h1_head copies short pieces with fixed-size moves by length class (0-3, 4-7, 8-16,
  // 17-32, longer): every length comes out whole.
  Request req = get();
  Response r = Response::text("hello");
  std::vector<std::string> names, values;
  for (size_t n = 1; n <= 70; ++n) {
    std::string name = "X-" + std::string(n, static_cast<char>('a' + n % 26));
    std::string value;
    for (size_t i = 0; i < n - 1; ++i) value += static_cast<char>('0' + i % 10);
    names.push_back(name);
    values.push_back(value);
    r.header(name, value);
  }
  ResponsePlan plan;
  plan_response(r, req, ctx(), plan);
  std::string head = h1(plan);
  std::string expected;
  for (size_t i = 0; i < names.size(); ++i) expected += names[i] + ": " + values[i] + "\r\n";
  EXPECT_NE(head.find(expected), std::string::npos) << head;
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\nServer: corral\r\n", 0), 0u) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n");
}

TEST(ResponsePlan, ResetPlanIsLikeAFreshOne) {
  // A connection keeps one plan and resets it between responses: after a 101, a deferred, a
  // stream and a refused header, the next plan is the one a fresh plan would give.
  Request req = get();
  ResponsePlan kept;
  std::vector<Response> before;
  before.push_back(Response::stream(std::make_unique<Producer>(), "text/event-stream"));
  before.push_back(Response::deferred(std::make_unique<Deferred>()));
  Response bad = Response::text("x");
  bad.header("X-Bad", "a\r\nb");
  before.push_back(std::move(bad));
  Response big = Response::text(std::string(100000, 'b'), 201);
  big.header("X-Big", "1");
  before.push_back(std::move(big));
  for (Response& r : before) {
    kept.reset();
    plan_response(r, req, ctx(), kept);
  }
  kept.reset();
  EXPECT_EQ(kept.owned_bytes.capacity(), std::string().capacity());  // the big body is freed
  Response r = Response::text("hello");
  r.header("X-Custom", "1");
  plan_response(r, req, ctx(), kept);
  Response same = Response::text("hello");
  same.header("X-Custom", "1");
  ResponsePlan fresh;
  plan_response(same, req, ctx(), fresh);
  EXPECT_EQ(h1(kept), h1(fresh));
  EXPECT_EQ(kept.status, 200);
  EXPECT_EQ(kept.body, BodyKind::kBytes);
  EXPECT_EQ(kept.bytes, "hello");
  EXPECT_TRUE(kept.refused_header.empty());
  EXPECT_FALSE(kept.producer || kept.deferred || kept.upgrade);
}

TEST(ResponsePlan, ChunkFraming) {
  core::Buffer out;
  append_h1_chunk(out, "");
  EXPECT_TRUE(out.empty());  // an empty chunk would end the body
  append_h1_chunk(out, std::string(26, 'a'));
  EXPECT_EQ(out.view(), "1a\r\n" + std::string(26, 'a') + "\r\n");
}

TEST(ResponsePlan, DeferredHasNoHeadYetAndAMissingProducerIs500) {
  Response r = Response::deferred(std::make_unique<Deferred>());
  Request req = get();
  ResponsePlan plan;
  plan_response(r, req, ctx(), plan);
  EXPECT_EQ(plan.body, BodyKind::kDeferred);
  EXPECT_TRUE(plan.deferred);
  EXPECT_EQ(plan.fields.size(), 0u);

  Response none = Response::deferred(nullptr);
  ResponsePlan none_plan;
  plan_response(none, req, ctx(), none_plan);
  EXPECT_EQ(none_plan.status, 500);
  EXPECT_EQ(none_plan.bytes, "Internal Server Error\n");
}

TEST(ResponsePlan, UpgradeKeepsItsSwitchFieldsOverHttp1Only) {
  Response r = Response::upgrade(std::make_unique<Handler>());
  r.header("Upgrade", "websocket");
  r.header("Connection", "Upgrade");
  r.header("Sec-WebSocket-Accept", "abc");
  Request req = get();
  PlanContext c = ctx();
  c.keep_alive = false;  // a 101 never closes: its new owner has the connection
  ResponsePlan plan;
  plan_response(r, req, c, plan);
  EXPECT_EQ(plan.status, 101);
  EXPECT_EQ(plan.body, BodyKind::kUpgrade);
  EXPECT_TRUE(plan.upgrade);
  EXPECT_FALSE(plan.close);
  EXPECT_EQ(h1(plan),
            "HTTP/1.1 101 Switching Protocols\r\nServer: corral\r\n"
            "Date: Mon, 30 Nov 2026 00:00:00 GMT\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Accept: abc\r\n\r\n");

  Response r3 = Response::upgrade(std::make_unique<Handler>());
  r3.header("Upgrade", "websocket");
  r3.header("Connection", "Upgrade");
  ResponsePlan plan3;
  plan_response(r3, req, ctx(Protocol::kHttp3), plan3);
  EXPECT_FALSE(plan3.fields.find("upgrade"));
  EXPECT_FALSE(plan3.fields.find("connection"));
}

TEST(ResponsePlan, UnsafeHeadersRefuseTheResponseWith500) {
  const std::pair<std::string, std::string> bad[] = {
      {"X-A", "a\r\nb"}, {"X-B", "a\nb"}, {"X-C", std::string("a\0b", 3)},
      {"", "v"},         {"X\rD", "v"},   {std::string("X\0E", 3), "v"}};
  for (Protocol p : {Protocol::kHttp1, Protocol::kHttp3}) {
    for (const auto& [k, v] : bad) {
      Response r = Response::text("secret");
      r.header(k, v);
      Request req = get();
      ResponsePlan plan;
      plan_response(r, req, ctx(p), plan);
      EXPECT_EQ(plan.status, 500) << k;
      EXPECT_EQ(plan.refused_header, k);
      EXPECT_EQ(plan.bytes, "Internal Server Error\n");
      for (const Field& f : plan.fields) EXPECT_NE(f.name, k);
    }
  }
}

TEST(ResponsePlan, FramingAndConnectionFieldsOfARouteAreDropped) {
  for (Protocol p : {Protocol::kHttp1, Protocol::kHttp3}) {
    Response r = Response::text("hi");
    r.header("Transfer-Encoding", "chunked");
    r.header("Content-Length", "99");
    r.header("Connection", "close");
    r.header("Keep-Alive", "timeout=5");
    r.header("Proxy-Connection", "keep-alive");
    r.header(":status", "200");
    r.header("X-Kept", "1");
    Request req = get();
    ResponsePlan plan;
    plan_response(r, req, ctx(p), plan);
    EXPECT_EQ(plan.status, 200);
    EXPECT_EQ(plan.content_length, 2u);
    for (std::string_view name : {"transfer-encoding", "content-length", "connection", "keep-alive",
                                  "proxy-connection", ":status"})
      EXPECT_FALSE(plan.fields.find(name)) << name;
    EXPECT_EQ(plan.fields.find("x-kept"), "1");
  }
  // Upgrade: a 426 names the protocol to switch to over HTTP/1.1; HTTP/3 has no such thing.
  Response r = Response::status_only(426);
  r.header("Upgrade", "websocket");
  Request req = get();
  ResponsePlan h1_plan, h3_plan;
  plan_response(r, req, ctx(Protocol::kHttp1), h1_plan);
  plan_response(r, req, ctx(Protocol::kHttp3), h3_plan);
  EXPECT_EQ(h1_plan.fields.find("upgrade"), "websocket");
  EXPECT_FALSE(h3_plan.fields.find("upgrade"));
}

TEST(ResponsePlan, ManyFieldsSpillPastTheInlineArray) {
  Response r = Response::text("x");
  for (int i = 0; i < 60; ++i) r.header("X-" + std::to_string(i), std::to_string(i));
  Request req = get();
  ResponsePlan plan;
  plan_response(r, req, ctx(), plan);
  EXPECT_GT(plan.fields.size(), PlanFields::kInlineFields);
  EXPECT_EQ(plan.fields.find("x-0"), "0");
  EXPECT_EQ(plan.fields.find("x-59"), "59");
  EXPECT_EQ(plan.fields[0].name, "Server");
}

class FilePlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/responseplanXXXXXX";
    root_ = mkdtemp(tmpl);
    std::ofstream(root_ + "/f.txt") << "0123456789abcdefghij";  // 20 bytes
    req_ = get();
    req_.target = req_.path = "/f.txt";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  Response file(std::string path = "f.txt") {
    FileSpec spec;
    spec.root = root_;
    spec.path = std::move(path);
    return Response::file(std::move(spec));
  }
  std::string etag() {
    Response r = file();
    ResponsePlan plan;
    plan_response(r, req_, ctx(), plan);
    return std::string(plan.fields.find("etag").value_or(""));
  }
  std::string root_;
  Request req_;
};

TEST_F(FilePlanTest, WholeFileIsOneSegment) {
  Response r = file();
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.status, 200);
  EXPECT_EQ(plan.body, BodyKind::kFile);
  EXPECT_TRUE(plan.send_body);
  EXPECT_EQ(plan.content_length, 20u);
  EXPECT_EQ(plan.fields.find("content-type"), "text/plain; charset=utf-8");
  EXPECT_TRUE(plan.fields.find("etag"));
  EXPECT_EQ(plan.fields.find("accept-ranges"), "bytes");
  auto segs = file_segments(plan.file);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].offset, 0u);
  EXPECT_EQ(segs[0].length, 20u);
}

TEST_F(FilePlanTest, ResetReleasesTheFile) {
  Response r = file();
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  ASSERT_TRUE(plan.file.fd.valid());
  plan.reset();
  EXPECT_FALSE(plan.file.fd.valid());  // closed, not kept for the next response
  EXPECT_EQ(plan.file.status, 200);
  EXPECT_TRUE(plan.file.headers.empty());
  EXPECT_EQ(plan.fields.size(), 0u);
  EXPECT_EQ(plan.body, BodyKind::kNone);
  EXPECT_FALSE(plan.content_length);
}

TEST_F(FilePlanTest, HeadHasTheLengthAndNoBody) {
  req_.method = Method::kHead;
  Response r = file();
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.content_length, 20u);
  EXPECT_EQ(plan.body, BodyKind::kNone);
  EXPECT_FALSE(plan.send_body);
  EXPECT_TRUE(file_segments(plan.file).empty());
}

TEST_F(FilePlanTest, SingleRange) {
  req_.headers.add("Range", "bytes=5-9");
  Response r = file();
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.status, 206);
  EXPECT_EQ(plan.content_length, 5u);
  EXPECT_EQ(plan.fields.find("content-range"), "bytes 5-9/20");
  auto segs = file_segments(plan.file);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].offset, 5u);
  EXPECT_EQ(segs[0].length, 5u);
}

TEST_F(FilePlanTest, MultipleRangesAreFramedSegments) {
  req_.headers.add("Range", "bytes=0-1,10-11");
  Response r = file();
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.status, 206);
  EXPECT_EQ(plan.fields.find("content-type")->rfind("multipart/byteranges; boundary=", 0), 0u);
  auto segs = file_segments(plan.file);
  ASSERT_EQ(segs.size(), 5u);  // head, range, head, range, tail
  uint64_t total = 0;
  for (const auto& s : segs) total += s.text.empty() ? s.length : s.text.size();
  EXPECT_EQ(total, plan.content_length);
  EXPECT_NE(segs[0].text.find("Content-Range: bytes 0-1/20"), std::string::npos);
  EXPECT_EQ(segs[3].offset, 10u);
  EXPECT_EQ(segs[4].text.rfind("\r\n--", 0), 0u);
}

TEST_F(FilePlanTest, UnsatisfiableRangeIs416WithoutBody) {
  req_.headers.add("Range", "bytes=100-200");
  Response r = file();
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.status, 416);
  EXPECT_EQ(plan.content_length, 0u);
  EXPECT_EQ(plan.body, BodyKind::kNone);
  EXPECT_FALSE(plan.fields.find("content-type"));
  EXPECT_EQ(plan.fields.find("content-range"), "bytes */20");
}

TEST_F(FilePlanTest, IfRangeMismatchServesTheWholeFile) {
  req_.headers.add("Range", "bytes=5-9");
  req_.headers.add("If-Range", "\"not-the-etag\"");
  Response r = file();
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.status, 200);
  EXPECT_EQ(plan.content_length, 20u);
}

TEST_F(FilePlanTest, NotModifiedHasValidatorsAndNoLength) {
  std::string tag = etag();
  ASSERT_FALSE(tag.empty());
  req_.headers.add("If-None-Match", tag);
  Response r = file();
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.status, 304);
  EXPECT_FALSE(plan.content_length);
  EXPECT_FALSE(plan.send_body);
  EXPECT_EQ(plan.fields.find("etag"), tag);
  EXPECT_FALSE(plan.fields.find("content-type"));
  EXPECT_EQ(h1(plan).find("Content-Length"), std::string::npos);
}

TEST_F(FilePlanTest, MissingIs404WithStaticText) {
  Response r = file("nope");
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.status, 404);
  EXPECT_EQ(plan.body, BodyKind::kBytes);
  EXPECT_EQ(plan.bytes, "Not Found\n");
  EXPECT_TRUE(plan.owned_bytes.empty());  // the phrase table's, not a copy
  EXPECT_EQ(plan.content_length, 10u);
  EXPECT_EQ(plan.fields.find("content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(plan.take_bytes(), "Not Found\n");

  req_.method = Method::kHead;
  Response head = file("nope");
  ResponsePlan head_plan;
  plan_response(head, req_, ctx(), head_plan);
  EXPECT_EQ(head_plan.content_length, 10u);
  EXPECT_FALSE(head_plan.send_body);
}

TEST_F(FilePlanTest, DirectoryWithoutSlashRedirects) {
  std::filesystem::create_directory(root_ + "/d");
  std::ofstream(root_ + "/d/index.html") << "<p>d</p>";
  req_.target = req_.path = "/d";
  Response r = file("d");
  ResponsePlan plan;
  plan_response(r, req_, ctx(), plan);
  EXPECT_EQ(plan.status, 301);
  EXPECT_EQ(plan.fields.find("location"), "/d/");
  EXPECT_EQ(plan.content_length, 0u);
}

}  // namespace
}  // namespace corral::http
