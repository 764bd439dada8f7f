// WebSocket framing (RFC 6455 §5) for the server side, with permessage-deflate (RFC 7692): the
// sans-IO core of the `ws` component (STYLE rule 2). Bytes in, events out; no sockets, no timers.
//
// FrameDecoder reads what a client sends: it checks every framing rule with the close code the
// RFC asks for, reassembles fragmented messages into one reused buffer, inflates compressed ones
// and validates text as it arrives, and hands whole messages and control frames to a
// FrameHandler. Input may be split anywhere (one byte at a time gives the same events as one
// call). The first on_error() or on_close() ends decoding: the caller answers with a close frame
// (FrameEncoder::encode_close) and shuts the connection down.
//
// Memory is bounded by the limits, not by what a client claims: a message buffer grows as payload
// bytes actually arrive and never past max_message (+64 KiB of inflate room for a compressed one),
// a length over the limit is refused from the frame header before any payload is buffered, and a
// deflate bomb is cut as soon as its output passes max_message.
//
// FrameEncoder writes server frames (never masked, minimal length encoding) into a core::Buffer,
// compressing whole messages when permessage-deflate was negotiated.
//
// negotiate_deflate() reads a client's Sec-WebSocket-Extensions offers and builds the response.
//
// Lifetime and threading: one decoder and one encoder per connection, used from its event loop
// only. The zlib streams are created on first use (a connection that never compresses pays
// nothing) and freed with the object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/buffer.h"
#include "ws/utf8.h"

struct z_stream_s;  // zlib's stream; <zlib.h> stays out of this header

namespace corral::ws {

enum class Opcode : uint8_t {
  kContinuation = 0,
  kText = 1,
  kBinary = 2,
  kClose = 8,
  kPing = 9,
  kPong = 10,
};

// Close codes (RFC 6455 §7.4.1) that this layer produces or reports.
inline constexpr uint16_t kCloseNormal = 1000;
inline constexpr uint16_t kCloseGoingAway = 1001;
inline constexpr uint16_t kCloseProtocolError = 1002;
inline constexpr uint16_t kCloseNoStatus = 1005;  // reported by on_close for an empty close frame
inline constexpr uint16_t kCloseInvalidData = 1007;
inline constexpr uint16_t kClosePolicyViolation = 1008;  // output cap, ping flood
inline constexpr uint16_t kCloseTooBig = 1009;
inline constexpr uint16_t kCloseInternalError = 1011;

// Whether `code` may appear in a close frame on the wire: 1000-1003, 1007-1014 (IANA registry),
// 3000-4999 (libraries and applications). 1004-1006 and 1015 are reserved, 1016-2999 are for
// future RFCs, anything below 1000 or from 5000 is invalid.
bool valid_close_code(uint16_t code);

// The permessage-deflate parameters agreed in the handshake (RFC 7692 §7.1).
struct DeflateParams {
  bool server_no_context_takeover = false;  // our deflater is reset after every message
  bool client_no_context_takeover = false;  // the client resets its deflater: so do we, inflating
  int server_max_window_bits = 15;          // our LZ77 window, 9..15
  int client_max_window_bits = 15;          // the client's window, 8..15
};

struct DecoderLimits {
  // Largest message delivered: the sum of its fragments, or its size once inflated. Larger is
  // refused with 1009.
  uint64_t max_message = 16 * 1024 * 1024;
  // permessage-deflate negotiated: RSV1 on a message's first frame means it is compressed.
  bool deflate = false;
  bool client_no_context_takeover = false;
  int client_max_window_bits = 15;
};

// Limits for a connection whose handshake settled on `deflate` (nullopt: no compression).
DecoderLimits decoder_limits(uint64_t max_message, const std::optional<DeflateParams>& deflate);

// What the decoder reports. The views point into the decoder's buffers and are valid during the
// callback only. A callback must not call feed() again nor destroy the decoder; it may call
// FrameDecoder::stop().
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  // A whole data message (kText: valid UTF-8; reassembled and inflated).
  virtual void on_message(Opcode opcode, std::string_view payload) = 0;
  virtual void on_ping(std::string_view payload) = 0;
  virtual void on_pong(std::string_view payload) = 0;
  // The client's close frame: `code` is kCloseNoStatus (1005) when the frame had no body; the
  // reason is valid UTF-8. Decoding ends here.
  virtual void on_close(uint16_t code, std::string_view reason) = 0;
  // The client broke the protocol: send a close frame with `close_code` (1002, 1007 or 1009;
  // 1011 only if zlib cannot allocate its state) and close. `reason` is static text for the log.
  // Decoding ends here.
  virtual void on_error(uint16_t close_code, std::string_view reason) = 0;
};

class FrameDecoder {
 public:
  explicit FrameDecoder(const DecoderLimits& limits = {});
  ~FrameDecoder();
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  // Decodes `data`, reporting events to `handler`. Returns the bytes consumed: all of them while
  // decoding goes on (a partial frame is kept inside), fewer when it ended (close, error, stop())
  // part way: the rest is not looked at. Once done(), returns 0.
  size_t feed(std::string_view data, FrameHandler& handler);

  // Ends decoding (from a callback too: feed() returns right after it).
  void stop() { state_ = State::kDone; }
  bool done() const { return state_ == State::kDone; }
  // A fragmented message is partly received.
  bool in_message() const { return in_message_; }

  // Frees the message buffer between messages (an idle connection after a large message); the
  // inflater keeps its window when context takeover is on.
  void release_memory();
  // Bytes held for message reassembly (tests check the memory bound with it).
  size_t buffer_capacity() const { return msg_cap_; }

 private:
  enum class State : uint8_t { kHeader, kPayload, kDone };

  bool begin_header(FrameHandler& h);  // first two header bytes: checks; false after on_error
  bool begin_frame(FrameHandler& h);   // whole header: length checks; false after on_error
  bool take_payload(const unsigned char* data, size_t n, FrameHandler& h);
  void end_frame(FrameHandler& h);
  void end_message(FrameHandler& h);
  void control_frame(FrameHandler& h);
  bool inflate_chunk(const unsigned char* data, size_t n, FrameHandler& h);
  bool append_plain(const unsigned char* data, size_t n, FrameHandler& h);
  bool check_text(size_t from, FrameHandler& h);
  char* grow_message(size_t want, size_t hard_cap);  // room for `want` bytes in total
  void fail(FrameHandler& h, uint16_t code, std::string_view reason);
  void unmask(const unsigned char* in, size_t n, unsigned char* out);

  DecoderLimits limits_;
  State state_ = State::kHeader;

  // Current frame.
  unsigned char header_[14];
  size_t header_len_ = 0;   // bytes of header_ received
  size_t header_need_ = 2;  // bytes the header will have (known after its second byte)
  bool fin_ = false;
  Opcode opcode_ = Opcode::kContinuation;
  unsigned char mask_[4] = {0, 0, 0, 0};
  uint64_t frame_len_ = 0;
  uint64_t frame_pos_ = 0;  // payload bytes received (the masking key's phase)

  // Current control frame (at most 125 bytes, never fragmented).
  char control_[125];
  size_t control_len_ = 0;

  // Current data message.
  bool in_message_ = false;
  bool compressed_ = false;
  bool inflate_ended_ = false;  // the client ended its deflate stream (BFINAL) in this message
  Opcode msg_opcode_ = Opcode::kBinary;
  uint64_t msg_wire_ = 0;  // payload bytes on the wire so far (compressed size if compressed)
  Utf8Validator utf8_;

  // The reassembly buffer: realloc-managed so that its capacity, not just its size, stays under
  // the limit (std::string and core::Buffer grow by doubling).
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, FreeDeleter> msg_;
  size_t msg_size_ = 0;
  size_t msg_cap_ = 0;

  struct InflateDeleter {
    void operator()(z_stream_s* z) const;
  };
  std::unique_ptr<z_stream_s, InflateDeleter> inflater_;
  std::unique_ptr<unsigned char[]> scratch_;  // unmasked compressed bytes on their way to inflate
};

class FrameEncoder {
 public:
  // Messages shorter than this are sent uncompressed by encode_message(): deflate's block
  // overhead makes them no smaller, and the CPU is better spent elsewhere.
  static constexpr size_t kMinCompressSize = 64;

  FrameEncoder();  // no compression
  // permessage-deflate negotiated: `level` is zlib's 1 (fast) .. 9 (small).
  explicit FrameEncoder(const DeflateParams& params, int level = 6);
  ~FrameEncoder();
  FrameEncoder(const FrameEncoder&) = delete;
  FrameEncoder& operator=(const FrameEncoder&) = delete;

  // One frame, uncompressed. A control frame's payload is cut to 125 bytes (RFC 6455 §5.5); for
  // kClose use encode_close(). `fin` = false starts or continues a fragmented message.
  void encode(Opcode opcode, std::string_view payload, core::Buffer& out, bool fin = true);
  // A close frame. A code that may not be sent (valid_close_code() false, e.g. 1005) gives an
  // empty body; the reason is cut to 123 bytes at a UTF-8 boundary.
  void encode_close(uint16_t code, std::string_view reason, core::Buffer& out);
  // A whole text or binary message: compressed when deflate was negotiated and the payload has at
  // least kMinCompressSize bytes, else as one plain frame.
  void encode_message(Opcode opcode, std::string_view payload, core::Buffer& out);
  // A whole message compressed (RSV1 set) whatever its size; plain if deflate was not negotiated
  // or zlib fails (then the context is reset, which the client cannot tell from no takeover).
  void encode_message_compressed(Opcode opcode, std::string_view payload, core::Buffer& out);

  bool deflate() const { return deflate_.has_value(); }

 private:
  void write_header(bool fin, bool rsv1, Opcode opcode, uint64_t len, core::Buffer& out);

  struct DeflateDeleter {
    void operator()(z_stream_s* z) const;
  };
  std::optional<DeflateParams> deflate_;
  int level_ = 6;
  std::unique_ptr<z_stream_s, DeflateDeleter> deflater_;
  core::Buffer compressed_;  // reused output of deflate before framing
};

// Reads the client's Sec-WebSocket-Extensions value (several header lines joined with ", ") and
// accepts the first valid permessage-deflate offer: its parameters are returned and
// `response_value` is set to the matching response header value. nullopt (and an empty
// response_value) when there is no acceptable offer: an offer with an unknown or repeated
// parameter, a bad value, server_max_window_bits=8 (zlib cannot deflate with a 256-byte window)
// or broken syntax is declined, never a reason to fail the handshake.
std::optional<DeflateParams> negotiate_deflate(std::string_view sec_websocket_extensions,
                                               std::string& response_value);

}  // namespace corral::ws
