#include "http/h1_writer.h"

#include <charconv>
#include <cstring>

namespace corral::http {

namespace {

// The head is written through one pointer into one reserve() of its greatest size, and its
// pieces are copied with fixed-size moves: a head is ~12 short pieces (names and values of 4-31
// bytes), where an append apiece (a capacity check, a call to memcpy) costs more than the bytes
// (bench/alloc_bench, docs/performance.md "Issue 12").
template <size_t N>
void move_bytes(char* to, const char* from) {
  std::memcpy(to, from, N);  // a constant size: one load and one store
}

// Inlined: a call apiece would cost as much as the moves.
[[gnu::always_inline]] inline char* put(char* p, std::string_view s) {
  const char* from = s.data();
  const size_t n = s.size();
  if (n <= 16) {
    // Two moves that overlap in the middle cover every length between their size and twice it.
    if (n >= 8) {
      move_bytes<8>(p, from);
      move_bytes<8>(p + n - 8, from + n - 8);
    } else if (n >= 4) {
      move_bytes<4>(p, from);
      move_bytes<4>(p + n - 4, from + n - 4);
    } else if (n > 0) {
      p[0] = from[0];
      p[n / 2] = from[n / 2];
      p[n - 1] = from[n - 1];
    }
  } else if (n <= 32) {
    move_bytes<16>(p, from);
    move_bytes<16>(p + n - 16, from + n - 16);
  } else {
    std::memcpy(p, from, n);
  }
  return p + n;
}

constexpr size_t kMaxUint = 20;  // digits of a uint64_t

char* put_uint(char* p, uint64_t v) {
  return std::to_chars(p, p + kMaxUint, v).ptr;
}

size_t fields_size(const Field* begin, const Field* end) {
  size_t n = 0;
  for (const Field* f = begin; f != end; ++f) n += f->name.size() + f->value.size() + 4;
  return n;
}

char* put_fields(char* p, const Field* begin, const Field* end) {
  for (const Field* f = begin; f != end; ++f) {
    p = put(p, f->name);
    *p++ = ':';
    *p++ = ' ';
    p = put(p, f->value);
    *p++ = '\r';
    *p++ = '\n';
  }
  return p;
}

char* put_status(char* p, int status) {
  if (status >= 100 && status <= 999) {
    p[0] = static_cast<char>('0' + status / 100);
    p[1] = static_cast<char>('0' + status / 10 % 10);
    p[2] = static_cast<char>('0' + status % 10);
    return p + 3;
  }
  return put_uint(p, static_cast<uint64_t>(status));
}

constexpr std::string_view kChunked = "Transfer-Encoding: chunked\r\n";
constexpr std::string_view kLength = "Content-Length: ";
constexpr std::string_view kClose = "Connection: close\r\n";
constexpr std::string_view kKeepAlive = "Connection: keep-alive\r\n";
// Past the status line and the fields: the longest framing and connection fields, the blank line.
constexpr size_t kMaxFraming = kLength.size() + kMaxUint + 2 + kKeepAlive.size() + 2;

}  // namespace

H1Framing write_h1_head(const ResponsePlan& plan, bool http10, core::Buffer& out) {
  H1Framing framing;
  const Field* begin = plan.fields.begin();
  const Field* end = plan.fields.end();
  if (plan.body == BodyKind::kUpgrade) {
    // Only HTTP/1.1 has a protocol switch; the status line says so whatever the request said.
    constexpr std::string_view kSwitching = "HTTP/1.1 101 Switching Protocols\r\n";
    char* const head = out.reserve(kSwitching.size() + fields_size(begin, end) + 2);
    char* p = put(head, kSwitching);
    p = put_fields(p, begin, end);
    p = put(p, "\r\n");
    out.commit(static_cast<size_t>(p - head));
    return framing;
  }
  framing.close = plan.close;
  if (plan.body == BodyKind::kStream && !plan.content_length) {
    if (http10) {
      framing.close = true;  // the body ends where the connection does
    } else {
      framing.chunked = plan.send_body;
    }
  }
  const std::string_view reason = reason_phrase(plan.status);
  const size_t status_line = 9 + kMaxUint + 1 + reason.size() + 2;
  char* const head = out.reserve(status_line + fields_size(begin, end) + kMaxFraming);
  char* p = put(head, http10 ? "HTTP/1.0 " : "HTTP/1.1 ");
  p = put_status(p, plan.status);
  *p++ = ' ';
  p = put(p, reason);
  p = put(p, "\r\n");
  const Field* at = begin + plan.framing_at;
  p = put_fields(p, begin, at);
  if (framing.chunked) {
    p = put(p, kChunked);
  } else if (plan.content_length) {
    p = put(p, kLength);
    p = put_uint(p, *plan.content_length);
    p = put(p, "\r\n");
  }
  if (framing.close) {
    p = put(p, kClose);
  } else if (http10) {
    p = put(p, kKeepAlive);
  }
  p = put_fields(p, at, end);
  p = put(p, "\r\n");
  out.commit(static_cast<size_t>(p - head));
  return framing;
}

void append_h1_chunk(core::Buffer& out, std::string_view data) {
  if (data.empty()) return;
  char* p = out.reserve(16);
  auto r = std::to_chars(p, p + 16, data.size(), 16);
  out.commit(static_cast<size_t>(r.ptr - p));
  out.append("\r\n");
  out.append(data);
  out.append("\r\n");
}

}  // namespace corral::http
