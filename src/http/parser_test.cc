// Unit tests for HeadScanner and RequestParser (sans-IO: bytes in, requests out). Every refusal is
// checked with its exact status, and fed both whole and one byte at a time: the outcome must not
// depend on how the bytes arrive.
#include "http/parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "core/socket.h"
#include "http/admission.h"
#include "http/text.h"

namespace corral::http {
namespace {

using Kind = RequestParser::Kind;

// A completed request, copied out of the parser's views.
struct Parsed {
  std::string method;
  std::string target;
  std::string path;
  std::string query;
  int major = 0;
  int minor = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool keep_alive = false;
  bool expects_continue = false;
  bool operator==(const Parsed&) const = default;
};

struct Feed {
  std::vector<Parsed> requests;
  int error_status = 0;  // 0: no error
  std::string error_reason;
  size_t heads = 0;               // kHead results seen
  bool continue_at_head = false;  // expects_continue() when the first kHead was returned
  size_t unconsumed = 0;          // bytes left when the input ran out (a partial request)

  std::string describe() const {
    std::string s = "requests=" + std::to_string(requests.size()) +
                    " error=" + std::to_string(error_status) + " (" + error_reason + ")" +
                    " unconsumed=" + std::to_string(unconsumed);
    for (const auto& r : requests) s += "\n  " + r.method + " " + r.target + " body=" + r.body;
    return s;
  }
};

// Drives a parser the way a connection does: `input` arrives in pieces ending at `cuts` (then the
// rest); the parser sees every byte not yet consumed; after kComplete the request is taken and
// next_request() called; after kError nothing more is parsed. The input string never moves, so the
// views stay valid as they would in a connection's buffer.
Feed drive(std::string_view input, const std::vector<size_t>& cuts,
           const ParserLimits& limits = {}) {
  Feed run;
  RequestParser parser(limits);
  Request req;
  size_t pos = 0;    // first byte not consumed
  size_t avail = 0;  // bytes received so far
  std::vector<size_t> ends = cuts;
  ends.push_back(input.size());
  for (size_t end : ends) {
    if (end < avail || end > input.size()) continue;
    avail = end;
    for (;;) {
      std::string_view data = input.substr(pos, avail - pos);
      auto r = parser.feed(data, req);
      EXPECT_LE(r.consumed, data.size());
      if (r.kind == Kind::kError) {
        run.error_status = r.status;
        run.error_reason = std::string(r.reason);
        EXPECT_FALSE(r.reason.empty());
        return run;
      }
      pos += r.consumed;
      if (r.kind == Kind::kNeedMore) break;
      if (r.kind == Kind::kHead) {
        if (run.heads++ == 0) run.continue_at_head = parser.expects_continue();
        continue;
      }
      Parsed p;
      p.method = req.method_name;
      p.target = req.target;
      p.path = req.path;
      p.query = req.query;
      p.major = req.version_major;
      p.minor = req.version_minor;
      for (const auto& h : req.headers) p.headers.emplace_back(h.name, h.value);
      p.body = req.body;
      p.keep_alive = parser.keep_alive();
      p.expects_continue = parser.expects_continue();
      run.requests.push_back(std::move(p));
      parser.next_request();
      req.reset();
      if (pos == avail) break;
    }
  }
  run.unconsumed = avail - pos;
  return run;
}

Feed whole(std::string_view input, const ParserLimits& limits = {}) {
  return drive(input, {}, limits);
}

Feed bytewise(std::string_view input, const ParserLimits& limits = {}) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < input.size(); ++i) cuts.push_back(i);
  return drive(input, cuts, limits);
}

// Both ways of feeding must agree on the requests and on the error.
Feed both(std::string_view input, const ParserLimits& limits = {}) {
  Feed a = whole(input, limits);
  Feed b = bytewise(input, limits);
  EXPECT_EQ(a.requests, b.requests) << "whole: " << a.describe() << "\nbytewise: " << b.describe();
  EXPECT_EQ(a.error_status, b.error_status)
      << "whole: " << a.describe() << "\nbytewise: " << b.describe();
  EXPECT_EQ(a.unconsumed, b.unconsumed);
  return a;
}

constexpr std::string_view kSimpleGet = "GET /index.html?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n";

// --- HeadScanner ---------------------------------------------------------------------------

TEST(ParserHeadScanner, CompleteHeadReportsItsLength) {
  HeadScanner s;
  std::string in = std::string(kSimpleGet) + "extra";
  auto o = s.scan(in, {});
  EXPECT_EQ(o.state, HeadScanner::State::kComplete);
  EXPECT_EQ(o.head_len, kSimpleGet.size());
}

TEST(ParserHeadScanner, GrowingInputResumesWhereItStopped) {
  HeadScanner s;
  std::string_view in = kSimpleGet;
  for (size_t n = 1; n < in.size(); ++n)
    ASSERT_EQ(s.scan(in.substr(0, n), {}).state, HeadScanner::State::kNeedMore) << n;
  auto o = s.scan(in, {});
  EXPECT_EQ(o.state, HeadScanner::State::kComplete);
  EXPECT_EQ(o.head_len, in.size());
}

TEST(ParserHeadScanner, ResetStartsOver) {
  HeadScanner s;
  ASSERT_EQ(s.scan("GET / HTTP/1.1\r\n", {}).state, HeadScanner::State::kNeedMore);
  s.reset();
  auto o = s.scan("GET / HTTP/1.1\r\n\r\n", {});
  EXPECT_EQ(o.state, HeadScanner::State::kComplete);
  EXPECT_EQ(o.head_len, 18u);
}

TEST(ParserHeadScanner, RefusalsCarryStatusAndReason) {
  struct Case {
    std::string in;
    int status;
  };
  ParserLimits small{.max_request_line = 16, .max_head_bytes = 64, .max_headers = 2};
  const Case cases[] = {
      {"GET / HTTP/1.1\rX", 400},
      {"GET / HTTP/1.1\n", 400},
      {"GET / HTTP/1.1\r\nA: b\r\n c\r\n", 400},
      {"GET / HTTP/1.1\r\nA : b\r\n", 400},
      {"GET / HTTP/1.1\r\nA: b\x01\r\n", 400},
      {"GET / HTTP/1.1\r\nno colon\r\n", 400},
      {"GET / HTTP/1.1\r\n: empty name\r\n", 400},
      {"\r\n", 400},
      {"GET /" + std::string(20, 'a') + " HTTP/1.1\r\n", 414},
      {"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n", 431},
      {"GET / HTTP/1.1\r\nA: " + std::string(60, 'x') + "\r\n", 431},
  };
  for (const auto& c : cases) {
    HeadScanner s;
    auto o = s.scan(c.in, small);
    EXPECT_EQ(o.state, HeadScanner::State::kError) << c.in;
    EXPECT_EQ(o.status, c.status) << c.in;
    EXPECT_FALSE(o.reason.empty()) << c.in;
  }
}

// `in` scanned as it would arrive, `piece` more bytes each time, until the scanner decides.
HeadScanner::Outcome scan_in_pieces(std::string_view in, size_t piece, const ParserLimits& limits) {
  HeadScanner s;
  HeadScanner::Outcome o;
  for (size_t n = piece; o.state == HeadScanner::State::kNeedMore && n < in.size() + piece;
       n += piece)
    o = s.scan(in.substr(0, std::min(n, in.size())), limits);
  return o;
}

// Runs of plain bytes are skipped a word or a table lookup at a time: every byte value, at every
// place in a word and at every alignment, in the request target, a field name and a field value,
// gets the answer the rule gives, whether the head comes whole (the word path) or a byte at a time
// (the byte path).
TEST(ParserHeadScanner, EveryByteIsJudgedWhereverItFalls) {
  enum class Where { kTarget, kName, kValue };
  for (Where where : {Where::kTarget, Where::kName, Where::kValue}) {
    for (size_t shift = 1; shift <= 8; ++shift) {
      for (size_t at = 0; at < 19; ++at) {
        for (int b = 0; b < 256; ++b) {
          std::string run(19, 'v');
          run[at] = static_cast<char>(b);
          const std::string pad(shift, 'p');
          std::string in;
          bool ok = false;
          switch (where) {
            case Where::kTarget:  // any byte above SP but DEL (llhttp judges the rest later)
              in = "GET /" + pad + run + " HTTP/1.1\r\nHost: h\r\n\r\n";
              ok = b > 0x20 && b != 0x7f;
              break;
            case Where::kName:  // tchars; a colon ends the name (then the rest is the value)
              in = "GET / HTTP/1.1\r\n" + run + ": " + pad + "\r\n\r\n";
              ok = is_tchar(static_cast<char>(b)) || (b == ':' && at > 0);
              break;
            case Where::kValue:  // a tab or any byte but the controls and DEL (obs-text too)
              in = "GET / HTTP/1.1\r\n" + pad + ": " + run + "\r\n\r\n";
              ok = b == '\t' || (b >= 0x20 && b != 0x7f);
              break;
          }
          const auto what = [&] {
            return "byte " + std::to_string(b) + " at " + std::to_string(at) + " shift " +
                   std::to_string(shift) + " in " + std::to_string(static_cast<int>(where));
          };
          HeadScanner whole;
          auto o = whole.scan(in, {});
          ASSERT_EQ(o.state, ok ? HeadScanner::State::kComplete : HeadScanner::State::kError)
              << what();
          if (ok) {
            EXPECT_EQ(o.head_len, in.size()) << what();
          } else {
            EXPECT_EQ(o.status, 400) << what();
          }
          auto last = scan_in_pieces(in, 1, {});
          EXPECT_EQ(last.state, o.state) << what();
          EXPECT_EQ(last.reason, o.reason) << what();
        }
      }
    }
  }
}

// The request-line limit holds inside a long target too: a line of exactly max_request_line
// passes, one byte more is 414, whole or in pieces, and before the line ends.
TEST(ParserHeadScanner, RequestLineLimitHoldsInsideALongTarget) {
  ParserLimits limits{.max_request_line = 40};
  const auto line = [](size_t len) {
    return "GET /" + std::string(len - 14, 'x') + " HTTP/1.1";  // 14: "GET /", " HTTP/1.1"
  };
  const std::string exact = line(40) + "\r\n\r\n", over = line(41) + "\r\n\r\n";
  HeadScanner s;
  EXPECT_EQ(s.scan(exact, limits).state, HeadScanner::State::kComplete);
  for (size_t piece : {size_t{1}, size_t{7}, over.size()}) {
    auto o = scan_in_pieces(over, piece, limits);
    EXPECT_EQ(o.state, HeadScanner::State::kError) << piece;
    EXPECT_EQ(o.status, 414) << piece;
  }
  // A target longer than the limit is refused as soon as the limit is passed, not at its end.
  HeadScanner u;
  auto o = u.scan("GET /" + std::string(100, 'x'), limits);
  EXPECT_EQ(o.state, HeadScanner::State::kError);
  EXPECT_EQ(o.status, 414);
}

// The limit holds inside a long value too: a head of exactly max_head_bytes passes, one byte more
// is 431 whether it comes whole or in pieces.
TEST(ParserHeadScanner, HeadLimitHoldsInsideALongValue) {
  ParserLimits limits{.max_head_bytes = 100};
  const std::string start = "GET / HTTP/1.1\r\nA: ";
  const std::string exact = start + std::string(100 - start.size() - 4, 'x') + "\r\n\r\n";
  ASSERT_EQ(exact.size(), 100u);
  HeadScanner s;
  EXPECT_EQ(s.scan(exact, limits).state, HeadScanner::State::kComplete);
  const std::string over = start + std::string(100 - start.size() - 3, 'x') + "\r\n\r\n";
  for (size_t piece : {size_t{1}, size_t{7}, over.size()}) {
    auto o = scan_in_pieces(over, piece, limits);
    EXPECT_EQ(o.state, HeadScanner::State::kError) << piece;
    EXPECT_EQ(o.status, 431) << piece;
  }
}

// --- RequestParser: requests that parse ------------------------------------------------------

TEST(ParserRequest, SimpleGet) {
  Feed run = both(kSimpleGet);
  ASSERT_EQ(run.error_status, 0) << run.describe();
  ASSERT_EQ(run.requests.size(), 1u);
  const Parsed& p = run.requests[0];
  EXPECT_EQ(p.method, "GET");
  EXPECT_EQ(p.target, "/index.html?x=1");
  EXPECT_EQ(p.path, "/index.html");
  EXPECT_EQ(p.query, "x=1");
  EXPECT_EQ(p.major, 1);
  EXPECT_EQ(p.minor, 1);
  ASSERT_EQ(p.headers.size(), 1u);
  EXPECT_EQ(p.headers[0].first, "Host");
  EXPECT_EQ(p.headers[0].second, "example.com");
  EXPECT_EQ(p.body, "");
  EXPECT_TRUE(p.keep_alive);
  EXPECT_FALSE(p.expects_continue);
  EXPECT_EQ(run.unconsumed, 0u);
}

TEST(ParserRequest, HeadersAreViewsIntoTheInput) {
  std::string in(kSimpleGet);
  RequestParser parser({});
  Request req;
  auto r = parser.feed(in, req);
  ASSERT_EQ(r.kind, Kind::kComplete);
  EXPECT_EQ(r.consumed, in.size());
  EXPECT_EQ(parser.head_len(), in.size());
  auto inside = [&](std::string_view v) {
    return v.data() >= in.data() && v.data() + v.size() <= in.data() + in.size();
  };
  EXPECT_TRUE(inside(req.method_name));
  EXPECT_TRUE(inside(req.target));
  EXPECT_TRUE(inside(req.path));
  EXPECT_TRUE(inside(req.query));
  for (const auto& h : req.headers) {
    EXPECT_TRUE(inside(h.name));
    EXPECT_TRUE(inside(h.value));
  }
  EXPECT_EQ(req.header("host"), "example.com");  // lookups ignore case
}

TEST(ParserRequest, OwsTrimmedAndEmptyValueKept) {
  Feed run = both(
      "GET / HTTP/1.1\r\nHost: a\r\nX-Trail: value \t \r\nX-Lead:\t  lead\r\nX-Empty:\r\n"
      "X-Spaces:   \r\nX-Inner: a  b\r\n\r\n");
  ASSERT_EQ(run.requests.size(), 1u) << run.describe();
  const auto& h = run.requests[0].headers;
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[1], std::make_pair(std::string("X-Trail"), std::string("value")));
  EXPECT_EQ(h[2], std::make_pair(std::string("X-Lead"), std::string("lead")));
  EXPECT_EQ(h[3], std::make_pair(std::string("X-Empty"), std::string("")));
  EXPECT_EQ(h[4], std::make_pair(std::string("X-Spaces"), std::string("")));
  EXPECT_EQ(h[5], std::make_pair(std::string("X-Inner"), std::string("a  b")));
}

TEST(ParserRequest, RepeatedHeadersKeptInOrder) {
  Feed run = both("GET / HTTP/1.1\r\nHost: a\r\nAccept: x\r\nAccept: y\r\n\r\n");
  ASSERT_EQ(run.requests.size(), 1u) << run.describe();
  const auto& h = run.requests[0].headers;
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[1].second, "x");
  EXPECT_EQ(h[2].second, "y");
}

TEST(ParserRequest, PipelinedRequestsOneAtATime) {
  std::string in =
      "GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
      "POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nxyz"
      "GET /c HTTP/1.1\r\nHost: h\r\n\r\n";
  const size_t first = std::string_view("GET /a HTTP/1.1\r\nHost: h\r\n\r\n").size();
  RequestParser parser({});
  Request req;
  auto r = parser.feed(in, req);
  ASSERT_EQ(r.kind, Kind::kComplete);
  EXPECT_EQ(r.consumed, first);
  EXPECT_EQ(req.target, "/a");
  parser.next_request();
  req.reset();

  std::string_view rest = std::string_view(in).substr(first);
  r = parser.feed(rest, req);
  ASSERT_EQ(r.kind, Kind::kComplete);
  EXPECT_EQ(req.method_name, "POST");
  EXPECT_EQ(req.body, "xyz");
  rest.remove_prefix(r.consumed);
  parser.next_request();
  req.reset();

  r = parser.feed(rest, req);
  ASSERT_EQ(r.kind, Kind::kComplete);
  EXPECT_EQ(req.target, "/c");
  EXPECT_EQ(r.consumed, rest.size());

  Feed run = both(in);
  ASSERT_EQ(run.requests.size(), 3u) << run.describe();
  EXPECT_EQ(run.requests[1].body, "xyz");
}

TEST(ParserRequest, ContentLengthBodySplitAcrossFeeds) {
  std::string head = "POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n";
  RequestParser parser({});
  Request req;
  std::string in = head + "0123";
  auto r = parser.feed(in, req);
  ASSERT_EQ(r.kind, Kind::kHead);
  EXPECT_EQ(r.consumed, in.size());
  EXPECT_TRUE(parser.head_done());
  EXPECT_TRUE(parser.has_body());
  EXPECT_EQ(parser.content_length(), 6u);  // llhttp counts down what is left
  EXPECT_EQ(parser.head_len(), head.size());
  EXPECT_EQ(req.target, "/up");
  EXPECT_EQ(parser.body(), "0123");

  r = parser.feed("456", req);
  EXPECT_EQ(r.kind, Kind::kNeedMore);
  EXPECT_EQ(r.consumed, 3u);
  EXPECT_EQ(parser.body(), "0123456");

  std::string tail = "789GET / HTTP/1.1\r\n";
  r = parser.feed(tail, req);
  ASSERT_EQ(r.kind, Kind::kComplete);
  EXPECT_EQ(r.consumed, 3u);
  EXPECT_EQ(req.body, "0123456789");
}

TEST(ParserRequest, ChunkedBodyWithExtensionsAndTrailers) {
  std::string in =
      "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;name=value\r\nhello\r\n"
      "1;flag\r\n \r\n"
      "6;quoted=\"a b\"\r\nworld!\r\n"
      "0\r\nX-Trailer: t\r\nX-Other: o\r\n\r\n"
      "GET /next HTTP/1.1\r\nHost: h\r\n\r\n";
  Feed run = both(in);
  ASSERT_EQ(run.error_status, 0) << run.describe();
  ASSERT_EQ(run.requests.size(), 2u) << run.describe();
  EXPECT_EQ(run.requests[0].body, "hello world!");
  ASSERT_EQ(run.requests[0].headers.size(), 2u);  // trailers are not headers
  EXPECT_EQ(run.requests[0].headers[1].first, "Transfer-Encoding");
  EXPECT_EQ(run.requests[1].target, "/next");
  EXPECT_EQ(run.requests[1].headers.size(), 1u);
}

// RFC 9112 7.1.1: chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] ).
TEST(ParserRequest, ChunkedSeveralExtensionsOnOneChunk) {
  Feed run = both(
      "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;a=b;c=d\r\nhello\r\n0\r\n\r\n");
  EXPECT_EQ(run.error_status, 0) << run.describe();
  ASSERT_EQ(run.requests.size(), 1u) << run.describe();
  EXPECT_EQ(run.requests[0].body, "hello");
}

TEST(ParserRequest, ChunkedBodyInPiecesGivesHeadThenComplete) {
  std::string head = "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  RequestParser parser({});
  Request req;
  auto r = parser.feed(head + "3\r\nab", req);
  ASSERT_EQ(r.kind, Kind::kHead);
  EXPECT_TRUE(parser.has_body());
  r = parser.feed("c\r\n0\r\n", req);
  EXPECT_EQ(r.kind, Kind::kNeedMore);
  r = parser.feed("\r\n", req);
  ASSERT_EQ(r.kind, Kind::kComplete);
  EXPECT_EQ(req.body, "abc");
}

TEST(ParserRequest, ExpectContinue) {
  std::string in =
      "PUT /f HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\n";
  RequestParser parser({});
  Request req;
  auto r = parser.feed(in, req);
  ASSERT_EQ(r.kind, Kind::kHead);
  EXPECT_TRUE(parser.expects_continue());
  r = parser.feed("ok", req);
  ASSERT_EQ(r.kind, Kind::kComplete);
  EXPECT_EQ(req.body, "ok");

  Feed run = both(in + "ok");
  ASSERT_EQ(run.requests.size(), 1u) << run.describe();
  EXPECT_TRUE(run.requests[0].expects_continue);

  // Without a body there is nothing to wait for.
  Feed nobody = both("GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n");
  ASSERT_EQ(nobody.requests.size(), 1u) << nobody.describe();
  EXPECT_FALSE(nobody.requests[0].expects_continue);
}

TEST(ParserRequest, OtherExpectationIs417) {
  EXPECT_EQ(both("GET / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\n\r\n").error_status, 417);
  EXPECT_EQ(both("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nExpect: 100-continue\r\n"
                 "Content-Length: 1\r\n\r\nx")
                .error_status,
            417);
}

TEST(ParserRequest, KeepAliveSemantics) {
  struct Case {
    std::string in;
    bool keep_alive;
  };
  const Case cases[] = {
      {"GET / HTTP/1.1\r\nHost: h\r\n\r\n", true},
      {"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", false},
      {"GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n", false},
      {"GET / HTTP/1.0\r\n\r\n", false},
      {"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", true},
      {"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", true},
      {"GET / HTTP/1.0\r\nConnection: close\r\n\r\n", false},
  };
  for (const auto& c : cases) {
    Feed run = both(c.in);
    ASSERT_EQ(run.requests.size(), 1u) << c.in << run.describe();
    EXPECT_EQ(run.requests[0].keep_alive, c.keep_alive) << c.in;
  }
  Feed v10 = both("GET / HTTP/1.0\r\n\r\n");
  ASSERT_EQ(v10.requests.size(), 1u);
  EXPECT_EQ(v10.requests[0].minor, 0);
}

TEST(ParserRequest, Http10KeepAlivePipelined) {
  Feed run = both("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n");
  ASSERT_EQ(run.requests.size(), 2u) << run.describe();
  EXPECT_TRUE(run.requests[0].keep_alive);
  EXPECT_FALSE(run.requests[1].keep_alive);
}

// After a request that ends the connection nothing more is a request (llhttp's strict mode; without
// it llhttp swallowed the bytes and feed() reported kHead without a head).
TEST(ParserRequest, NothingParsedAfterConnectionClose) {
  for (std::string first :
       {"GET /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", "GET /a HTTP/1.0\r\n\r\n"}) {
    Feed run = both(first + "GET /b HTTP/1.1\r\nHost: h\r\n\r\n");
    ASSERT_EQ(run.requests.size(), 1u) << run.describe();
    EXPECT_FALSE(run.requests[0].keep_alive);
    EXPECT_EQ(run.error_status, 400) << run.describe();
  }
}

TEST(ParserRequest, UpgradeParsesAsNormalRequest) {
  std::string in =
      "GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
      "GET /after HTTP/1.1\r\nHost: h\r\n\r\n";
  Feed run = both(in);
  ASSERT_EQ(run.error_status, 0) << run.describe();
  ASSERT_EQ(run.requests.size(), 2u) << run.describe();
  EXPECT_EQ(run.requests[0].target, "/ws");
  EXPECT_EQ(run.requests[1].method, "GET");
  EXPECT_EQ(run.requests[1].target, "/after");
}

TEST(ParserRequest, UpgradeWithoutConnectionUpgradeAlsoParses) {
  Feed run = both(
      "GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n"
      "GET /after HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_EQ(run.requests.size(), 2u) << run.describe();
  EXPECT_EQ(run.requests[1].target, "/after");
}

TEST(ParserRequest, UpgradeWithBodyThenNextRequest) {
  Feed run = both(
      "POST /ws HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n"
      "Content-Length: 2\r\n\r\nhi"
      "GET /after HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_EQ(run.error_status, 0) << run.describe();
  ASSERT_EQ(run.requests.size(), 2u) << run.describe();
  EXPECT_EQ(run.requests[0].body, "hi");
  EXPECT_EQ(run.requests[1].target, "/after");
}

TEST(ParserRequest, KnownExtensionMethodParses) {
  Feed run = both("PROPFIND /dav HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_EQ(run.requests.size(), 1u) << run.describe();
  EXPECT_EQ(run.requests[0].method, "PROPFIND");
}

TEST(ParserRequest, AsteriskAndAbsoluteTargetsAreParsedAsIs) {
  Feed run = both(
      "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"
      "GET http://h/x?y HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_EQ(run.requests.size(), 2u) << run.describe();
  EXPECT_EQ(run.requests[0].target, "*");
  EXPECT_EQ(run.requests[1].target, "http://h/x?y");
}

TEST(ParserRequest, ObsTextInValueIsAccepted) {
  Feed run = both("GET / HTTP/1.1\r\nHost: h\r\nX-Name: caf\xc3\xa9\r\n\r\n");
  ASSERT_EQ(run.requests.size(), 1u) << run.describe();
  EXPECT_EQ(run.requests[0].headers[1].second, "caf\xc3\xa9");
}

// llhttp accepts "*b" as a request-target; the parser passes it on and admission refuses it (the
// split of duties the lead chose: the parser frames, admission judges the target).
TEST(ParserRequest, AsteriskPrefixedTargetIsRefusedByAdmission) {
  AdmissionPolicy policy;
  const Peer peer = Peer::from(core::parse_address("127.0.0.1:1").value());
  for (std::string target : {"*b", "*/x", "**", "*?x"}) {
    std::string in = "GET " + target + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    RequestParser parser({});
    Request req;
    auto r = parser.feed(in, req);
    if (r.kind == Kind::kError) {
      EXPECT_EQ(r.status, 400) << target;
      continue;
    }
    ASSERT_EQ(r.kind, Kind::kComplete) << target;
    EXPECT_EQ(admit(req, peer, policy).status, 400) << target;
  }
}

TEST(ParserRequest, PartialHeadConsumesNothing) {
  RequestParser parser({});
  Request req;
  auto r = parser.feed("GET / HTTP/1.1\r\nHo", req);
  EXPECT_EQ(r.kind, Kind::kNeedMore);
  EXPECT_EQ(r.consumed, 0u);
  EXPECT_FALSE(parser.head_done());
}

TEST(ParserRequest, NextRequestReleasesAndResetsBody) {
  RequestParser parser({});
  Request req;
  std::string big(300 * 1024, 'b');
  std::string in = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: " + std::to_string(big.size()) +
                   "\r\n\r\n" + big;
  ASSERT_EQ(parser.feed(in, req).kind, Kind::kComplete);
  EXPECT_EQ(req.body.size(), big.size());
  parser.next_request();
  req.reset();
  EXPECT_TRUE(parser.body().empty());
  auto r = parser.feed(kSimpleGet, req);
  ASSERT_EQ(r.kind, Kind::kComplete);
  EXPECT_TRUE(req.body.empty());
  EXPECT_FALSE(parser.has_body());
}

// --- RequestParser: refusals -----------------------------------------------------------------

struct Refusal {
  const char* name;
  std::string in;
  int status;
};

ParserLimits small_limits() {
  return {.max_request_line = 64, .max_head_bytes = 256, .max_headers = 4, .max_body = 16};
}

std::vector<Refusal> refusals() {
  const std::string te = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  return {
      {"bare CR in request line", "GET / HTTP/1.1\rHost: h\r\n\r\n", 400},
      {"bare CR in header", "GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n", 400},
      {"bare LF after request line", "GET / HTTP/1.1\nHost: h\r\n\r\n", 400},
      {"bare LF after header", "GET / HTTP/1.1\r\nHost: h\n\r\n", 400},
      {"bare LF ending head", "GET / HTTP/1.1\r\nHost: h\r\n\n", 400},
      {"obs-fold", "GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", 400},
      {"obs-fold with tab", "GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n\tb\r\n\r\n", 400},
      {"space before colon", "GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400},
      {"tab before colon", "GET / HTTP/1.1\r\nHost\t: h\r\n\r\n", 400},
      {"space in header name", "GET / HTTP/1.1\r\nX Y: h\r\n\r\n", 400},
      {"control char in value", "GET / HTTP/1.1\r\nHost: h\x01x\r\n\r\n", 400},
      {"NUL in value", std::string("GET / HTTP/1.1\r\nHost: h\0x\r\n\r\n", 26), 400},
      {"DEL in value", "GET / HTTP/1.1\r\nHost: h\x7fx\r\n\r\n", 400},
      {"control char in target", "GET /\x01 HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"tab in request line", "GET\t/ HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"header without colon", "GET / HTTP/1.1\r\nHost h\r\n\r\n", 400},
      {"empty request line", "\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"conflicting Content-Length",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400},
      {"Content-Length list", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1, 1\r\n\r\na", 400},
      {"negative Content-Length", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400},
      {"Content-Length with sign", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\na",
       400},
      {"Content-Length and Transfer-Encoding",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
       "0\r\n\r\n",
       400},
      {"Transfer-Encoding and Content-Length",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
       "0\r\n\r\n",
       400},
      {"chunked twice",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
       "0\r\n\r\n",
       400},
      {"Transfer-Encoding in HTTP/1.0",
       "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
      {"bad chunk size", te + "zz\r\nab\r\n0\r\n\r\n", 400},
      {"chunk data too long", te + "2\r\nabc\r\n0\r\n\r\n", 400},
      {"chunk data not followed by CRLF", te + "2\r\nabXY0\r\n\r\n", 400},
      {"chunk data followed by LF only", te + "2\r\nab\n0\r\n\r\n\r\n", 400},
      {"chunk size bare LF", te + "2\nab\r\n0\r\n\r\n", 400},
      {"chunk data bare LF", te + "2\r\nab\n0\r\n\r\n", 400},
      {"last chunk bare LF", te + "0\r\n\n", 400},
      {"trailer bare LF", te + "0\r\nX: y\n\r\n", 400},
      {"trailer bare CR", te + "0\r\nX: y\rZ\r\n\r\n", 400},
      {"trailer obs-fold", te + "0\r\nX: y\r\n z\r\n\r\n", 400},
      {"trailer whitespace before colon", te + "0\r\nX : y\r\n\r\n", 400},
      {"chunk size with space", te + "2 \r\nab\r\n0\r\n\r\n", 400},
      {"unknown coding", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"unknown coding before chunked",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501},
      // RFC 9112 6.3(4): chunked not final in a request MUST be 400.
      {"chunked not last", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
       400},
      {"unknown method token", "FROB / HTTP/1.1\r\nHost: h\r\n\r\n", 501},
      {"lowercase method", "get / HTTP/1.1\r\nHost: h\r\n\r\n", 501},
      {"garbage method", "G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"target not rooted", "GET a:b HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      // RFC 9112 §3: method SP request-target SP HTTP-version CRLF, nothing else.
      {"two spaces after method", "GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"two spaces before version", "GET /  HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"trailing space", "GET / HTTP/1.1 \r\nHost: h\r\n\r\n", 400},
      {"leading space", " GET / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"tab before version", "GET /\tHTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"trailing tab", "GET / HTTP/1.1\t\r\nHost: h\r\n\r\n", 400},
      {"no version HTTP 0.9 form", "GET /\r\nHost: h\r\n\r\n", 400},
      {"method alone", "GET\r\nHost: h\r\n\r\n", 400},
      {"empty version", "GET / \r\nHost: h\r\n\r\n", 400},
      {"fourth element", "GET / HTTP/1.1 x\r\nHost: h\r\n\r\n", 400},
      {"space in target", "GET /a b HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      // RFC 9112 §2.3: HTTP-version = "HTTP/" DIGIT "." DIGIT; anything else is 400, not 505.
      {"version two minor digits", "GET / HTTP/1.10\r\nHost: h\r\n\r\n", 400},
      {"version two major digits", "GET / HTTP/01.1\r\nHost: h\r\n\r\n", 400},
      {"version lowercase", "GET / http/1.1\r\nHost: h\r\n\r\n", 400},
      {"version without minor", "GET / HTTP/1\r\nHost: h\r\n\r\n", 400},
      {"version without minor digit", "GET / HTTP/1.\r\nHost: h\r\n\r\n", 400},
      {"version without dot", "GET / HTTP/11\r\nHost: h\r\n\r\n", 400},
      {"version letter", "GET / HTTP/1.x\r\nHost: h\r\n\r\n", 400},
      {"version other protocol", "GET / HTTPS/1.1\r\nHost: h\r\n\r\n", 400},
      {"version suffix", "GET / HTTP/1.1x\r\nHost: h\r\n\r\n", 400},
      {"HTTP/2.0", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505},
      {"HTTP/1.2", "GET / HTTP/1.2\r\nHost: h\r\n\r\n", 505},
      {"HTTP/3.0", "GET / HTTP/3.0\r\nHost: h\r\n\r\n", 505},
      {"HTTP/3.1", "GET / HTTP/3.1\r\nHost: h\r\n\r\n", 505},
      {"HTTP/0.9", "GET / HTTP/0.9\r\nHost: h\r\n\r\n", 505},
      {"HTTP/9.9", "GET / HTTP/9.9\r\nHost: h\r\n\r\n", 505},
      // RFC 9112 §6.1, §6.3: a Transfer-Encoding the body length cannot be read from.
      {"empty Transfer-Encoding", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n\r\n", 400},
      {"blank Transfer-Encoding", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:  \t\r\n\r\n",
       400},
      {"Transfer-Encoding of commas",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: , ,\r\n\r\n", 400},
      {"empty Transfer-Encoding with Content-Length",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\nContent-Length: 3\r\n\r\nabc", 400},
      {"empty Transfer-Encoding after chunked",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding:\r\n\r\n"
       "0\r\n\r\n",
       400},
      {"empty Transfer-Encoding before chunked",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\nTransfer-Encoding: chunked\r\n\r\n"
       "0\r\n\r\n",
       400},
      {"chunked in two fields",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
       "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      {"chunked twice after another coding",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n"
       "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      {"chunked twice with other fields between",
       "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: h\r\n"
       "transfer-encoding: CHUNKED\r\n\r\n0\r\n\r\n",
       400},
      {"chunked not last across fields",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
       "gzip\r\n\r\n",
       400},
      {"Content-Length over the limit, head only",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 17\r\n\r\n", 413},
      {"Content-Length far over the limit",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999\r\n\r\n", 413},
      {"request line too long", "GET /" + std::string(100, 'a') + " HTTP/1.1\r\nHost: h\r\n\r\n",
       414},
      {"head too large", "GET / HTTP/1.1\r\nHost: h\r\nX: " + std::string(300, 'x') + "\r\n\r\n",
       431},
      {"too many headers", "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n",
       431},
      {"Content-Length over the limit",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 17\r\n\r\n" + std::string(17, 'x'), 413},
      {"chunked body over the limit",
       te + "10\r\n" + std::string(16, 'x') + "\r\n1\r\nx\r\n0\r\n\r\n", 413},
  };
}

void PrintTo(const Refusal& r, std::ostream* os) {
  *os << r.name;
}

class ParserRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(ParserRefusal, WholeAndBytewise) {
  const Refusal& c = GetParam();
  Feed a = whole(c.in, small_limits());
  EXPECT_EQ(a.error_status, c.status) << c.name << "\n" << a.describe();
  EXPECT_TRUE(a.requests.empty()) << c.name;
  Feed b = bytewise(c.in, small_limits());
  EXPECT_EQ(b.error_status, c.status) << c.name << " (byte by byte)\n" << b.describe();
  EXPECT_TRUE(b.requests.empty()) << c.name;
}

// The same refusal after a good request on the same connection: the first is served, nothing of
// the second is.
TEST_P(ParserRefusal, AfterAKeepAliveRequest) {
  const Refusal& c = GetParam();
  const std::string in = std::string(kSimpleGet) + c.in;
  for (Feed run : {whole(in, small_limits()), bytewise(in, small_limits())}) {
    EXPECT_EQ(run.error_status, c.status) << c.name << "\n" << run.describe();
    ASSERT_EQ(run.requests.size(), 1u) << c.name << "\n" << run.describe();
    EXPECT_EQ(run.requests[0].target, "/index.html?x=1") << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(All, ParserRefusal, ::testing::ValuesIn(refusals()),
                         [](const ::testing::TestParamInfo<Refusal>& info) {
                           std::string name;
                           for (const char* p = info.param.name; *p; ++p)
                             name += std::isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
                           return name;
                         });

// A request line with stray whitespace is refused at the byte that breaks it, before the head
// ends; a version only once the line ends. Either way before any header is read.
TEST(ParserRequest, RequestLineRefusedBeforeTheHeadEnds) {
  for (std::string in : {"GET  ", "GET /  ", "GET / HTTP/1.1 ", " ", "GET / HTTP/1.10\r\n",
                         "GET /\r\n", "GET / http/1.1\r\nHost: h"}) {
    RequestParser parser({});
    Request req;
    auto r = parser.feed(in, req);
    EXPECT_EQ(r.kind, Kind::kError) << in;
    EXPECT_EQ(r.status, 400) << in;
    EXPECT_FALSE(r.reason.empty()) << in;
  }
}

TEST(ParserRequest, WellFormedRequestLinesParse) {
  Feed run = both(
      "GET / HTTP/1.1\r\nHost: h\r\n\r\n"
      "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"
      "CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n"
      "GET /a?b=c%20d HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
      "GET /last HTTP/1.0\r\n\r\n");
  ASSERT_EQ(run.error_status, 0) << run.describe();
  ASSERT_EQ(run.requests.size(), 5u) << run.describe();
  EXPECT_EQ(run.requests[2].target, "h:443");
  EXPECT_EQ(run.requests[3].minor, 0);
}

// RFC 9110 §5.6.1: empty list elements are ignored, so these apply chunked once and last.
TEST(ParserRequest, ChunkedWithEmptyListElementsParses) {
  for (std::string te : {", chunked", "chunked ,", " ,chunked", "Chunked"}) {
    std::string in =
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:" + te + "\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    Feed run = both(in);
    if (te == "chunked ,") {
      // llhttp stops at anything after chunked in the same field, even an empty element: still a
      // 400, never a body framed otherwise.
      EXPECT_EQ(run.error_status, 400) << te;
      continue;
    }
    ASSERT_EQ(run.error_status, 0) << te << "\n" << run.describe();
    ASSERT_EQ(run.requests.size(), 1u) << te;
    EXPECT_EQ(run.requests[0].body, "abc") << te;
  }
}

// 413 comes with the head: the parser never waits for a body it would refuse.
TEST(ParserRequest, ContentLengthOverTheLimitRefusedAtTheHead) {
  ParserLimits l = small_limits();
  RequestParser parser(l);
  Request req;
  auto r = parser.feed("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 17\r\n\r\n", req);
  EXPECT_EQ(r.kind, Kind::kError);
  EXPECT_EQ(r.status, 413);
  EXPECT_FALSE(parser.expects_continue());
  // With Expect: 100-continue too: no 100 is due for a body that would be refused.
  RequestParser p2(l);
  Request req2;
  r = p2.feed("PUT / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 17\r\n\r\n",
              req2);
  EXPECT_EQ(r.kind, Kind::kError);
  EXPECT_EQ(r.status, 413);
}

TEST(ParserRequest, ErrorStopsThePipeline) {
  // Nothing after a framing error is parsed: the second request must not appear.
  Feed run = both(
      "GET / HTTP/1.1\r\nHost: h\r\n\r\n"
      "GET / HTTP/1.1\r\nHost : h\r\n\r\n"
      "GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n");
  EXPECT_EQ(run.error_status, 400);
  ASSERT_EQ(run.requests.size(), 1u);
}

TEST(ParserRequest, LimitsAtTheirExactValues) {
  // A request line of exactly max_request_line bytes is fine; one more is 414.
  ParserLimits l = small_limits();
  std::string line = "GET /" + std::string(l.max_request_line - 14, 'a') + " HTTP/1.1";
  ASSERT_EQ(line.size(), l.max_request_line);
  EXPECT_EQ(both(line + "\r\nHost: h\r\n\r\n", l).error_status, 0);
  std::string longer = "GET /" + std::string(l.max_request_line - 13, 'a') + " HTTP/1.1";
  EXPECT_EQ(both(longer + "\r\nHost: h\r\n\r\n", l).error_status, 414);
  // max_headers fields are fine.
  EXPECT_EQ(both("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", l).error_status, 0);
  // A body of exactly max_body bytes is fine, both framings.
  EXPECT_EQ(
      both("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 16\r\n\r\n" + std::string(16, 'x'), l)
          .error_status,
      0);
  EXPECT_EQ(both("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" +
                     std::string(16, 'x') + "\r\n0\r\n\r\n",
                 l)
                .error_status,
            0);
}

// The head limit must not depend on how the bytes arrive: a head whose final CRLF CRLF crosses
// max_head_bytes gets the same answer whole and byte by byte.
TEST(ParserRequest, HeadLimitSameWholeAndBytewise) {
  ParserLimits l = small_limits();
  for (size_t pad = 200; pad < 260; ++pad) {
    std::string in = "GET / HTTP/1.1\r\nHost: h\r\nX: " + std::string(pad, 'x') + "\r\n\r\n";
    Feed a = whole(in, l);
    Feed b = bytewise(in, l);
    EXPECT_EQ(a.error_status, b.error_status)
        << "head of " << in.size() << " bytes, limit " << l.max_head_bytes;
    EXPECT_EQ(a.error_status, in.size() <= l.max_head_bytes ? 0 : 431) << in.size();
  }
}

TEST(ParserRequest, RandomSplitsAgreeWithWhole) {
  std::string in =
      "GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
      "POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
      "PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: "
      "1\r\n\r\n"
      "GET /d HTTP/1.0\r\n\r\n";
  Feed ref = whole(in);
  ASSERT_EQ(ref.requests.size(), 4u) << ref.describe();
  uint32_t seed = 12345;
  for (int round = 0; round < 200; ++round) {
    std::vector<size_t> cuts;
    size_t at = 0;
    for (;;) {
      seed = seed * 1103515245 + 12345;
      at += 1 + (seed >> 16) % 40;
      if (at >= in.size()) break;
      cuts.push_back(at);
    }
    Feed r = drive(in, cuts);
    ASSERT_EQ(r.requests, ref.requests) << "round " << round << ": " << r.describe();
    ASSERT_EQ(r.error_status, 0);
  }
}

}  // namespace
}  // namespace corral::http
