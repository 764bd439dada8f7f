#include "core/escape.h"

#include <nettle/sha2.h>

#include <cstdint>

namespace corral::core {

namespace {

constexpr char kHex[] = "0123456789ABCDEF";

bool continuation(unsigned char c) {
  return (c & 0xC0) == 0x80;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Calls `keep(bytes)` for each run of bytes that text may carry as they are and `escape(byte)`
// for each byte it may not.
template <typename Keep, typename Escape>
void classify(std::string_view s, Keep keep, Escape escape) {
  size_t i = 0;
  while (i < s.size()) {
    std::string_view rest = s.substr(i);
    size_t n = utf8_scalar_length(rest);
    if (n == 0) {
      escape(static_cast<unsigned char>(s[i]));
      ++i;
    } else if (unsafe_scalar(rest, n)) {
      for (size_t k = 0; k < n; ++k) escape(static_cast<unsigned char>(s[i + k]));
      i += n;
    } else {
      keep(rest.substr(0, n));
      i += n;
    }
  }
}

}  // namespace

size_t utf8_scalar_length(std::string_view s) {
  if (s.empty()) return 0;
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;  // a continuation byte, or an overlong 2-byte lead (C0, C1)
  if (c < 0xE0) return s.size() >= 2 && continuation(b(1)) ? 2 : 0;
  if (c < 0xF0) {
    if (s.size() < 3 || !continuation(b(1)) || !continuation(b(2))) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // a surrogate (U+D800..U+DFFF)
    return 3;
  }
  if (c < 0xF5) {
    if (s.size() < 4 || !continuation(b(1)) || !continuation(b(2)) || !continuation(b(3))) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

bool unsafe_scalar(std::string_view s, size_t length) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  if (length == 1) return b(0) < 0x20 || b(0) == 0x7F;
  if (length == 2) return b(0) == 0xC2 && b(1) < 0xA0;  // U+0080..U+009F
  if (length == 3) return b(0) == 0xE2 && b(1) == 0x80 && (b(2) == 0xA8 || b(2) == 0xA9);
  return false;
}

void append_wire_encoded(std::string& out, std::string_view bytes) {
  auto escape = [&](unsigned char c) {
    out += '%';
    out += kHex[c >> 4];
    out += kHex[c & 15];
  };
  classify(
      bytes,
      [&](std::string_view run) {
        if (run.size() == 1 && run[0] == '%')
          escape('%');
        else
          out.append(run);
      },
      escape);
}

std::string wire_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_wire_encoded(out, bytes);
  return out;
}

bool wire_decode(std::string_view text, std::string& out) {
  out.clear();
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return false;
    int hi = hex_value(text[i + 1]), lo = hex_value(text[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out += static_cast<char>(hi << 4 | lo);
    i += 2;
  }
  return true;
}

void append_log_escaped(std::string& out, std::string_view bytes, bool quoted) {
  classify(
      bytes,
      [&](std::string_view run) {
        if (quoted && run.size() == 1 && (run[0] == '\\' || run[0] == '"')) out += '\\';
        out.append(run);
      },
      [&](unsigned char c) {
        out += "\\x";
        out += static_cast<char>(kHex[c >> 4] | 0x20);  // lower case: "\x0d"
        out += static_cast<char>(kHex[c & 15] | 0x20);
      });
}

void append_json_string(std::string& out, std::string_view bytes) {
  out += '"';
  size_t i = 0;
  while (i < bytes.size()) {
    std::string_view rest = bytes.substr(i);
    size_t n = utf8_scalar_length(rest);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    unsigned char c = static_cast<unsigned char>(rest[0]);
    if (n == 1 && (c == '"' || c == '\\')) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (n == 1 && c < 0x20) {
      switch (c) {
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          out += "\\u00";
          out += static_cast<char>(kHex[c >> 4] | 0x20);
          out += static_cast<char>(kHex[c & 15] | 0x20);
      }
    } else if (n == 3 && unsafe_scalar(rest, n)) {  // U+2028, U+2029
      out += static_cast<unsigned char>(rest[2]) == 0xA8 ? "\\u2028" : "\\u2029";
    } else {
      out.append(rest.substr(0, n));  // DEL and C1 controls are valid in JSON strings
    }
    i += n;
  }
  out += '"';
}

std::string name_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + 8);
  for (unsigned char c : bytes) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (out.empty() || out[0] == '.') out.insert(0, "%");  // never "", "." nor ".."
  return out;
}

std::string bounded_file_name(std::string_view bytes, size_t max) {
  if (max < kMinFileName) max = kMinFileName;
  std::string out = name_encode(bytes);
  if (out.size() <= max) return out;
  // A readable prefix (never cut inside a "%XX"), then the hash of the whole address.
  size_t keep = max - kMinFileName;
  if (keep >= 1 && out[keep - 1] == '%')
    keep -= 1;
  else if (keep >= 2 && out[keep - 2] == '%')
    keep -= 2;
  out.resize(keep);
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, bytes.size(), reinterpret_cast<const uint8_t*>(bytes.data()));
  uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, sizeof digest, digest);
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  out += '~';
  // 128 bits: 21 groups of 6 bits and the last 2.
  uint32_t acc = 0;
  int bits = 0;
  for (int i = 0; i < 16; ++i) {
    acc = (acc << 8) | digest[i];
    bits += 8;
    while (bits >= 6) {
      out += kB64[(acc >> (bits - 6)) & 63];
      bits -= 6;
    }
  }
  if (bits > 0) out += kB64[(acc << (6 - bits)) & 63];
  return out;
}

std::string log_escaped(std::string_view bytes, bool quoted) {
  std::string out;
  out.reserve(bytes.size());
  append_log_escaped(out, bytes, quoted);
  return out;
}

}  // namespace corral::core
