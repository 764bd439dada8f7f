// Small text rules of HTTP shared by the parsers (RFC 9110 §5.6): token characters, optional
// whitespace, hex digits, base64. One definition each, so the head scanner, the chunked decoder,
// range and conditional parsing, admission and the WebSocket handshake agree.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace corral::http {

// tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~"
//         / DIGIT / ALPHA
// A table, one lookup per byte: the head scanner runs it over every byte of every field name.
inline constexpr auto kTcharTable = [] {
  std::array<bool, 256> t{};
  for (int c = 'a'; c <= 'z'; ++c) t[static_cast<size_t>(c)] = true;
  for (int c = 'A'; c <= 'Z'; ++c) t[static_cast<size_t>(c)] = true;
  for (int c = '0'; c <= '9'; ++c) t[static_cast<size_t>(c)] = true;
  for (char c : std::string_view("!#$%&'*+-.^_`|~")) t[static_cast<unsigned char>(c)] = true;
  return t;
}();
inline bool is_tchar(char c) {
  return kTcharTable[static_cast<unsigned char>(c)];
}

inline bool is_ows(char c) {
  return c == ' ' || c == '\t';
}

inline std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

// The value of a hex digit (either case), or -1.
inline int hex_digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Standard base64 with padding into `out` (room for 4 * ((n + 2) / 3) bytes); returns the length.
inline size_t base64_encode(const unsigned char* in, size_t n, char* out) {
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    unsigned v = static_cast<unsigned>(in[i]) << 16;
    if (i + 1 < n) v |= static_cast<unsigned>(in[i + 1]) << 8;
    if (i + 2 < n) v |= in[i + 2];
    out[o++] = kB64[(v >> 18) & 63];
    out[o++] = kB64[(v >> 12) & 63];
    out[o++] = i + 1 < n ? kB64[(v >> 6) & 63] : '=';
    out[o++] = i + 2 < n ? kB64[v & 63] : '=';
  }
  return o;
}

}  // namespace corral::http
