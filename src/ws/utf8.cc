#include "ws/utf8.h"

#include <cstring>

namespace corral::ws {

bool Utf8Validator::feed(std::string_view bytes) {
  if (failed_) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto* end = p + bytes.size();
  while (p < end) {
    if (need_ == 0) {
      // Between code points: skip ASCII a word at a time, then byte by byte up to the lead byte.
      while (end - p >= 8) {
        uint64_t word;
        std::memcpy(&word, p, sizeof word);
        if (word & 0x8080808080808080ull) break;
        p += 8;
      }
      while (p < end && *p < 0x80) ++p;
      if (p == end) break;
      const unsigned c = *p++;
      if (c < 0xC2) {  // a continuation byte without a lead, or an overlong two-byte form (C0, C1)
        failed_ = true;
        return false;
      } else if (c < 0xE0) {
        need_ = 1;
      } else if (c < 0xF0) {
        need_ = 2;
        if (c == 0xE0) lo_ = 0xA0;  // E0 80..9F would be overlong
        if (c == 0xED) hi_ = 0x9F;  // ED A0..BF would be a surrogate (U+D800..DFFF)
      } else if (c < 0xF5) {
        need_ = 3;
        if (c == 0xF0) lo_ = 0x90;  // F0 80..8F would be overlong
        if (c == 0xF4) hi_ = 0x8F;  // F4 90..BF would be above U+10FFFF
      } else {                      // F5..FF can never start a code point
        failed_ = true;
        return false;
      }
    } else {
      const unsigned c = *p++;
      if (c < lo_ || c > hi_) {
        failed_ = true;
        return false;
      }
      lo_ = 0x80;
      hi_ = 0xBF;
      --need_;
    }
  }
  return true;
}

bool is_valid_utf8(std::string_view bytes) {
  Utf8Validator v;
  return v.feed(bytes) && v.complete();
}

}  // namespace corral::ws
