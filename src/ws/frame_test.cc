#include "ws/frame.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace corral::ws {
namespace {

using Events = std::vector<std::string>;

struct Recorder : FrameHandler {
  Events events;
  void on_message(Opcode op, std::string_view p) override {
    events.push_back((op == Opcode::kText ? "text:" : "binary:") + std::string(p));
  }
  void on_ping(std::string_view p) override { events.push_back("ping:" + std::string(p)); }
  void on_pong(std::string_view p) override { events.push_back("pong:" + std::string(p)); }
  void on_close(uint16_t code, std::string_view reason) override {
    events.push_back("close:" + std::to_string(code) + ":" + std::string(reason));
  }
  void on_error(uint16_t code, std::string_view) override {
    events.push_back("error:" + std::to_string(code));
  }
};

constexpr unsigned char kMask[4] = {0x37, 0xfa, 0x21, 0x3d};  // RFC 6455 §5.7's key

// A client frame: `b0` is FIN | RSV | opcode; `len_form` 0 = minimal, 126 or 127 = that form.
std::string raw_frame(unsigned b0, std::string_view payload, bool masked = true, int len_form = 0) {
  std::string f;
  f.push_back(static_cast<char>(b0));
  const uint64_t len = payload.size();
  const unsigned mbit = masked ? 0x80 : 0;
  if (len_form == 0) len_form = len < 126 ? 0 : len <= 0xFFFF ? 126 : 127;
  if (len_form == 0) {
    f.push_back(static_cast<char>(mbit | len));
  } else if (len_form == 126) {
    f.push_back(static_cast<char>(mbit | 126));
    f.push_back(static_cast<char>(len >> 8));
    f.push_back(static_cast<char>(len));
  } else {
    f.push_back(static_cast<char>(mbit | 127));
    for (int i = 7; i >= 0; --i) f.push_back(static_cast<char>(len >> (8 * i)));
  }
  if (masked) {
    f.append(reinterpret_cast<const char*>(kMask), 4);
    for (size_t i = 0; i < payload.size(); ++i)
      f.push_back(static_cast<char>(payload[i] ^ kMask[i % 4]));
  } else {
    f.append(payload);
  }
  return f;
}

std::string frame(Opcode op, std::string_view payload, bool fin = true, bool rsv1 = false) {
  return raw_frame((fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) | static_cast<unsigned>(op), payload);
}

std::string close_frame(uint16_t code, std::string_view reason = {}) {
  std::string body{static_cast<char>(code >> 8), static_cast<char>(code & 0xFF)};
  return frame(Opcode::kClose, body + std::string(reason));
}

Events run(std::string_view input, const DecoderLimits& limits, size_t chunk) {
  FrameDecoder d(limits);
  Recorder r;
  size_t pos = 0;
  while (pos < input.size() && !d.done()) {
    const size_t n = chunk == 0 ? input.size() - pos : std::min(chunk, input.size() - pos);
    const size_t used = d.feed(input.substr(pos, n), r);
    EXPECT_LE(used, n);
    if (!d.done()) {
      EXPECT_EQ(used, n);
    }
    pos += n;
  }
  if (d.done()) {
    EXPECT_EQ(d.feed("more", r), 0u);
  }
  return r.events;
}

// Decodes whole, one byte at a time and in a few odd chunk sizes; every split must agree.
Events decode(std::string_view input, const DecoderLimits& limits = {}) {
  const Events whole = run(input, limits, 0);
  for (size_t chunk : {1, 2, 3, 5, 7, 64, 1000}) {
    EXPECT_EQ(whole, run(input, limits, chunk)) << "split in chunks of " << chunk;
  }
  return whole;
}

DecoderLimits deflate_limits(bool no_takeover = false) {
  DecoderLimits l;
  l.deflate = true;
  l.client_no_context_takeover = no_takeover;
  return l;
}

std::string bytes(std::initializer_list<unsigned> b) {
  std::string s;
  for (unsigned c : b) s.push_back(static_cast<char>(c));
  return s;
}

// ---------------------------------------------------------------------------------------------
// RFC 6455 §5.7 examples

TEST(FrameDecoder, Rfc6455Examples) {
  // A single-frame masked text message.
  EXPECT_EQ(decode(bytes({0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58})),
            Events{"text:Hello"});
  // The same unmasked, as the RFC shows it from a server: a client must mask.
  EXPECT_EQ(decode(bytes({0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f})), Events{"error:1002"});
  // A fragmented unmasked text message, masked as a client sends it.
  EXPECT_EQ(decode(raw_frame(0x01, "Hel") + raw_frame(0x80, "lo")), Events{"text:Hello"});
  // Ping and a masked pong.
  EXPECT_EQ(decode(raw_frame(0x89, "Hello")), Events{"ping:Hello"});
  EXPECT_EQ(decode(bytes({0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58})),
            Events{"pong:Hello"});
  // 256 bytes and 64 KiB in one binary frame: 16-bit and 64-bit length forms.
  const std::string b256(256, 'x');
  std::string f256 = raw_frame(0x82, b256);
  EXPECT_EQ(static_cast<unsigned char>(f256[1]), 0xFE);
  EXPECT_EQ(f256.substr(2, 2), bytes({0x01, 0x00}));
  EXPECT_EQ(decode(f256), Events{"binary:" + b256});
  std::string b64k(65536, '\0');
  for (size_t i = 0; i < b64k.size(); ++i) b64k[i] = static_cast<char>(i * 7);
  std::string f64k = raw_frame(0x82, b64k);
  EXPECT_EQ(f64k.substr(1, 9), bytes({0xFF, 0, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(decode(f64k), Events{"binary:" + b64k});
}

TEST(FrameDecoder, ManyMessagesAndEmptyOnes) {
  std::string in = frame(Opcode::kText, "") + frame(Opcode::kBinary, "") +
                   frame(Opcode::kText, "", false) + frame(Opcode::kContinuation, "", false) +
                   frame(Opcode::kContinuation, "") + frame(Opcode::kPing, "") +
                   frame(Opcode::kText, "a") + frame(Opcode::kBinary, std::string(200, 'b'));
  EXPECT_EQ(decode(in), (Events{"text:", "binary:", "text:", "ping:", "text:a",
                                "binary:" + std::string(200, 'b')}));
}

TEST(FrameDecoder, ControlFramesInterleaveWithFragments) {
  std::string in = frame(Opcode::kText, "Hel", false) + frame(Opcode::kPing, "p1") +
                   frame(Opcode::kContinuation, "l", false) + frame(Opcode::kPong, "p2") +
                   frame(Opcode::kContinuation, "o") + frame(Opcode::kBinary, "next");
  EXPECT_EQ(decode(in), (Events{"ping:p1", "pong:p2", "text:Hello", "binary:next"}));
  // A close in the middle of a fragmented message ends decoding.
  std::string in2 = frame(Opcode::kBinary, "ab", false) + close_frame(1001, "bye") +
                    frame(Opcode::kContinuation, "cd");
  EXPECT_EQ(decode(in2), Events{"close:1001:bye"});
}

TEST(FrameDecoder, NonMinimalLengthsAreAccepted) {
  EXPECT_EQ(decode(raw_frame(0x81, "Hello", true, 126)), Events{"text:Hello"});
  EXPECT_EQ(decode(raw_frame(0x81, "Hello", true, 127)), Events{"text:Hello"});
}

// ---------------------------------------------------------------------------------------------
// Protocol errors, each with its close code

TEST(FrameDecoder, ProtocolErrors1002) {
  const std::string msg = frame(Opcode::kText, "x", false);
  struct Case {
    const char* what;
    std::string input;
    DecoderLimits limits;
    size_t before = 0;  // events before the error
  };
  const Case cases[] = {
      {"unmasked", raw_frame(0x81, "Hello", false), {}},
      {"unmasked control", raw_frame(0x89, "", false), {}},
      {"RSV1 without deflate", raw_frame(0xC1, "x"), {}},
      {"RSV1 on continuation", msg + raw_frame(0xC0, "y"), deflate_limits()},
      {"RSV1 on ping", raw_frame(0xC9, ""), deflate_limits()},
      {"RSV1 on close", raw_frame(0xC8, ""), deflate_limits()},
      {"RSV2", raw_frame(0xA1, "x"), {}},
      {"RSV3", raw_frame(0x91, "x"), {}},
      {"RSV2 with deflate", raw_frame(0xA1, "x"), deflate_limits()},
      {"opcode 3", raw_frame(0x83, ""), {}},
      {"opcode 7", raw_frame(0x87, ""), {}},
      {"opcode 11", raw_frame(0x8B, ""), {}},
      {"opcode 15", raw_frame(0x8F, ""), {}},
      {"ping of 126 bytes", raw_frame(0x89, std::string(126, 'p')), {}},
      {"close of 126 bytes", raw_frame(0x88, bytes({3, 0xE8}) + std::string(124, 'r')), {}},
      {"pong with 16-bit length", raw_frame(0x8A, "x", true, 126), {}},
      {"fragmented ping", raw_frame(0x09, "x"), {}},
      {"fragmented close", raw_frame(0x08, ""), {}},
      {"continuation first", frame(Opcode::kContinuation, "x"), {}},
      {"continuation after a whole message",
       frame(Opcode::kText, "a") + frame(Opcode::kContinuation, "b"),
       {},
       1},
      {"text inside a message", msg + frame(Opcode::kText, "y"), {}},
      {"binary inside a message", msg + frame(Opcode::kBinary, "y"), {}},
      {"64-bit length with the high bit",
       bytes({0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 5, 1, 2, 3, 4}),
       {}},
      {"close with 1 byte", frame(Opcode::kClose, "\x03"), {}},
  };
  for (const Case& c : cases) {
    Events e = decode(c.input, c.limits);
    ASSERT_FALSE(e.empty()) << c.what;
    EXPECT_EQ(e.back(), "error:1002") << c.what;
    EXPECT_EQ(e.size(), c.before + 1) << c.what;  // no partial message was delivered
  }
}

TEST(FrameDecoder, NothingAfterAnError) {
  FrameDecoder d;
  Recorder r;
  std::string in = raw_frame(0x81, "x", false) + frame(Opcode::kText, "later");
  EXPECT_EQ(d.feed(in, r), 2u);  // stopped at the second header byte (the mask bit)
  EXPECT_TRUE(d.done());
  EXPECT_EQ(d.feed(frame(Opcode::kText, "y"), r), 0u);
  EXPECT_EQ(r.events, Events{"error:1002"});
}

TEST(FrameDecoder, CloseCodes) {
  EXPECT_EQ(decode(frame(Opcode::kClose, "")), Events{"close:1005:"});
  for (uint16_t code : {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014,
                        3000, 3999, 4000, 4999}) {
    EXPECT_EQ(decode(close_frame(code, "why")), Events{"close:" + std::to_string(code) + ":why"})
        << code;
  }
  for (uint16_t code : {0, 1, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535}) {
    EXPECT_EQ(decode(close_frame(code)), Events{"error:1002"}) << code;
  }
  EXPECT_EQ(decode(close_frame(1000, "caf\xc3\xa9")), Events{"close:1000:caf\xc3\xa9"});
  EXPECT_EQ(decode(close_frame(1000, "bad \xff")), Events{"error:1007"});
  EXPECT_EQ(decode(close_frame(1000, "cut \xe2\x82")), Events{"error:1007"});
  EXPECT_EQ(decode(close_frame(1000, std::string(123, 'r'))),
            Events{"close:1000:" + std::string(123, 'r')});
  // Nothing after a close is decoded, and feed() says where the close frame ended.
  FrameDecoder d;
  Recorder r;
  std::string in = close_frame(1000) + frame(Opcode::kText, "late");
  EXPECT_EQ(d.feed(in, r), close_frame(1000).size());
  EXPECT_EQ(r.events, Events{"close:1000:"});
}

TEST(FrameDecoder, ValidCloseCode) {
  EXPECT_FALSE(valid_close_code(999));
  EXPECT_TRUE(valid_close_code(1000));
  EXPECT_TRUE(valid_close_code(1003));
  EXPECT_FALSE(valid_close_code(1004));
  EXPECT_FALSE(valid_close_code(1005));
  EXPECT_FALSE(valid_close_code(1006));
  EXPECT_TRUE(valid_close_code(1007));
  EXPECT_TRUE(valid_close_code(1014));
  EXPECT_FALSE(valid_close_code(1015));
  EXPECT_FALSE(valid_close_code(1016));
  EXPECT_FALSE(valid_close_code(2999));
  EXPECT_TRUE(valid_close_code(3000));
  EXPECT_TRUE(valid_close_code(4999));
  EXPECT_FALSE(valid_close_code(5000));
}

TEST(FrameDecoder, InvalidUtf8Is1007) {
  EXPECT_EQ(decode(frame(Opcode::kText, "bad \xc0\x80")), Events{"error:1007"});
  EXPECT_EQ(decode(frame(Opcode::kText, "\xed\xa0\x80")), Events{"error:1007"});
  EXPECT_EQ(decode(frame(Opcode::kText, "\xf4\x90\x80\x80")), Events{"error:1007"});
  // Ends inside a sequence.
  EXPECT_EQ(decode(frame(Opcode::kText, "\xe2\x82")), Events{"error:1007"});
  EXPECT_EQ(decode(frame(Opcode::kText, "\xe2", false) + frame(Opcode::kContinuation, "\x82")),
            Events{"error:1007"});
  // A code point split across fragments is fine.
  EXPECT_EQ(decode(frame(Opcode::kText, "\xe2", false) + frame(Opcode::kContinuation, "\x82\xac")),
            Events{"text:\xe2\x82\xac"});
  // Binary is not checked.
  EXPECT_EQ(decode(frame(Opcode::kBinary, "\xff")), Events{"binary:\xff"});
}

TEST(FrameDecoder, InvalidUtf8FailsFast) {
  // The first fragment is already invalid: 1007 before the message ends.
  FrameDecoder d;
  Recorder r;
  d.feed(frame(Opcode::kText, "ok \xff", false), r);
  EXPECT_EQ(r.events, Events{"error:1007"});
  // Even inside one frame whose end has not arrived.
  FrameDecoder d2;
  Recorder r2;
  std::string f = frame(Opcode::kText, "\xc0" + std::string(1000, 'a'));
  d2.feed(std::string_view(f).substr(0, 10), r2);
  EXPECT_EQ(r2.events, Events{"error:1007"});
}

TEST(FrameDecoder, MessageTooBigIs1009FromTheHeader) {
  DecoderLimits l;
  l.max_message = 100;
  EXPECT_EQ(decode(frame(Opcode::kBinary, std::string(100, 'x')), l),
            Events{"binary:" + std::string(100, 'x')});
  EXPECT_EQ(decode(frame(Opcode::kBinary, std::string(101, 'x')), l), Events{"error:1009"});
  // Sum of fragments.
  EXPECT_EQ(decode(frame(Opcode::kText, std::string(60, 'a'), false) + frame(Opcode::kPing, "") +
                       frame(Opcode::kContinuation, std::string(41, 'b')),
                   l),
            (Events{"ping:", "error:1009"}));
  // Refused from the header alone: no payload needed, none buffered.
  FrameDecoder d(l);
  Recorder r;
  const std::string header = bytes({0x82, 0xFF, 0, 0, 0, 1, 0, 0, 0, 0, 1, 2, 3, 4});
  EXPECT_EQ(d.feed(header, r), header.size());
  EXPECT_EQ(r.events, Events{"error:1009"});
  EXPECT_EQ(d.buffer_capacity(), 0u);
}

TEST(FrameDecoder, BufferGrowsWithArrivingBytesNotClaims) {
  FrameDecoder d;  // 16 MiB limit
  Recorder r;
  // Claims 8 MiB, sends 10 bytes.
  std::string f = raw_frame(0x82, std::string(8 << 20, 'z'));
  d.feed(std::string_view(f).substr(0, 14 + 10), r);
  EXPECT_TRUE(r.events.empty());
  EXPECT_LE(d.buffer_capacity(), 4096u);
  EXPECT_TRUE(d.in_message());
  d.feed(std::string_view(f).substr(24), r);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_LE(d.buffer_capacity(), size_t{16} << 20);
  d.release_memory();
  EXPECT_EQ(d.buffer_capacity(), 0u);
}

struct Stopper : Recorder {
  FrameDecoder* d = nullptr;
  void on_message(Opcode op, std::string_view p) override {
    Recorder::on_message(op, p);
    d->stop();
  }
};

TEST(FrameDecoder, StopFromACallback) {
  FrameDecoder d;
  Stopper s;
  s.d = &d;
  const std::string first = frame(Opcode::kText, "one");
  EXPECT_EQ(d.feed(first + frame(Opcode::kText, "two"), s), first.size());
  EXPECT_EQ(s.events, Events{"text:one"});
  EXPECT_TRUE(d.done());
}

// ---------------------------------------------------------------------------------------------
// permessage-deflate

TEST(FrameDecoder, Rfc7692Examples) {
  const std::string hello = bytes({0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00});
  // §7.2.3.1: a message in one compressed frame, then fragmented.
  EXPECT_EQ(decode(raw_frame(0xC1, hello), deflate_limits()), Events{"text:Hello"});
  EXPECT_EQ(decode(raw_frame(0x41, hello.substr(0, 3)) + raw_frame(0x80, hello.substr(3)),
                   deflate_limits()),
            Events{"text:Hello"});
  // §7.2.3.2: the second message refers back to the first one's "Hello".
  const std::string again = bytes({0xf2, 0x00, 0x11, 0x00, 0x00});
  EXPECT_EQ(decode(raw_frame(0xC1, hello) + raw_frame(0xC1, again), deflate_limits()),
            (Events{"text:Hello", "text:Hello"}));
  // Without context takeover the back reference points nowhere.
  EXPECT_EQ(decode(raw_frame(0xC1, hello) + raw_frame(0xC1, again), deflate_limits(true)),
            (Events{"text:Hello", "error:1007"}));
  // §7.2.3.4: a stored (uncompressed) DEFLATE block.
  EXPECT_EQ(decode(raw_frame(0xC1, bytes({0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c,
                                          0x6f, 0x00})),
                   deflate_limits()),
            Events{"text:Hello"});
  // A message without RSV1 is not compressed, even with deflate negotiated.
  EXPECT_EQ(decode(frame(Opcode::kText, "plain"), deflate_limits()), Events{"text:plain"});
  // Control frames interleave with compressed fragments.
  EXPECT_EQ(decode(raw_frame(0x41, hello.substr(0, 3)) + frame(Opcode::kPing, "p") +
                       raw_frame(0x80, hello.substr(3)),
                   deflate_limits()),
            (Events{"ping:p", "text:Hello"}));
}

// Raw deflate of `data` with zlib: sync-flushed, tail stripped, as RFC 7692 senders do; or
// finished with a final block (BFINAL) with Z_FINISH; or not flushed (more follows) with
// Z_NO_FLUSH.
std::string client_deflate(z_stream* z, std::string_view data, int flush = Z_SYNC_FLUSH) {
  z->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z->avail_in = static_cast<uInt>(data.size());
  std::string out;
  char buf[4096];
  do {
    z->next_out = reinterpret_cast<Bytef*>(buf);
    z->avail_out = sizeof buf;
    int rc = deflate(z, flush);
    EXPECT_TRUE(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR);
    out.append(buf, sizeof buf - z->avail_out);
  } while (z->avail_out == 0);
  if (flush == Z_SYNC_FLUSH) {
    EXPECT_EQ(out.substr(out.size() - 4), bytes({0, 0, 0xff, 0xff}));
    out.resize(out.size() - 4);
  }
  return out;
}

TEST(FrameDecoder, FinalBlockEndsTheStream) {
  z_stream z{};
  ASSERT_EQ(deflateInit2(&z, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string a = client_deflate(&z, "first message, finished", Z_FINISH);
  deflateReset(&z);
  std::string b = client_deflate(&z, "second message, sync-flushed");
  deflateEnd(&z);
  EXPECT_EQ(decode(raw_frame(0xC1, a) + raw_frame(0xC1, b), deflate_limits()),
            (Events{"text:first message, finished", "text:second message, sync-flushed"}));
}

TEST(FrameDecoder, InvalidDeflateDataIs1007) {
  EXPECT_EQ(decode(raw_frame(0xC2, bytes({0xff, 0xff, 0xff, 0xff})), deflate_limits()),
            Events{"error:1007"});
}

TEST(FrameDecoder, InflatedInvalidUtf8Is1007) {
  z_stream z{};
  ASSERT_EQ(deflateInit2(&z, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string c = client_deflate(&z, "text then \xff");
  deflateEnd(&z);
  EXPECT_EQ(decode(raw_frame(0xC1, c), deflate_limits()), Events{"error:1007"});
}

TEST(FrameDecoder, DeflateBombIs1009WithBoundedMemory) {
  z_stream z{};
  ASSERT_EQ(deflateInit2(&z, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  const std::string zeros(1 << 20, '\0');
  std::string bomb;  // 100 MiB of zeros, about 100 KB compressed
  for (int i = 0; i < 100; ++i)
    bomb += client_deflate(&z, zeros, i < 99 ? Z_NO_FLUSH : Z_SYNC_FLUSH);
  deflateEnd(&z);
  EXPECT_LT(bomb.size(), size_t{200} << 10);

  DecoderLimits l = deflate_limits();  // max_message 16 MiB
  for (size_t chunk : {size_t{0}, size_t{1}, size_t{4096}}) {
    for (bool fragmented : {false, true}) {
      std::string in =
          fragmented ? raw_frame(0x42, bomb.substr(0, 1000)) + raw_frame(0x80, bomb.substr(1000))
                     : raw_frame(0xC2, bomb);
      FrameDecoder d(l);
      Recorder r;
      for (size_t pos = 0; pos < in.size() && !d.done();) {
        const size_t n = chunk == 0 ? in.size() : std::min(chunk, in.size() - pos);
        d.feed(std::string_view(in).substr(pos, n), r);
        pos += n;
      }
      EXPECT_EQ(r.events, Events{"error:1009"});
      EXPECT_LE(d.buffer_capacity(), l.max_message + 64 * 1024);
    }
  }
}

TEST(FrameDecoder, CompressedWireSizeIsLimitedToo) {
  DecoderLimits l = deflate_limits();
  l.max_message = 1000;
  // Empty stored blocks inflate to nothing: only the wire limit stops them.
  std::string empties;
  while (empties.size() < 4000) empties += bytes({0x00, 0x00, 0x00, 0xff, 0xff});
  EXPECT_EQ(decode(raw_frame(0xC2, empties), l), Events{"error:1009"});
}

// Masks a server frame sequence so the decoder accepts it as if a client sent it.
std::string as_client(std::string_view server) {
  std::string out;
  size_t i = 0;
  while (i < server.size()) {
    const unsigned char b0 = static_cast<unsigned char>(server[i]);
    const unsigned len7 = static_cast<unsigned char>(server[i + 1]) & 0x7F;
    EXPECT_EQ(static_cast<unsigned char>(server[i + 1]) & 0x80, 0u);  // servers never mask
    size_t hl = 2;
    uint64_t len = len7;
    if (len7 == 126) {
      hl = 4;
      len = (uint64_t{static_cast<unsigned char>(server[i + 2])} << 8) |
            static_cast<unsigned char>(server[i + 3]);
      EXPECT_GE(len, 126u);  // minimal length encoding
    } else if (len7 == 127) {
      hl = 10;
      len = 0;
      for (int k = 0; k < 8; ++k) len = (len << 8) | static_cast<unsigned char>(server[i + 2 + k]);
      EXPECT_GT(len, 0xFFFFu);
    }
    out += raw_frame(b0, server.substr(i + hl, len));
    i += hl + len;
  }
  return out;
}

TEST(FrameEncoder, PlainFrames) {
  FrameEncoder e;
  core::Buffer out;
  e.encode(Opcode::kText, "Hello", out);
  EXPECT_EQ(out.view(), bytes({0x81, 0x05}) + "Hello");
  out.clear();
  e.encode(Opcode::kText, "Hel", out, false);
  e.encode(Opcode::kContinuation, "lo", out);
  EXPECT_EQ(out.view(), bytes({0x01, 0x03}) + "Hel" + bytes({0x80, 0x02}) + "lo");
  out.clear();
  e.encode(Opcode::kBinary, std::string(125, 'a'), out);
  EXPECT_EQ(out.view().substr(0, 2), bytes({0x82, 125}));
  out.clear();
  e.encode(Opcode::kBinary, std::string(126, 'a'), out);
  EXPECT_EQ(out.view().substr(0, 4), bytes({0x82, 126, 0, 126}));
  out.clear();
  e.encode(Opcode::kBinary, std::string(65535, 'a'), out);
  EXPECT_EQ(out.view().substr(0, 4), bytes({0x82, 126, 0xff, 0xff}));
  out.clear();
  e.encode(Opcode::kBinary, std::string(65536, 'a'), out);
  EXPECT_EQ(out.view().substr(0, 10), bytes({0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(out.size(), 65546u);
  out.clear();
  e.encode(Opcode::kPing, std::string(200, 'p'), out, false);  // cut to 125, never fragmented
  EXPECT_EQ(out.view().substr(0, 2), bytes({0x89, 125}));
  EXPECT_EQ(out.size(), 127u);
}

TEST(FrameEncoder, CloseFrames) {
  FrameEncoder e;
  core::Buffer out;
  e.encode_close(1000, "bye", out);
  EXPECT_EQ(out.view(), bytes({0x88, 0x05, 0x03, 0xe8}) + "bye");
  out.clear();
  e.encode_close(kCloseNoStatus, "ignored", out);
  EXPECT_EQ(out.view(), bytes({0x88, 0x00}));
  out.clear();
  // 122 ASCII bytes then a 2-byte code point: 124 bytes, cut to 122, not in the middle.
  e.encode_close(1001, std::string(122, 'r') + "\xc3\xa9", out);
  EXPECT_EQ(out.size(), 2u + 2 + 122);
  EXPECT_EQ(decode(as_client(out.view())), Events{"close:1001:" + std::string(122, 'r')});
}

// Every message the encoder compresses decodes to itself, across both context modes.
TEST(FrameEncoder, DeflateRoundTrip) {
  std::vector<std::pair<Opcode, std::string>> msgs = {
      {Opcode::kText, "Hello"},
      {Opcode::kText, "Hello"},
      {Opcode::kText, ""},
      {Opcode::kBinary, std::string(300000, 'q')},
      {Opcode::kText, "caf\xc3\xa9 \xe2\x82\xac " + std::string(100, 'x')},
  };
  std::string noise(200000, '\0');
  uint32_t x = 12345;
  for (char& c : noise) c = static_cast<char>((x = x * 1103515245 + 12345) >> 24);
  msgs.push_back({Opcode::kBinary, noise});  // incompressible: stored blocks
  msgs.push_back({Opcode::kText, "Hello"});
  for (bool server_nct : {false, true}) {
    {
      for (int bits : {9, 12, 15}) {
        DeflateParams p;
        p.server_no_context_takeover = server_nct;
        p.server_max_window_bits = bits;
        FrameEncoder e(p);
        core::Buffer out;
        Events want;
        for (const auto& [op, m] : msgs) {
          e.encode_message_compressed(op, m, out);
          want.push_back((op == Opcode::kText ? "text:" : "binary:") + m);
        }
        // The decoder inflates the server's stream here, so it takes the server's window.
        DecoderLimits l = deflate_limits(server_nct);
        l.client_max_window_bits = bits;
        EXPECT_EQ(run(as_client(out.view()), l, 0), want);
        EXPECT_EQ(run(as_client(out.view()), l, 3), want);
      }
    }
  }
}

TEST(FrameEncoder, CompressedFramesAndSmallMessages) {
  DeflateParams p;
  FrameEncoder e(p);
  EXPECT_TRUE(e.deflate());
  core::Buffer out;
  e.encode_message_compressed(Opcode::kText, "Hello", out);
  // RFC 7692 §7.2.3.1's bytes exactly (zlib's default level makes the same choice).
  EXPECT_EQ(out.view(), bytes({0xc1, 0x07, 0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00}));
  out.clear();
  e.encode_message(Opcode::kText, "short", out);  // under kMinCompressSize: plain
  EXPECT_EQ(out.view(), bytes({0x81, 0x05}) + "short");
  out.clear();
  const std::string big(1000, 'a');
  e.encode_message(Opcode::kText, big, out);
  EXPECT_EQ(static_cast<unsigned char>(out.view()[0]), 0xC1);
  EXPECT_LT(out.size(), 100u);
  // Without deflate, "compressed" means plain.
  FrameEncoder plain;
  core::Buffer out2;
  plain.encode_message_compressed(Opcode::kBinary, big, out2);
  EXPECT_EQ(static_cast<unsigned char>(out2.view()[0]), 0x82);
}

// ---------------------------------------------------------------------------------------------
// Negotiation

struct Negotiated {
  bool accepted;
  std::string response;
  DeflateParams params;
};

Negotiated negotiate(std::string_view header) {
  std::string response = "stale";
  auto p = negotiate_deflate(header, response);
  return {p.has_value(), response, p.value_or(DeflateParams{})};
}

TEST(NegotiateDeflate, AcceptsCommonOffers) {
  auto n = negotiate("permessage-deflate");
  EXPECT_TRUE(n.accepted);
  EXPECT_EQ(n.response, "permessage-deflate");
  EXPECT_FALSE(n.params.server_no_context_takeover);
  EXPECT_EQ(n.params.client_max_window_bits, 15);

  n = negotiate("permessage-deflate; client_max_window_bits");  // browsers
  EXPECT_TRUE(n.accepted);
  EXPECT_EQ(n.response, "permessage-deflate");

  n = negotiate(
      "permessage-deflate;server_no_context_takeover ; client_no_context_takeover;"
      " server_max_window_bits=10; client_max_window_bits=\"12\"");
  EXPECT_TRUE(n.accepted);
  EXPECT_EQ(n.response,
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; "
            "server_max_window_bits=10; client_max_window_bits=12");
  EXPECT_TRUE(n.params.server_no_context_takeover);
  EXPECT_TRUE(n.params.client_no_context_takeover);
  EXPECT_EQ(n.params.server_max_window_bits, 10);
  EXPECT_EQ(n.params.client_max_window_bits, 12);

  n = negotiate("Permessage-Deflate; Client_Max_Window_Bits=8");
  EXPECT_TRUE(n.accepted);
  EXPECT_EQ(n.params.client_max_window_bits, 8);

  auto limits = decoder_limits(1000, n.params);
  EXPECT_TRUE(limits.deflate);
  EXPECT_EQ(limits.max_message, 1000u);
  EXPECT_EQ(limits.client_max_window_bits, 8);
  EXPECT_FALSE(decoder_limits(1000, std::nullopt).deflate);
}

TEST(NegotiateDeflate, FallsBackPastDeclinedOffers) {
  auto n = negotiate(
      "x-webkit-deflate-frame, foo; a=\"x,y\", permessage-deflate; unknown, "
      "permessage-deflate; server_max_window_bits=8, permessage-deflate; "
      "client_no_context_takeover");
  EXPECT_TRUE(n.accepted);
  EXPECT_EQ(n.response, "permessage-deflate; client_no_context_takeover");
}

TEST(NegotiateDeflate, DeclinesInvalidOffers) {
  for (const char* h : {
           "",
           " , ,",
           "x-webkit-deflate-frame",
           "permessage-deflate; unknown",
           "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
           "permessage-deflate; client_max_window_bits; client_max_window_bits=10",
           "permessage-deflate; server_no_context_takeover=1",
           "permessage-deflate; client_no_context_takeover=\"\"",
           "permessage-deflate; server_max_window_bits",
           "permessage-deflate; server_max_window_bits=8",
           "permessage-deflate; server_max_window_bits=16",
           "permessage-deflate; server_max_window_bits=010",
           "permessage-deflate; client_max_window_bits=7",
           "permessage-deflate; client_max_window_bits=abc",
           "permessage-deflate; client_max_window_bits=\"15",
           "permessage-deflate;",
           "permessage-deflate; =15",
           "permessage-deflate x",
           "permessage-deflate; a b",
       }) {
    auto n = negotiate(h);
    EXPECT_FALSE(n.accepted) << h;
    EXPECT_EQ(n.response, "") << h;
  }
}

}  // namespace
}  // namespace corral::ws
