// The sans-IO response reader: whole, byte by byte, pipelined responses back to back, interim
// responses, a requested switch, and bad input.
#include "proxy/response_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "http/request.h"
#include "proxy/fields.h"

namespace corral::proxy {
namespace {

struct Recorder final : ResponseReader::Events {
  void on_head(ResponseHead& h) override {
    ++heads;
    status = h.status;
    headers = h.headers;
    content_type = h.content_type;
    length = h.content_length;
    connection = h.connection;
  }
  void on_body(std::string_view data) override { body.append(data); }
  int heads = 0;
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::optional<uint64_t> length;
  std::string connection;
  std::string body;
};

bool drop_date(std::string_view name) {
  return http::iequals(name, "date");
}

// Feeds `bytes` in pieces of `step`; returns the last state and the bytes used in all.
ResponseReader::Fed feed_in_steps(ResponseReader& r, std::string_view bytes, size_t step) {
  size_t used = 0;
  ResponseReader::Fed fed{ResponseReader::State::kMore, 0};
  while (used < bytes.size()) {
    size_t n = std::min(step, bytes.size() - used);
    fed = r.feed(bytes.data() + used, n);
    used += fed.used;
    if (fed.state != ResponseReader::State::kMore) break;
  }
  return {fed.state, used};
}

const std::string kChunked =
    "HTTP/1.1 200 OK\r\nDate: x\r\nContent-Type: text/plain\r\nX-Long-Header-Name: v1\r\n"
    "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";

TEST(ResponseReader, ReadsAChunkedResponseWholeAndByteByByte) {
  for (size_t step : {kChunked.size(), size_t{1}, size_t{7}}) {
    ResponseReader reader(drop_date);
    Recorder rec;
    reader.start(rec, false, false);
    auto fed = feed_in_steps(reader, kChunked, step);
    EXPECT_EQ(fed.state, ResponseReader::State::kComplete) << step;
    EXPECT_EQ(fed.used, kChunked.size());
    EXPECT_EQ(rec.heads, 1);
    EXPECT_EQ(rec.status, 200);
    EXPECT_EQ(rec.content_type, "text/plain");
    EXPECT_EQ(rec.body, "hello world");
    ASSERT_EQ(rec.headers.size(), 2u) << step;              // Date dropped, Content-Type apart
    EXPECT_EQ(rec.headers[0].first, "X-Long-Header-Name");  // whole, though split across reads
    EXPECT_EQ(rec.headers[0].second, "v1");
    EXPECT_TRUE(reader.keep_alive());
  }
}

TEST(ResponseReader, StopsAtTheEndOfEachPipelinedResponse) {
  std::string three =
      "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none"
      "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n"  // the answer to a HEAD: no body
      "HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nthree";
  for (size_t step : {three.size(), size_t{1}}) {
    ResponseReader reader;
    std::string_view rest = three;
    std::vector<std::string> bodies;
    for (int i = 0; i < 3; ++i) {
      Recorder rec;
      reader.start(rec, i == 1, false);
      auto fed = feed_in_steps(reader, rest, step);
      ASSERT_EQ(fed.state, ResponseReader::State::kComplete) << i << " step " << step;
      rest.remove_prefix(fed.used);
      bodies.push_back(rec.body);
      if (i == 1) {
        EXPECT_EQ(rec.length, 7u);
      }
      if (i == 2) {
        EXPECT_EQ(rec.status, 404);
      }
    }
    EXPECT_TRUE(rest.empty());
    EXPECT_EQ(bodies, (std::vector<std::string>{"one", "", "three"}));
  }
}

TEST(ResponseReader, ReadsPastInterimResponses) {
  std::string bytes =
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n"
      "Content-Length: 3\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nfinal";
  ResponseReader reader;
  Recorder rec;
  reader.start(rec, false, false);
  auto fed = feed_in_steps(reader, bytes, 1);
  EXPECT_EQ(fed.state, ResponseReader::State::kComplete);
  EXPECT_EQ(rec.heads, 1);
  EXPECT_EQ(rec.status, 201);
  ASSERT_EQ(rec.headers.size(), 1u);  // the 103's Link is not the final response's
  EXPECT_EQ(rec.headers[0].first, "Content-Length");
  EXPECT_EQ(rec.body, "final");
}

TEST(ResponseReader, TooManyInterimResponsesAndAnUnaskedSwitchAreErrors) {
  std::string flood;
  for (uint32_t i = 0; i <= ResponseReader::kMaxInterim; ++i) flood += "HTTP/1.1 102 P\r\n\r\n";
  ResponseReader reader;
  Recorder rec;
  reader.start(rec, false, false);
  EXPECT_EQ(reader.feed(flood.data(), flood.size()).state, ResponseReader::State::kError);
  std::string up = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n";
  reader.start(rec, false, false);
  EXPECT_EQ(reader.feed(up.data(), up.size()).state, ResponseReader::State::kError);
}

TEST(ResponseReader, ARequestedSwitchStopsAfterItsHeadWithEveryField) {
  std::string up =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Date: kept\r\n\r\n\x81\x02hi";
  ResponseReader reader(drop_date);
  Recorder rec;
  reader.start(rec, false, true);
  auto fed = reader.feed(up.data(), up.size());
  EXPECT_EQ(fed.state, ResponseReader::State::kSwitched);
  EXPECT_EQ(up.substr(fed.used), "\x81\x02hi");
  EXPECT_EQ(rec.status, 101);
  EXPECT_EQ(rec.headers.size(), 3u);  // an upgrade keeps them all
}

TEST(ResponseReader, ABodyUntilCloseEndsAtFinishAndAShortOneIsAnError) {
  std::string bytes = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close";
  ResponseReader reader;
  Recorder rec;
  reader.start(rec, false, false);
  EXPECT_EQ(reader.feed(bytes.data(), bytes.size()).state, ResponseReader::State::kMore);
  EXPECT_EQ(reader.finish(), ResponseReader::State::kComplete);
  EXPECT_EQ(rec.body, "until close");
  EXPECT_FALSE(reader.keep_alive());

  std::string cut = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort";
  Recorder rec2;
  reader.start(rec2, false, false);
  EXPECT_EQ(reader.feed(cut.data(), cut.size()).state, ResponseReader::State::kMore);
  EXPECT_EQ(reader.finish(), ResponseReader::State::kError);
  EXPECT_TRUE(reader.head_seen());

  Recorder rec3;
  reader.start(rec3, false, false);
  EXPECT_EQ(reader.finish(), ResponseReader::State::kError);  // nothing at all
  EXPECT_FALSE(reader.head_seen());
}

TEST(ResponseReader, RejectsMalformedInput) {
  for (std::string_view bad :
       {std::string_view("HTTP/1.1 2000 OK\r\n\r\n"), std::string_view("NOT HTTP\r\n\r\n"),
        std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
        std::string_view("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")}) {
    ResponseReader reader;
    Recorder rec;
    reader.start(rec, false, false);
    EXPECT_EQ(reader.feed(bad.data(), bad.size()).state, ResponseReader::State::kError) << bad;
  }
}

TEST(ResponseReader, AHeadPastItsBoundIsAnErrorAndOneWithinItIsRead) {
  // A worker that sends fields without end: the proxy stops buffering them at kMaxHeadBytes.
  std::string field = "X-Pad: " + std::string(1000, 'a') + "\r\n";
  std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n";
  std::string within = head, past = head;
  for (size_t n = 0; n < ResponseReader::kMaxHeadBytes / 1005 - 1; ++n) within += field;
  for (size_t n = 0; n < ResponseReader::kMaxHeadBytes / 1005 + 2; ++n) past += field;
  within += "\r\n";
  past += "\r\n";
  ResponseReader reader;
  Recorder rec;
  reader.start(rec, false, false);
  EXPECT_EQ(reader.feed(within.data(), within.size()).state, ResponseReader::State::kComplete);
  reader.start(rec, false, false);
  EXPECT_EQ(feed_in_steps(reader, past, 4096).state, ResponseReader::State::kError);
}

// The answer to a request that carried Corral-Seq N must echo N; one that echoes another value,
// or that echoes anything for a request without one, is another request's answer.
TEST(ResponseReader, AResponseIsItsRequestsOnlyIfItEchoesItsSeq) {
  auto state = [](uint64_t seq, bool required, std::string_view fields, bool* echoed = nullptr) {
    std::string bytes = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + std::string(fields) + "\r\nok";
    for (size_t step : {bytes.size(), size_t{1}}) {  // the value split across reads, too
      ResponseReader reader(drop_date);
      Recorder rec;
      reader.start(rec, false, false, seq, required);
      auto fed = feed_in_steps(reader, bytes, step);
      if (echoed) *echoed = reader.seq_echoed();
      for (const auto& [k, v] : rec.headers) EXPECT_FALSE(http::iequals(k, "corral-seq"));
      if (fed.state == ResponseReader::State::kError) {
        EXPECT_TRUE(reader.not_its_response());
        EXPECT_EQ(rec.heads, 0);  // never seen by the request it is not the answer to
      }
      if (step == 1) return fed.state;
    }
    return ResponseReader::State::kError;
  };
  bool echoed = false;
  EXPECT_EQ(state(7, true, "Corral-Seq: 7\r\n", &echoed), ResponseReader::State::kComplete);
  EXPECT_TRUE(echoed);
  EXPECT_EQ(state(7, true, "corral-seq:  7 \r\n"), ResponseReader::State::kComplete);
  EXPECT_EQ(state(7, true, "Corral-Seq: 8\r\n"), ResponseReader::State::kError);
  EXPECT_EQ(state(7, true, "Corral-Seq: 7x\r\n"), ResponseReader::State::kError);
  EXPECT_EQ(state(7, true, ""), ResponseReader::State::kError);  // pipelined: it must echo
  // The first request of a connection asks whether the upstream echoes: no echo is an answer.
  EXPECT_EQ(state(7, false, "", &echoed), ResponseReader::State::kComplete);
  EXPECT_FALSE(echoed);
  EXPECT_EQ(state(7, false, "Corral-Seq: 6\r\n"), ResponseReader::State::kError);
  EXPECT_EQ(state(0, false, ""), ResponseReader::State::kComplete);
  EXPECT_EQ(state(0, false, "Corral-Seq: 6\r\n"), ResponseReader::State::kError);
}

TEST(ResponseReader, ATransferCodingOtherThanChunkedIsAnError) {
  auto fed = [](std::string_view te, bool head_request = false, int status = 200) {
    std::string bytes = "HTTP/1.1 " + std::to_string(status) +
                        " X\r\nTransfer-Encoding: " + std::string(te) + "\r\n\r\n" +
                        (head_request || status == 204 ? "" : "2\r\nok\r\n0\r\n\r\n");
    ResponseReader reader;
    Recorder rec;
    reader.start(rec, head_request, false);
    auto state = reader.feed(bytes.data(), bytes.size()).state;
    if (state == ResponseReader::State::kError) {
      EXPECT_EQ(reader.error(), ResponseReader::kTransferCoding) << te;
    }
    return state;
  };
  EXPECT_EQ(fed("chunked"), ResponseReader::State::kComplete);
  EXPECT_EQ(fed("Chunked"), ResponseReader::State::kComplete);
  EXPECT_EQ(fed("gzip, chunked"), ResponseReader::State::kError);
  EXPECT_EQ(fed("gzip,chunked"), ResponseReader::State::kError);
  EXPECT_EQ(fed("gzip"), ResponseReader::State::kError);
  // No body, nothing decoded: the field is dropped as any hop-by-hop one.
  EXPECT_EQ(fed("gzip, chunked", true), ResponseReader::State::kComplete);
  EXPECT_EQ(fed("gzip, chunked", false, 204), ResponseReader::State::kComplete);
}

TEST(ResponseReader, KeepsTheConnectionOptionsAndEndsA204AtItsHead) {
  std::string bytes =
      "HTTP/1.1 204 No Content\r\nConnection: X-A, keep-alive\r\nX-A: 1\r\n"
      "Connection: X-B\r\n\r\nbytes after";
  ResponseReader reader([](std::string_view name) { return http::iequals(name, "connection"); });
  Recorder rec;
  reader.start(rec, false, false);
  auto fed = reader.feed(bytes.data(), bytes.size());
  EXPECT_EQ(fed.state, ResponseReader::State::kComplete);
  EXPECT_EQ(bytes.substr(fed.used), "bytes after");  // not the 204's: whoever's is next
  EXPECT_EQ(rec.status, 204);
  ASSERT_EQ(rec.headers.size(), 1u);
  EXPECT_EQ(rec.headers[0].first, "X-A");  // the proxy drops it (fields.h); the reader keeps it
  EXPECT_EQ(rec.connection, "X-A, keep-alive,X-B");
}

TEST(Fields, ConnectionOptionsNameWholeTokens) {
  EXPECT_TRUE(connection_lists("keep-alive, X-Secret", "x-secret"));
  EXPECT_TRUE(connection_lists("X-A,X-Secret ,", "X-SECRET"));
  EXPECT_FALSE(connection_lists("x-secret-2", "x-secret"));
  EXPECT_FALSE(connection_lists("close", "close-not"));
  EXPECT_FALSE(connection_lists("", "x"));
  EXPECT_FALSE(connection_names_fields("close, Keep-Alive,"));
  EXPECT_FALSE(connection_names_fields(""));
  EXPECT_TRUE(connection_names_fields("keep-alive, x-a"));
}

}  // namespace
}  // namespace corral::proxy
