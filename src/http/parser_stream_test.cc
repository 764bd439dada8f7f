// RequestParser with a streamed body (sans-IO): the route's rule asked once per head with a body,
// feed() stopping after the head, feed_body() handing the body over piece by piece, for
// Content-Length and chunked, whole and byte by byte, and the route's limit.
#include <gtest/gtest.h>

#include <string>

#include "http/parser.h"

namespace corral::http {
namespace {

struct Rules final : BodyRules {
  BodyRule body_rule(Request& req) override {
    ++asked;
    return {max_body, req.path == "/stream"};
  }
  int asked = 0;
  uint64_t max_body = 1 << 20;
};

struct Streamed {
  std::string body;
  bool done = false;
  int status = 0;
  size_t used = 0;  // bytes of the input taken (head and body)
};

// Feeds `bytes` (all at once, or `step` at a time as they would arrive) and reads the body.
Streamed run(RequestParser& p, const std::string& bytes, size_t step) {
  Request req;
  Streamed out;
  std::string in;  // what was received and not consumed
  size_t at = 0;
  bool head = false;
  while (at < bytes.size() || !in.empty()) {
    if (at < bytes.size()) {
      in.append(bytes, at, step);
      at += std::min(step, bytes.size() - at);
    }
    if (!head) {
      auto r = p.feed(in, req);
      if (r.kind == RequestParser::Kind::kError) {
        out.status = r.status;
        return out;
      }
      if (r.kind == RequestParser::Kind::kNeedMore) continue;
      EXPECT_EQ(r.kind, RequestParser::Kind::kHead);
      EXPECT_TRUE(p.streaming());
      head = true;
      in.erase(0, r.consumed);
      out.used += r.consumed;
    }
    while (!in.empty() && !out.done) {
      auto s = p.feed_body(in);
      if (s.state == RequestParser::BodyStep::State::kError) {
        out.status = s.status;
        return out;
      }
      out.body.append(s.piece);
      in.erase(0, s.consumed);
      out.used += s.consumed;
      out.done = s.state == RequestParser::BodyStep::State::kDone;
      if (s.consumed == 0) break;
    }
    if (out.done) break;
    if (at >= bytes.size()) break;
  }
  return out;
}

TEST(ParserStream, ContentLengthStopsAfterTheHeadAndLeavesTheNextRequest) {
  for (size_t step : {size_t{1}, size_t{7}, size_t{4096}}) {
    Rules rules;
    RequestParser p(ParserLimits{});
    p.set_body_rules(&rules);
    std::string req = "POST /stream HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world";
    auto s = run(p, req + "GET / HTTP/1.1\r\n", step);
    EXPECT_TRUE(s.done) << step;
    EXPECT_EQ(s.body, "hello world") << step;
    EXPECT_EQ(s.used, req.size()) << step;  // the pipelined request is not taken
    EXPECT_EQ(p.stream_length(), std::optional<uint64_t>(11));
    EXPECT_EQ(rules.asked, 1);
  }
}

TEST(ParserStream, ChunkedIsDecodedPieceByPieceAndTrailersDropped) {
  for (size_t step : {size_t{1}, size_t{3}, size_t{4096}}) {
    Rules rules;
    RequestParser p(ParserLimits{});
    p.set_body_rules(&rules);
    auto s = run(p,
                 "POST /stream HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "4;x=y\r\nabcd\r\n3\r\nefg\r\n0\r\nT: v\r\n\r\n",
                 step);
    EXPECT_TRUE(s.done) << step;
    EXPECT_EQ(s.body, "abcdefg") << step;
    EXPECT_EQ(p.stream_length(), std::nullopt);
  }
}

TEST(ParserStream, TheRoutesLimit) {
  Rules rules;
  rules.max_body = 5;
  {
    RequestParser p(ParserLimits{});
    p.set_body_rules(&rules);
    auto s = run(p, "POST /stream HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\n", 4096);
    EXPECT_EQ(s.status, 413);  // at once, at the head
  }
  {
    RequestParser p(ParserLimits{});
    p.set_body_rules(&rules);
    auto s = run(p,
                 "POST /stream HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n",
                 1);
    EXPECT_EQ(s.status, 413);
    EXPECT_EQ(s.body, "abc");  // the chunk that crosses it is refused
  }
  // A buffered route's limit comes from the rule too (larger than the server's here).
  {
    Rules big;
    big.max_body = 100;
    ParserLimits limits;
    limits.max_body = 4;
    RequestParser p(limits);
    p.set_body_rules(&big);
    Request req;
    auto r = p.feed("POST /other HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0123456789", req);
    EXPECT_EQ(r.kind, RequestParser::Kind::kComplete);
    EXPECT_FALSE(p.streaming());
    EXPECT_EQ(req.body, "0123456789");
  }
}

TEST(ParserStream, NoBodyNoQuestion) {
  Rules rules;
  RequestParser p(ParserLimits{});
  p.set_body_rules(&rules);
  Request req;
  auto r = p.feed("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n", req);
  EXPECT_EQ(r.kind, RequestParser::Kind::kComplete);
  EXPECT_EQ(rules.asked, 0);  // a GET pays nothing
  EXPECT_FALSE(p.streaming());
}

}  // namespace
}  // namespace corral::http
