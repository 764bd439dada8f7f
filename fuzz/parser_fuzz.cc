// Fuzzes the HTTP/1.1 request parser (HeadScanner + RequestParser over llhttp) the way a
// connection drives it. Input layout: byte 0 picks how the bytes arrive (whole, one at a time, or
// random splits seeded by byte 2), byte 1 picks a set of small limits, the rest is the byte stream
// from the client. Every feed gets its own exactly-sized heap copy of the bytes not yet consumed,
// and the head is copied out on kHead as Connection does, so AddressSanitizer catches a view that
// outlives its bytes or reads past them.
//
// After each kComplete: method non-empty; target '/'-rooted, absolute-form, (CONNECT)
// authority-form, or starting with '*' (llhttp lets "*b" through: admission must then refuse it);
// every view inside the current input or the head copy; body == parser.body() and within max_body;
// head_len within max_head_bytes; consumed <= size; then next_request(). kError ends the stream.
// The sequence of requests and the final status must also be the same as when
// the whole input arrives at once (segmentation must not change the outcome).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/admission.h"
#include "http/parser.h"

namespace {

using corral::http::ParserLimits;
using corral::http::Request;
using corral::http::RequestParser;
using Kind = RequestParser::Kind;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool inside(std::string_view v, const char* base, size_t len) {
  if (v.empty()) return true;  // an empty view may point anywhere (or nowhere)
  return v.data() >= base && v.data() + v.size() <= base + len;
}

const ParserLimits kLimits[] = {
    {.max_request_line = 64, .max_head_bytes = 256, .max_headers = 4, .max_body = 32},
    {.max_request_line = 200, .max_head_bytes = 1024, .max_headers = 16, .max_body = 1024},
    {.max_request_line = 16, .max_head_bytes = 40, .max_headers = 1, .max_body = 0},
};

const corral::http::AdmissionPolicy& policy() {
  static const corral::http::AdmissionPolicy p;
  return p;
}

const corral::http::Peer& peer() {
  static const corral::http::Peer p =
      corral::http::Peer::from(corral::core::parse_address("127.0.0.1:40000").value());
  return p;
}

struct Summary {
  std::vector<std::string> requests;  // method, target, header count, body
  int error = 0;
  bool operator==(const Summary&) const = default;
};

// Arrival sizes: 0 = everything at once.
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

Summary drive(std::string_view stream, const std::vector<size_t>& sizes,
              const ParserLimits& limits) {
  Summary out;
  RequestParser parser(limits);
  Request req;
  std::string pending;                // received, not yet consumed
  std::unique_ptr<char[]> head_copy;  // the head of a request whose body is still coming
  size_t head_copy_len = 0;
  size_t offset = 0;
  for (size_t n : sizes) {
    pending.append(stream.substr(offset, n));
    offset += n;
    // Bounded: every pass consumes bytes, or stops for more input.
    for (size_t guard = 0; guard <= stream.size() + 2; ++guard) {
      const size_t size = pending.size();
      std::unique_ptr<char[]> buf(new char[size ? size : 1]);
      std::memcpy(buf.get(), pending.data(), size);
      auto r = parser.feed({buf.get(), size}, req);
      check(r.consumed <= size);
      if (r.kind == Kind::kError) {
        check(r.status >= 400 && r.status <= 505);
        check(!r.reason.empty());
        out.error = r.status;
        return out;
      }
      if (r.kind == Kind::kHead) {
        check(parser.head_done());
        check(parser.head_len() > 0 && parser.head_len() <= size);
        check(parser.head_len() <= limits.max_head_bytes);
        head_copy_len = parser.head_len();
        head_copy.reset(new char[head_copy_len]);
        std::memcpy(head_copy.get(), buf.get(), head_copy_len);
        req.rebase(buf.get(), head_copy_len, head_copy.get());
        pending.erase(0, r.consumed);
        continue;  // the rest of the body may already be here
      }
      if (r.kind == Kind::kNeedMore) {
        pending.erase(0, r.consumed);
        break;
      }
      // kComplete: the invariants a connection relies on before dispatching.
      check(!req.method_name.empty());
      std::string_view t = req.target;
      check(!t.empty());
      check(t[0] == '/' || t[0] == '*' || t.find("://") != std::string_view::npos ||
            req.method_name == "CONNECT");
      // llhttp lets "*b" through as a target; admission must refuse anything but "*" itself.
      if (t[0] == '*' && t != "*") check(corral::http::admit(req, peer(), policy()).status == 400);
      check(req.version_major == 1 && req.version_minor <= 1);
      check(req.headers.size() <= limits.max_headers);
      check(req.body == parser.body());
      check(req.body.size() <= limits.max_body);
      check(!parser.head_done() || parser.head_len() <= limits.max_head_bytes);
      auto in_place = [&](std::string_view v) {
        return inside(v, buf.get(), size) || inside(v, head_copy.get(), head_copy_len);
      };
      check(in_place(req.method_name) && in_place(req.target));
      check(in_place(req.path) && in_place(req.query));
      for (const auto& h : req.headers) {
        check(!h.name.empty());
        check(in_place(h.name) && in_place(h.value));
        check(h.value.empty() || (h.value.front() != ' ' && h.value.back() != ' '));
      }
      std::string line(req.method_name);
      line += ' ';
      line += req.target;
      line += ' ';
      line += std::to_string(req.headers.size());
      line += ' ';
      line += req.body;
      out.requests.push_back(std::move(line));
      pending.erase(0, r.consumed);
      parser.next_request();
      req.reset();
      head_copy.reset();
      head_copy_len = 0;
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
  Summary whole = drive(stream, split_sizes(0, 0, stream.size()), limits);
  if (mode % 3 != 0) {
    Summary split = drive(stream, split_sizes(mode, seed, stream.size()), limits);
    check(split == whole);
  }
  return 0;
}
