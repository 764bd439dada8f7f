// Fuzzes the WebSocket frame decoder (src/ws/frame.h). Byte 0 picks the configuration: bit 0
// permessage-deflate negotiated, bit 1 client_no_context_takeover, bits 2-3 how the rest of the
// input is split across feed() calls (whole, one byte at a time, chunks of 1..16 bytes from bits
// 4-7, or pseudo-random cuts seeded by byte 0). The rest is what a client sends.
//
// Invariants: the chosen split reports exactly the events of one whole feed (nothing depends on
// how bytes arrive); nothing follows a close or an error; an error's code is 1002, 1007 or 1009;
// a close code is 1005 or valid_close_code(); text messages and close reasons are valid UTF-8;
// no message exceeds max_message nor a control payload 125 bytes; the decoder's buffer stays
// within max_message + 64 KiB (deflate bombs included). Every message delivered, re-encoded by
// FrameEncoder (compressed when deflate is on) and masked, decodes to itself.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/buffer.h"
#include "ws/frame.h"
#include "ws/utf8.h"

namespace {

using corral::ws::DecoderLimits;
using corral::ws::FrameDecoder;
using corral::ws::FrameEncoder;
using corral::ws::FrameHandler;
using corral::ws::Opcode;

constexpr uint64_t kMaxMessage = 64 * 1024;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

struct Event {
  int kind;  // 0 message, 1 ping, 2 pong, 3 close, 4 error
  int code;  // opcode or close code
  std::string payload;
  bool operator==(const Event&) const = default;
};

struct Recorder : FrameHandler {
  std::vector<Event> events;
  bool ended = false;

  void add(int kind, int code, std::string_view p) {
    check(!ended);
    events.push_back({kind, code, std::string(p)});
  }
  void on_message(Opcode op, std::string_view p) override {
    check(op == Opcode::kText || op == Opcode::kBinary);
    check(p.size() <= kMaxMessage);
    if (op == Opcode::kText) check(corral::ws::is_valid_utf8(p));
    add(0, static_cast<int>(op), p);
  }
  void on_ping(std::string_view p) override {
    check(p.size() <= 125);
    add(1, 0, p);
  }
  void on_pong(std::string_view p) override {
    check(p.size() <= 125);
    add(2, 0, p);
  }
  void on_close(uint16_t code, std::string_view reason) override {
    check(code == corral::ws::kCloseNoStatus || corral::ws::valid_close_code(code));
    check(reason.size() <= 123 && corral::ws::is_valid_utf8(reason));
    add(3, code, reason);
    ended = true;
  }
  void on_error(uint16_t code, std::string_view reason) override {
    check(code == 1002 || code == 1007 || code == 1009);
    check(!reason.empty());
    add(4, code, {});
    ended = true;
  }
};

// Feeds `in` cut at the given lengths (0 = the rest).
std::vector<Event> run(std::string_view in, const DecoderLimits& limits,
                       const std::vector<size_t>& cuts) {
  FrameDecoder d(limits);
  Recorder r;
  size_t pos = 0;
  size_t i = 0;
  while (pos < in.size() && !d.done()) {
    size_t n = in.size() - pos;
    if (!cuts.empty()) n = std::min(n, cuts[i++ % cuts.size()]);
    const size_t used = d.feed(in.substr(pos, n), r);
    check(used <= n);
    check(d.done() || used == n);
    check(d.buffer_capacity() <= kMaxMessage + 64 * 1024 + 1);
    pos += n;
  }
  check(d.done() == r.ended);
  return r.events;
}

// A server's frames as a client would send them: mask bit set, payload masked.
std::string masked(std::string_view s) {
  static constexpr unsigned char kMask[4] = {0xa1, 0x5c, 0x03, 0xfe};
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    check(s.size() - i >= 2);
    const unsigned len7 = static_cast<unsigned char>(s[i + 1]) & 0x7F;
    size_t hl = len7 == 126 ? 4 : len7 == 127 ? 10 : 2;
    uint64_t len = len7;
    if (len7 >= 126) {
      len = 0;
      for (size_t k = 2; k < hl; ++k) len = (len << 8) | static_cast<unsigned char>(s[i + k]);
    }
    check(s.size() - i - hl >= len);
    out.append(s.substr(i, hl));
    out[out.size() - hl + 1] = static_cast<char>(out[out.size() - hl + 1] | 0x80);
    out.append(reinterpret_cast<const char*>(kMask), 4);
    for (size_t k = 0; k < len; ++k) out.push_back(static_cast<char>(s[i + hl + k] ^ kMask[k % 4]));
    i += hl + len;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t config = data[0];
  DecoderLimits limits;
  limits.max_message = kMaxMessage;
  limits.deflate = config & 1;
  limits.client_no_context_takeover = (config & 2) != 0;

  // A heap copy of exactly the input, so AddressSanitizer sees reads past its end.
  std::vector<char> buf(data + 1, data + size);
  const std::string_view in(buf.data(), buf.size());

  std::vector<size_t> cuts;
  switch ((config >> 2) & 3) {
    case 0:
      break;
    case 1:
      cuts = {1};
      break;
    case 2:
      cuts = {static_cast<size_t>(config >> 4) + 1};
      break;
    default: {
      uint32_t x = config * 2654435761u + 1;
      for (int i = 0; i < 16; ++i) {
        x = x * 1103515245u + 12345u;
        cuts.push_back((x >> 16) % 23 + 1);
      }
    }
  }
  const std::vector<Event> whole = run(in, limits, {});
  check(run(in, limits, cuts) == whole);

  // Round trip through the encoder.
  corral::ws::DeflateParams params;
  params.server_no_context_takeover = limits.client_no_context_takeover;
  FrameEncoder enc = limits.deflate ? FrameEncoder(params) : FrameEncoder();
  corral::core::Buffer out;
  std::vector<Event> messages;
  for (const Event& e : whole) {
    if (e.kind != 0) continue;
    messages.push_back(e);
    enc.encode_message_compressed(static_cast<Opcode>(e.code), e.payload, out);
  }
  if (!messages.empty()) check(run(masked(out.view()), limits, cuts) == messages);
  return 0;
}
