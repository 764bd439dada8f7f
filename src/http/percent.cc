#include "http/percent.h"

#include "core/escape.h"

namespace corral::http {

namespace {

// Decodes the escape at in[i] ('%'), returning the byte or -1 when it is malformed or decodes to
// a byte a segment may not hold (NUL, '/').
int decode_escape(std::string_view in, size_t i) {
  if (i + 2 >= in.size()) return -1;
  int hi = hex_digit_value(in[i + 1]);
  int lo = hex_digit_value(in[i + 2]);
  if (hi < 0 || lo < 0) return -1;
  int c = hi * 16 + lo;
  if (c == 0 || c == '/') return -1;
  return c;
}

// Shared walk: `allow_slash` keeps raw '/' (a path), otherwise a raw '/' fails (a segment).
// `out` may be null to validate only.
bool decode(std::string_view in, std::string* out, bool allow_slash) {
  if (out) out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      int d = decode_escape(in, i);
      if (d < 0) return false;
      if (out) out->push_back(static_cast<char>(d));
      i += 2;
      continue;
    }
    if (c == '\0' || (c == '/' && !allow_slash)) return false;
    if (out) out->push_back(c);
  }
  return true;
}

}  // namespace

bool percent_decode_segment(std::string_view in, std::string& out) {
  return decode(in, &out, false);
}

bool percent_decode_path(std::string_view in, std::string& out) {
  return decode(in, &out, true);
}

bool percent_path_decodable(std::string_view in) {
  return decode(in, nullptr, true);
}

bool is_valid_path_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    // unreserved
    case '-':
    case '.':
    case '_':
    case '~':
    // sub-delims
    case '!':
    case '$':
    case '&':
    case '\'':
    case '(':
    case ')':
    case '*':
    case '+':
    case ',':
    case ';':
    case '=':
    // pchar extras
    case ':':
    case '@':
      return true;
    default:
      return false;
  }
}

std::string percent_encode_name(std::string_view s) {
  return core::name_encode(s);
}

}  // namespace corral::http
