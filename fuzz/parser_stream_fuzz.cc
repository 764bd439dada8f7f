// Fuzzes the streamed request body (RequestParser::feed_body, http/body_stream.h) against the
// buffered parser: the same byte stream, arriving whole, one byte at a time or in random splits
// (byte 0 picks how, byte 2 seeds the splits; byte 1 picks a set of small limits), is parsed once
// with every body buffered and once with every body streamed (the route rule says stream, with the
// same limit), the streamed pieces given exactly-sized heap copies of the input as a connection's
// reads would be. Both must see the same requests (method, target, header count, body) and end
// with the same error status; every piece must lie inside the bytes fed (Content-Length: a view
// of them) and consume no more than was fed. A request that is not keep-alive ends the stream, as
// the connection closes after its response.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/parser.h"

namespace {

using corral::http::BodyRule;
using corral::http::BodyRules;
using corral::http::ParserLimits;
using corral::http::Request;
using corral::http::RequestParser;
using Kind = RequestParser::Kind;
using Step = RequestParser::BodyStep::State;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

const ParserLimits kLimits[] = {
    {.max_request_line = 64, .max_head_bytes = 256, .max_headers = 4, .max_body = 32},
    {.max_request_line = 200, .max_head_bytes = 1024, .max_headers = 16, .max_body = 1024},
    {.max_request_line = 16, .max_head_bytes = 40, .max_headers = 1, .max_body = 0},
};

struct StreamAll final : BodyRules {
  explicit StreamAll(uint64_t max) : max_body(max) {}
  BodyRule body_rule(Request&) override { return {max_body, true}; }
  uint64_t max_body;
};

struct Summary {
  std::vector<std::string> requests;
  int error = 0;
  bool operator==(const Summary&) const = default;
};

std::vector<size_t> split_sizes(uint8_t mode, uint8_t seed, size_t total) {
  std::vector<size_t> sizes;
  switch (mode % 3) {
    case 0:
      sizes.push_back(total);
      break;
    case 1:
      sizes.assign(total, 1);
      break;
    default: {
      uint32_t s = seed * 2654435761u + 1;
      for (size_t left = total; left > 0;) {
        s = s * 1103515245u + 12345u;
        size_t n = 1 + (s >> 16) % 17;
        if (n > left) n = left;
        sizes.push_back(n);
        left -= n;
      }
    }
  }
  return sizes;
}

std::string line(const Request& req, std::string_view body) {
  std::string l(req.method_name);
  l.append(" ").append(req.target).append(" ").append(std::to_string(req.headers.size()));
  l.append(" ").append(body);
  return l;
}

Summary drive(std::string_view stream, const std::vector<size_t>& sizes, const ParserLimits& limits,
              bool streamed) {
  Summary out;
  StreamAll rules(limits.max_body);
  RequestParser parser(limits);
  if (streamed) parser.set_body_rules(&rules);
  Request req;
  std::string pending;
  std::string head;  // the head's copy once kHead came
  std::string body;  // a streamed body so far
  bool in_body = false;
  size_t offset = 0;
  for (size_t n : sizes) {
    pending.append(stream.substr(offset, n));
    offset += n;
    for (size_t guard = 0; guard <= stream.size() + 2; ++guard) {
      const size_t size = pending.size();
      std::unique_ptr<char[]> buf(new char[size ? size : 1]);
      std::memcpy(buf.get(), pending.data(), size);
      if (in_body) {
        if (size == 0) break;
        auto s = parser.feed_body({buf.get(), size});
        check(s.consumed <= size);
        if (s.state == Step::kError) {
          out.error = s.status;
          return out;
        }
        if (!s.piece.empty() && !parser.chunked())
          check(s.piece.data() >= buf.get() && s.piece.data() + s.piece.size() <= buf.get() + size);
        body.append(s.piece);
        check(body.size() <= limits.max_body);
        pending.erase(0, s.consumed);
        if (s.state == Step::kMore) break;  // all of it taken: more must come
        out.requests.push_back(line(req, body));
        if (!parser.keep_alive()) return out;  // the connection closes after its response
        in_body = false;
        body.clear();
        parser.next_request();
        req.reset();
        if (pending.empty()) break;
        continue;
      }
      auto r = parser.feed({buf.get(), size}, req);
      check(r.consumed <= size);
      if (r.kind == Kind::kError) {
        out.error = r.status;
        return out;
      }
      if (r.kind == Kind::kHead) {
        head.assign(buf.get(), parser.head_len());
        req.rebase(buf.get(), head.size(), head.data());
        pending.erase(0, r.consumed);
        if (parser.streaming()) in_body = true;
        continue;
      }
      if (r.kind == Kind::kNeedMore) {
        pending.erase(0, r.consumed);
        break;
      }
      check(!streamed || !parser.streaming());
      out.requests.push_back(line(req, req.body));
      if (!parser.keep_alive()) return out;  // the connection closes after its response
      pending.erase(0, r.consumed);
      parser.next_request();
      req.reset();
      if (pending.empty()) break;
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const uint8_t seed = size > 2 ? data[2] : 0;
  const ParserLimits& limits = kLimits[data[1] % std::size(kLimits)];
  std::string_view stream(reinterpret_cast<const char*>(data) + 2, size - 2);
  auto sizes = split_sizes(mode, seed, stream.size());
  Summary buffered = drive(stream, sizes, limits, false);
  Summary streamed = drive(stream, sizes, limits, true);
  check(buffered == streamed);
  return 0;
}
