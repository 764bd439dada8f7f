#include "ws/frame.h"

#include "http/request.h"
#include "http/text.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace corral::ws {

namespace {

// Inflate output is produced into the message buffer in steps of at most this much, so a message
// buffer never holds more than max_message + 1 bytes (the one byte that proves the limit is
// passed) and a deflate bomb is cut after at most this much extra work.
constexpr size_t kInflateStep = 64 * 1024;
// Compressed bytes are unmasked into a scratch block of this size on their way to zlib.
constexpr size_t kScratchSize = 16 * 1024;
// RFC 7692 §7.2.2: the sender strips the empty stored block that ends a sync flush; the receiver
// appends it back before inflating the end of a message.
constexpr unsigned char kDeflateTail[4] = {0x00, 0x00, 0xff, 0xff};

uint64_t saturating_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

// The compressed size a message may have on the wire: its inflated limit plus deflate's worst case
// for incompressible data (stored blocks: 5 bytes per 64 KiB) with a wide margin. Bounds the
// inflate work a client can ask for with empty blocks that produce no output.
uint64_t compressed_wire_limit(uint64_t max_message) {
  return saturating_add(max_message, max_message / 16 + 1024);
}

size_t clamp_size(uint64_t v) {
  return v > SIZE_MAX ? SIZE_MAX : static_cast<size_t>(v);
}

}  // namespace

bool valid_close_code(uint16_t code) {
  if (code >= 3000 && code <= 4999) return true;
  if (code >= 1000 && code <= 1003) return true;
  return code >= 1007 && code <= 1014;
}

DecoderLimits decoder_limits(uint64_t max_message, const std::optional<DeflateParams>& deflate) {
  DecoderLimits limits;
  limits.max_message = max_message;
  if (deflate) {
    limits.deflate = true;
    limits.client_no_context_takeover = deflate->client_no_context_takeover;
    limits.client_max_window_bits = deflate->client_max_window_bits;
  }
  return limits;
}

// ---------------------------------------------------------------------------------------------
// FrameDecoder

void FrameDecoder::FreeDeleter::operator()(char* p) const {
  std::free(p);
}

void FrameDecoder::InflateDeleter::operator()(z_stream_s* z) const {
  inflateEnd(z);
  delete z;
}

FrameDecoder::FrameDecoder(const DecoderLimits& limits) : limits_(limits) {}
FrameDecoder::~FrameDecoder() = default;

size_t FrameDecoder::feed(std::string_view data, FrameHandler& h) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const size_t size = data.size();
  size_t pos = 0;
  while (state_ != State::kDone) {
    if (state_ == State::kHeader) {
      while (header_len_ < header_need_ && pos < size) {
        header_[header_len_++] = p[pos++];
        // The first two bytes decide the header's length and carry most rules: check them at
        // once, before waiting for the rest.
        if (header_len_ == 2 && !begin_header(h)) return pos;
      }
      if (header_len_ < header_need_) break;
      if (!begin_frame(h)) return pos;
      state_ = State::kPayload;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(frame_len_ - frame_pos_, size - pos));
    if (n > 0) {
      if (!take_payload(p + pos, n, h)) return pos + n;
      pos += n;
    }
    if (frame_pos_ < frame_len_) break;
    end_frame(h);
  }
  return pos;
}

void FrameDecoder::fail(FrameHandler& h, uint16_t code, std::string_view reason) {
  state_ = State::kDone;
  h.on_error(code, reason);
}

bool FrameDecoder::begin_header(FrameHandler& h) {
  const unsigned b0 = header_[0];
  const unsigned b1 = header_[1];
  fin_ = (b0 & 0x80) != 0;
  const bool rsv1 = (b0 & 0x40) != 0;
  const unsigned op = b0 & 0x0F;
  const unsigned len7 = b1 & 0x7F;
  const bool control = op >= 8;
  if (b0 & 0x30) return fail(h, kCloseProtocolError, "RSV2 or RSV3 set"), false;
  if ((op >= 3 && op <= 7) || op >= 11)
    return fail(h, kCloseProtocolError, "reserved opcode"), false;
  if (rsv1) {
    if (!limits_.deflate) {
      return fail(h, kCloseProtocolError, "RSV1 set without permessage-deflate"), false;
    }
    if (control) return fail(h, kCloseProtocolError, "RSV1 set on a control frame"), false;
    if (op == 0) return fail(h, kCloseProtocolError, "RSV1 set on a continuation frame"), false;
  }
  if (control) {
    if (!fin_) return fail(h, kCloseProtocolError, "fragmented control frame"), false;
    if (len7 > 125) {
      return fail(h, kCloseProtocolError, "control frame payload over 125 bytes"), false;
    }
  } else if (op == 0) {
    if (!in_message_) {
      return fail(h, kCloseProtocolError, "continuation frame without a message in progress"),
             false;
    }
  } else if (in_message_) {
    return fail(h, kCloseProtocolError, "data frame inside a fragmented message"), false;
  }
  if (!(b1 & 0x80)) return fail(h, kCloseProtocolError, "unmasked client frame"), false;
  opcode_ = static_cast<Opcode>(op);
  header_need_ = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + 4;
  if (op != 0 && !control) {
    // The first frame of a message: RSV1 marks it compressed (RFC 7692 §6).
    msg_opcode_ = opcode_;
    compressed_ = rsv1;
  }
  return true;
}

bool FrameDecoder::begin_frame(FrameHandler& h) {
  const unsigned len7 = header_[1] & 0x7F;
  // Lengths need not be minimal: RFC 6455 §5.2 says "the minimal number of bytes MUST be used"
  // for senders but gives receivers no rule to fail on, and refusing them buys nothing; a 126 or
  // 127 form carrying a small length is accepted as that length.
  if (len7 == 126) {
    frame_len_ = (uint64_t{header_[2]} << 8) | header_[3];
  } else if (len7 == 127) {
    if (header_[2] & 0x80) {
      return fail(h, kCloseProtocolError, "64-bit payload length with the high bit set"), false;
    }
    frame_len_ = 0;
    for (int i = 2; i < 10; ++i) frame_len_ = (frame_len_ << 8) | header_[i];
  } else {
    frame_len_ = len7;
  }
  std::memcpy(mask_, header_ + header_need_ - 4, 4);
  frame_pos_ = 0;
  if (static_cast<uint8_t>(opcode_) >= 8) {
    control_len_ = 0;
    return true;
  }
  if (opcode_ != Opcode::kContinuation) {
    in_message_ = true;
    inflate_ended_ = false;
    msg_wire_ = 0;
    msg_size_ = 0;
    utf8_.reset();
  }
  // Refuse from the header, before any payload is buffered. A compressed message's real size is
  // only known while inflating (checked there); its wire size has a limit of its own.
  const uint64_t limit =
      compressed_ ? compressed_wire_limit(limits_.max_message) : limits_.max_message;
  if (frame_len_ > limit - std::min(limit, msg_wire_)) {
    return fail(h, kCloseTooBig, "message larger than max_message"), false;
  }
  msg_wire_ += frame_len_;
  return true;
}

void FrameDecoder::unmask(const unsigned char* in, size_t n, unsigned char* out) {
  // Byte i of the payload is XORed with mask_[i % 4]; eight bytes at a time with the key rotated
  // to this chunk's phase.
  const size_t phase = frame_pos_ & 3;
  unsigned char m[8];
  for (size_t k = 0; k < 8; ++k) m[k] = mask_[(phase + k) & 3];
  uint64_t m64;
  std::memcpy(&m64, m, 8);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, in + i, 8);
    w ^= m64;
    std::memcpy(out + i, &w, 8);
  }
  for (; i < n; ++i) out[i] = in[i] ^ m[i & 7];
  frame_pos_ += n;
}

bool FrameDecoder::take_payload(const unsigned char* data, size_t n, FrameHandler& h) {
  if (static_cast<uint8_t>(opcode_) >= 8) {
    unmask(data, n, reinterpret_cast<unsigned char*>(control_) + control_len_);
    control_len_ += n;
    return true;
  }
  if (!compressed_) return append_plain(data, n, h);
  if (!scratch_) scratch_.reset(new unsigned char[kScratchSize]);
  while (n > 0) {
    const size_t k = std::min(n, kScratchSize);
    unmask(data, k, scratch_.get());
    if (!inflate_chunk(scratch_.get(), k, h)) return false;
    data += k;
    n -= k;
  }
  return true;
}

char* FrameDecoder::grow_message(size_t want, size_t hard_cap) {
  if (want <= msg_cap_) return msg_.get();
  // Double for amortized appends, but never past the limit: capacity, not only size, is bounded.
  size_t cap = std::max<size_t>(msg_cap_ > SIZE_MAX / 2 ? SIZE_MAX : msg_cap_ * 2, 256);
  cap = std::max(std::min(cap, hard_cap), want);
  char* p = static_cast<char*>(std::realloc(msg_.get(), cap));
  if (!p) throw std::bad_alloc();  // as core::Buffer: out of memory is not a protocol error
  (void)msg_.release();
  msg_.reset(p);
  msg_cap_ = cap;
  return p;
}

bool FrameDecoder::check_text(size_t from, FrameHandler& h) {
  if (msg_opcode_ != Opcode::kText) return true;
  if (utf8_.feed({msg_.get() + from, msg_size_ - from})) return true;
  fail(h, kCloseInvalidData, "invalid UTF-8 in a text message");
  return false;
}

bool FrameDecoder::append_plain(const unsigned char* data, size_t n, FrameHandler& h) {
  // The header check keeps msg_size_ + frame length within max_message.
  char* base = grow_message(msg_size_ + n, clamp_size(limits_.max_message));
  const size_t from = msg_size_;
  unmask(data, n, reinterpret_cast<unsigned char*>(base) + from);
  msg_size_ += n;
  return check_text(from, h);
}

bool FrameDecoder::inflate_chunk(const unsigned char* data, size_t n, FrameHandler& h) {
  // After a final block (BFINAL, RFC 7692 §7.2.3.3) the rest of the message is not deflate data
  // of this stream: ignore it; the stream restarts with the next message.
  if (inflate_ended_) return true;
  if (!inflater_) {
    auto* z = new z_stream{};
    // A window at least as large as the client's is always safe; 9 rather than 8 because zlib's
    // deflate silently uses 512 bytes when asked for 256.
    const int bits = std::clamp(limits_.client_max_window_bits, 9, 15);
    if (inflateInit2(z, -bits) != Z_OK) {
      delete z;
      fail(h, kCloseInternalError, "inflateInit2 failed");
      return false;
    }
    inflater_.reset(z);
  }
  z_stream* z = inflater_.get();
  z->next_in = const_cast<unsigned char*>(data);
  z->avail_in = static_cast<uInt>(n);  // n <= kScratchSize
  // One byte past the limit is room enough to prove a message too big.
  const size_t hard = clamp_size(saturating_add(limits_.max_message, 1));
  for (;;) {
    const size_t step = std::min(kInflateStep, hard - msg_size_);
    char* base = grow_message(msg_size_ + step, hard);
    z->next_out = reinterpret_cast<unsigned char*>(base + msg_size_);
    z->avail_out = static_cast<uInt>(step);
    const int rc = inflate(z, Z_SYNC_FLUSH);
    const size_t from = msg_size_;
    msg_size_ += step - z->avail_out;
    if (msg_size_ > limits_.max_message) {
      fail(h, kCloseTooBig, "inflated message larger than max_message");
      return false;
    }
    if (msg_size_ > from && !check_text(from, h)) return false;
    if (rc == Z_STREAM_END) {
      inflate_ended_ = true;
      return true;
    }
    if (rc == Z_BUF_ERROR) return true;  // no progress possible: all input used
    if (rc != Z_OK) {
      fail(h, kCloseInvalidData, "invalid deflate data");
      return false;
    }
    if (z->avail_in == 0 && z->avail_out != 0) return true;
  }
}

void FrameDecoder::end_frame(FrameHandler& h) {
  state_ = State::kHeader;
  header_len_ = 0;
  header_need_ = 2;
  if (static_cast<uint8_t>(opcode_) >= 8) {
    control_frame(h);
  } else if (fin_) {
    end_message(h);
  }
}

void FrameDecoder::control_frame(FrameHandler& h) {
  const std::string_view payload(control_, control_len_);
  switch (opcode_) {
    case Opcode::kPing:
      h.on_ping(payload);
      return;
    case Opcode::kPong:
      h.on_pong(payload);
      return;
    default:
      break;
  }
  // Close (RFC 6455 §5.5.1, §7.1.5): no body, or a 2-byte code and a UTF-8 reason.
  if (payload.empty()) {
    state_ = State::kDone;
    h.on_close(kCloseNoStatus, {});
    return;
  }
  if (payload.size() == 1) return fail(h, kCloseProtocolError, "close frame with a 1-byte body");
  const uint16_t code = static_cast<uint16_t>((static_cast<unsigned char>(payload[0]) << 8) |
                                              static_cast<unsigned char>(payload[1]));
  if (!valid_close_code(code)) return fail(h, kCloseProtocolError, "invalid close code");
  const std::string_view reason = payload.substr(2);
  if (!is_valid_utf8(reason)) return fail(h, kCloseInvalidData, "close reason is not UTF-8");
  state_ = State::kDone;
  h.on_close(code, reason);
}

void FrameDecoder::end_message(FrameHandler& h) {
  if (compressed_) {
    if (!inflate_chunk(kDeflateTail, sizeof kDeflateTail, h)) return;
    if (limits_.client_no_context_takeover || inflate_ended_) inflateReset(inflater_.get());
  }
  if (msg_opcode_ == Opcode::kText && !utf8_.complete()) {
    return fail(h, kCloseInvalidData, "text message ends inside a UTF-8 sequence");
  }
  const std::string_view payload(msg_.get(), msg_size_);
  in_message_ = false;
  msg_size_ = 0;
  msg_wire_ = 0;
  utf8_.reset();
  h.on_message(msg_opcode_, payload);
}

void FrameDecoder::release_memory() {
  if (in_message_) return;
  msg_.reset();
  msg_cap_ = 0;
  scratch_.reset();
}

// ---------------------------------------------------------------------------------------------
// FrameEncoder

void FrameEncoder::DeflateDeleter::operator()(z_stream_s* z) const {
  deflateEnd(z);
  delete z;
}

FrameEncoder::FrameEncoder() = default;
FrameEncoder::FrameEncoder(const DeflateParams& params, int level)
    : deflate_(params), level_(std::clamp(level, 1, 9)) {}
FrameEncoder::~FrameEncoder() = default;

void FrameEncoder::write_header(bool fin, bool rsv1, Opcode opcode, uint64_t len,
                                core::Buffer& out) {
  unsigned char h[10];
  h[0] = static_cast<unsigned char>((fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) |
                                    static_cast<unsigned>(opcode));
  size_t n = 2;
  if (len < 126) {
    h[1] = static_cast<unsigned char>(len);
  } else if (len <= 0xFFFF) {
    h[1] = 126;
    h[2] = static_cast<unsigned char>(len >> 8);
    h[3] = static_cast<unsigned char>(len);
    n = 4;
  } else {
    h[1] = 127;
    for (int i = 0; i < 8; ++i) h[2 + i] = static_cast<unsigned char>(len >> (56 - 8 * i));
    n = 10;
  }
  out.append(std::string_view(reinterpret_cast<const char*>(h), n));
}

void FrameEncoder::encode(Opcode opcode, std::string_view payload, core::Buffer& out, bool fin) {
  if (static_cast<uint8_t>(opcode) >= 8) {
    payload = payload.substr(0, 125);
    fin = true;
  }
  write_header(fin, false, opcode, payload.size(), out);
  out.append(payload);
}

void FrameEncoder::encode_close(uint16_t code, std::string_view reason, core::Buffer& out) {
  if (!valid_close_code(code)) {
    write_header(true, false, Opcode::kClose, 0, out);
    return;
  }
  size_t cut = std::min<size_t>(reason.size(), 123);
  while (cut > 0 && cut < reason.size() &&
         (static_cast<unsigned char>(reason[cut]) & 0xC0) == 0x80) {
    --cut;  // do not split a code point
  }
  reason = reason.substr(0, cut);
  write_header(true, false, Opcode::kClose, 2 + reason.size(), out);
  const char code_bytes[2] = {static_cast<char>(code >> 8), static_cast<char>(code & 0xFF)};
  out.append(std::string_view(code_bytes, 2));
  out.append(reason);
}

void FrameEncoder::encode_message(Opcode opcode, std::string_view payload, core::Buffer& out) {
  if (deflate_ && payload.size() >= kMinCompressSize) {
    encode_message_compressed(opcode, payload, out);
  } else {
    encode(opcode, payload, out);
  }
}

void FrameEncoder::encode_message_compressed(Opcode opcode, std::string_view payload,
                                             core::Buffer& out) {
  if (!deflate_) return encode(opcode, payload, out);
  if (!deflater_) {
    auto* z = new z_stream{};
    const int bits = std::clamp(deflate_->server_max_window_bits, 9, 15);
    if (deflateInit2(z, level_, Z_DEFLATED, -bits, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
      delete z;
      return encode(opcode, payload, out);
    }
    deflater_.reset(z);
  }
  z_stream* z = deflater_.get();
  compressed_.clear();
  const auto* in = reinterpret_cast<const unsigned char*>(payload.data());
  size_t left = payload.size();
  bool ok = true;
  // zlib counts in uInt: feed at most 1 GiB per call, flushing with the last piece.
  do {
    const size_t piece = std::min<size_t>(left, size_t{1} << 30);
    z->next_in = const_cast<unsigned char*>(in);
    z->avail_in = static_cast<uInt>(piece);
    in += piece;
    left -= piece;
    const int flush = left == 0 ? Z_SYNC_FLUSH : Z_NO_FLUSH;
    do {
      compressed_.reserve(std::max<size_t>(piece / 2, 4096));
      const size_t room = std::min<size_t>(compressed_.writable(), UINT_MAX);
      z->next_out = reinterpret_cast<unsigned char*>(compressed_.write_ptr());
      z->avail_out = static_cast<uInt>(room);
      const int rc = ::deflate(z, flush);
      compressed_.commit(room - z->avail_out);
      if (rc != Z_OK && rc != Z_BUF_ERROR) ok = false;
    } while (ok && (z->avail_out == 0 || z->avail_in != 0));
  } while (ok && left > 0);
  std::string_view body = compressed_.view();
  const std::string_view tail(reinterpret_cast<const char*>(kDeflateTail), 4);
  if (!ok || body.size() < 4 || body.substr(body.size() - 4) != tail) {
    // Cannot happen with a healthy zlib; the client never sees this output, so restart the
    // context (which it cannot tell from no context takeover) and send the message plain.
    deflateReset(z);
    return encode(opcode, payload, out);
  }
  body.remove_suffix(4);
  write_header(true, true, opcode, body.size(), out);
  out.append(body);
  if (deflate_->server_no_context_takeover) deflateReset(z);
  compressed_.clear();
}

// ---------------------------------------------------------------------------------------------
// permessage-deflate negotiation (RFC 7692 §5, §7.1; syntax of RFC 6455 §9.1)

namespace {

using http::iequals;
using http::is_tchar;

struct Param {
  std::string_view name;
  std::string value;  // unquoted
  bool has_value = false;
};

// One list element: token *( OWS ";" OWS token [ OWS "=" OWS ( token / quoted-string ) ] ).
class ElementParser {
 public:
  explicit ElementParser(std::string_view s) : s_(s) {}

  bool parse(std::string_view& name, std::vector<Param>& params) {
    skip_ows();
    if (!token(name)) return false;
    for (;;) {
      skip_ows();
      if (i_ == s_.size()) return true;
      if (s_[i_] != ';') return false;
      ++i_;
      skip_ows();
      Param p;
      if (!token(p.name)) return false;
      skip_ows();
      if (i_ < s_.size() && s_[i_] == '=') {
        ++i_;
        skip_ows();
        p.has_value = true;
        std::string_view v;
        if (i_ < s_.size() && s_[i_] == '"') {
          if (!quoted(p.value)) return false;
        } else if (token(v)) {
          p.value = std::string(v);
        } else {
          return false;
        }
      }
      params.push_back(std::move(p));
    }
  }

 private:
  void skip_ows() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  bool token(std::string_view& out) {
    const size_t start = i_;
    while (i_ < s_.size() && is_tchar(s_[i_])) ++i_;
    out = s_.substr(start, i_ - start);
    return i_ > start;
  }
  bool quoted(std::string& out) {
    ++i_;  // opening quote
    while (i_ < s_.size()) {
      const char c = s_[i_++];
      if (c == '"') return true;
      if (c == '\\') {
        if (i_ == s_.size()) return false;
        out.push_back(s_[i_++]);
      } else {
        out.push_back(c);
      }
    }
    return false;
  }

  std::string_view s_;
  size_t i_ = 0;
};

// Splits at commas outside quoted strings.
std::vector<std::string_view> split_elements(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  bool quoted = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quoted) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        quoted = false;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(std::min(start, s.size())));
  return out;
}

// "8".."15" without leading zeros (RFC 7692 §7.1.2.1).
std::optional<int> window_bits(std::string_view v) {
  if (v.empty() || v.size() > 2 || v[0] == '0') return std::nullopt;
  int n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n < 8 || n > 15) return std::nullopt;
  return n;
}

// One permessage-deflate offer's parameters: the agreed values, or nullopt to decline it.
std::optional<DeflateParams> accept_offer(const std::vector<Param>& params, std::string& response) {
  DeflateParams d;
  bool seen[4] = {false, false, false, false};
  bool server_bits = false;
  bool client_bits_value = false;
  for (const Param& p : params) {
    int which;
    if (iequals(p.name, "server_no_context_takeover")) {
      which = 0;
      if (p.has_value) return std::nullopt;
      d.server_no_context_takeover = true;
    } else if (iequals(p.name, "client_no_context_takeover")) {
      which = 1;
      if (p.has_value) return std::nullopt;
      d.client_no_context_takeover = true;
    } else if (iequals(p.name, "server_max_window_bits")) {
      which = 2;
      auto bits = p.has_value ? window_bits(p.value) : std::nullopt;
      // zlib cannot deflate with a 256-byte window (deflateInit2 refuses raw windowBits 8).
      if (!bits || *bits == 8) return std::nullopt;
      d.server_max_window_bits = *bits;
      server_bits = true;
    } else if (iequals(p.name, "client_max_window_bits")) {
      which = 3;
      if (p.has_value) {
        auto bits = window_bits(p.value);
        if (!bits) return std::nullopt;
        d.client_max_window_bits = *bits;
        client_bits_value = true;
      }
    } else {
      return std::nullopt;  // unknown parameter (§7.1: decline)
    }
    if (seen[which]) return std::nullopt;  // repeated parameter
    seen[which] = true;
  }
  response = "permessage-deflate";
  if (d.server_no_context_takeover) response += "; server_no_context_takeover";
  if (d.client_no_context_takeover) response += "; client_no_context_takeover";
  if (server_bits)
    response += "; server_max_window_bits=" + std::to_string(d.server_max_window_bits);
  if (client_bits_value) {
    response += "; client_max_window_bits=" + std::to_string(d.client_max_window_bits);
  }
  return d;
}

}  // namespace

std::optional<DeflateParams> negotiate_deflate(std::string_view sec_websocket_extensions,
                                               std::string& response_value) {
  response_value.clear();
  for (std::string_view element : split_elements(sec_websocket_extensions)) {
    std::string_view name;
    std::vector<Param> params;
    if (!ElementParser(element).parse(name, params)) continue;
    if (!iequals(name, "permessage-deflate")) continue;
    if (auto d = accept_offer(params, response_value)) return d;
  }
  response_value.clear();
  return std::nullopt;
}

}  // namespace corral::ws
