// Fuzzes the upstream client's HTTP/1.1 response reader (proxy/response_reader.h) the way an
// UpstreamConnection drives it: responses back to back (pipelined), each started with its own
// request flags, the bytes after a response's end fed to the next one, the upstream's close at
// the end. Input layout: byte 0 picks how the bytes arrive (whole, one at a time, or splits
// seeded by byte 1), byte 1's low bits the request flags of the responses (bit k: HEAD for the
// k-th, bit 7: an upgrade for the first), the rest is the byte stream from the upstream. Every
// feed gets its own exactly-sized heap copy, so AddressSanitizer catches a header name kept as a
// view past its read.
//
// Checked: used <= size; at most one head per response; no body after a HEAD's head; a head's
// status 101 only for an upgrade, otherwise 200..999; the sequence of events and the final
// state are the same as when the whole input arrives at once.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/response_reader.h"

namespace {

using corral::proxy::ResponseHead;
using corral::proxy::ResponseReader;
using State = ResponseReader::State;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool dropped(std::string_view name) {
  return name.size() == 4;
}  // any filter will do

struct Summary final : ResponseReader::Events {
  void on_head(ResponseHead& h) override {
    check(heads_now == 0);
    ++heads_now;
    check(h.status == 101 ? upgrade_now : h.status >= 200 && h.status <= 999);
    log.append("H").append(std::to_string(h.status));
    for (auto& [k, v] : h.headers) log.append("|").append(k).append("=").append(v);
    log.append("|ct=").append(h.content_type).append(";");
  }
  void on_body(std::string_view data) override {
    check(heads_now == 1 && !head_now);
    log.append(data);
  }
  bool operator==(const Summary& o) const { return log == o.log; }
  std::string log;
  int heads_now = 0;
  bool head_now = false;
  bool upgrade_now = false;
};

// The sizes in which `n` bytes arrive: whole (mode 0), one by one (1), or pseudo-random.
std::vector<size_t> split_sizes(uint8_t mode, uint8_t seed, size_t n) {
  std::vector<size_t> sizes;
  uint32_t x = seed * 2654435761u + 1;
  for (size_t left = n; left > 0;) {
    size_t s = left;
    if (mode % 3 == 1) {
      s = 1;
    } else if (mode % 3 == 2) {
      x = x * 1103515245u + 12345u;
      s = 1 + (x >> 16) % 64;
    }
    s = std::min(s, left);
    sizes.push_back(s);
    left -= s;
  }
  return sizes;
}

Summary drive(std::string_view stream, const std::vector<size_t>& sizes, uint8_t flags) {
  ResponseReader reader(dropped);
  Summary sum;
  int k = 0;
  auto start = [&] {
    sum.heads_now = 0;
    sum.head_now = (flags >> (k % 7)) & 1;
    sum.upgrade_now = k == 0 && (flags & 0x80);
    reader.start(sum, sum.head_now, sum.upgrade_now);
    sum.log.append("<");
  };
  start();
  std::string pending;  // bytes of the current piece not used by the response that ended
  size_t off = 0;
  for (size_t size : sizes) {
    pending.append(stream.substr(off, size));
    off += size;
    while (!pending.empty()) {
      auto copy = std::make_unique<char[]>(pending.size());
      std::memcpy(copy.get(), pending.data(), pending.size());
      auto fed = reader.feed(copy.get(), pending.size());
      check(fed.used <= pending.size());
      if (fed.state == State::kMore) {
        pending.clear();
        break;
      }
      if (fed.state != State::kComplete) {
        sum.log.append(fed.state == State::kSwitched ? "S" : "E");
        return sum;
      }
      sum.log.append(">");
      pending.erase(0, fed.used);
      ++k;
      start();
    }
  }
  sum.log.append(reader.finish() == State::kComplete ? "C" : "X");
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const uint8_t flags = data[1];
  std::string_view stream(reinterpret_cast<const char*>(data) + 2, size - 2);
  Summary whole = drive(stream, split_sizes(0, 0, stream.size()), flags);
  if (mode % 3 != 0) {
    Summary split = drive(stream, split_sizes(mode, flags, stream.size()), flags);
    check(split == whole);
  }
  return 0;
}
