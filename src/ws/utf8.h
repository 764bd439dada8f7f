// Incremental UTF-8 validation (RFC 3629) for WebSocket text messages and close reasons: RFC 6455
// §8.1 requires failing the connection (1007) as soon as a text message is not valid UTF-8, and a
// message may arrive in fragments split in the middle of a code point, so the validator keeps the
// state of an unfinished sequence between feed() calls.
//
// Every invalid form is refused at the first byte that makes it invalid (the Unicode "maximal
// subpart" ranges of Table 3-7): C0/C1 and F5..FF lead bytes, stray continuation bytes, overlong
// three- and four-byte forms (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points above
// U+10FFFF (F4 90..BF). A sequence still open at the end of a message is caught by complete().
// ASCII runs are skipped eight bytes at a time.
//
// A plain value: no allocation, no threads; copy or reset it freely.
#pragma once

#include <cstdint>
#include <string_view>

namespace corral::ws {

class Utf8Validator {
 public:
  // Validates the next bytes of the text. Returns false once anything fed so far is invalid (the
  // failure is sticky until reset()).
  bool feed(std::string_view bytes);
  // True when everything fed is valid and no code point is left unfinished.
  bool complete() const { return !failed_ && need_ == 0; }
  bool failed() const { return failed_; }
  void reset() { *this = Utf8Validator(); }

 private:
  uint8_t need_ = 0;   // continuation bytes still expected for the current code point
  uint8_t lo_ = 0x80;  // allowed range of the next continuation byte (narrower right after
  uint8_t hi_ = 0xBF;  // E0, ED, F0 and F4, which is how overlongs and surrogates are refused)
  bool failed_ = false;
};

// Whole-string convenience: valid and complete.
bool is_valid_utf8(std::string_view bytes);

}  // namespace corral::ws
