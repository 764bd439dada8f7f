// ChunkedDecoder: the chunked transfer coding of a request body (RFC 9112 §7.1), sans-IO and
// strict. llhttp 8.1 (Debian's) refuses valid chunk extensions (`5;a=b;c=d`) and accepts a bare LF
// or obs-fold in the trailer section; corral decodes chunked bodies itself instead:
//   chunk-size (hex, at most 16 digits) [ chunk-ext ] CRLF, chunk-data CRLF, ..., "0" CRLF,
//   trailer fields (checked like header fields, then dropped), CRLF.
// Extensions are checked for control characters and ignored. Any framing error is 400; a body
// past the limit is 413. Bytes in, body bytes out, no sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/buffer.h"

namespace corral::http {

class ChunkedDecoder {
 public:
  // A chunk-size line (size, BWS, extensions) longer than this is refused: extensions count
  // against no other limit, and an endless one would keep a request reading forever.
  static constexpr size_t kMaxSizeLine = 4096;

  enum class State { kNeedMore, kDone, kError };
  struct Result {
    State state = State::kNeedMore;
    size_t consumed = 0;  // bytes of `data` used (with kDone: up to the end of the body)
    int status = 0;       // with kError: 400 or 413
    std::string_view reason;
  };

  // Decodes `data` (the bytes after what earlier calls consumed), appending the body to `body`.
  // `max_body` bounds the whole body decoded since reset(), not what `body` holds (a streamed
  // body is handed on and cleared between calls).
  Result feed(std::string_view data, core::Buffer& body, uint64_t max_body,
              size_t max_trailer_bytes);
  void reset() { *this = ChunkedDecoder(); }

 private:
  enum class Step {
    kSize,
    kExt,
    kSizeLf,
    kData,
    kDataCr,
    kDataLf,
    kTrailerLineStart,
    kTrailerLine,
    kTrailerLf,
    kFinalLf
  };
  Result fail(int status, std::string_view reason, size_t at) {
    return {State::kError, at, status, reason};
  }

  Step step_ = Step::kSize;
  uint64_t size_ = 0;   // the current chunk's size
  uint64_t left_ = 0;   // data bytes left in the current chunk
  uint64_t total_ = 0;  // body bytes decoded so far
  int digits_ = 0;
  bool last_ = false;    // the 0-size chunk was seen
  bool colon_ = false;   // in a trailer line: the colon was seen
  size_t line_len_ = 0;  // in a trailer line: bytes so far
  size_t trailer_bytes_ = 0;
  bool semicolon_ = false;
  bool need_name_ = false;   // chunk-ext: after ';' an extension name must come
  bool need_value_ = false;  // chunk-ext: after '=' a value must come
  bool in_name_ = false;     // chunk-ext: inside a name or token value (BWS ends it)
  size_t line_bytes_ = 0;    // bytes of the current chunk-size line (bounded: kMaxSizeLine)  //
                             // chunk-ext: a ';' was seen (BWS alone is not an extension)
  bool in_quote_ = false;    // chunk-ext quoted-string
  bool quote_escape_ = false;
};

}  // namespace corral::http
