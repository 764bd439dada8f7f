#include "http/h1_writer.h"

#include <charconv>
#include <cstring>

namespace corral::http {

namespace {

void append_uint(core::Buffer& b, uint64_t v) {
  char* p = b.reserve(20);
  auto r = std::to_chars(p, p + 20, v);
  b.commit(static_cast<size_t>(r.ptr - p));
}

// One reserve for all the fields, then plain copies: a response head is ~10 fields, and four
// appends each (a capacity check apiece) cost more than the copying (bench/alloc_bench).
void append_fields(core::Buffer& out, const Field* begin, const Field* end) {
  size_t n = 0;
  for (const Field* f = begin; f != end; ++f) n += f->name.size() + f->value.size() + 4;
  if (n == 0) return;
  char* p = out.reserve(n);
  for (const Field* f = begin; f != end; ++f) {
    std::memcpy(p, f->name.data(), f->name.size());
    p += f->name.size();
    *p++ = ':';
    *p++ = ' ';
    std::memcpy(p, f->value.data(), f->value.size());
    p += f->value.size();
    *p++ = '\r';
    *p++ = '\n';
  }
  out.commit(n);
}

}  // namespace

H1Framing write_h1_head(const ResponsePlan& plan, bool http10, core::Buffer& out) {
  H1Framing framing;
  if (plan.body == BodyKind::kUpgrade) {
    // Only HTTP/1.1 has a protocol switch; the status line says so whatever the request said.
    out.append("HTTP/1.1 101 Switching Protocols\r\n");
    append_fields(out, plan.fields.begin(), plan.fields.end());
    out.append("\r\n");
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
  out.append(http10 ? "HTTP/1.0 " : "HTTP/1.1 ");
  append_uint(out, static_cast<uint64_t>(plan.status));
  out.append(' ');
  out.append(reason_phrase(plan.status));
  out.append("\r\n");
  const Field* at = plan.fields.begin() + plan.framing_at;
  append_fields(out, plan.fields.begin(), at);
  if (framing.chunked) {
    out.append("Transfer-Encoding: chunked\r\n");
  } else if (plan.content_length) {
    out.append("Content-Length: ");
    append_uint(out, *plan.content_length);
    out.append("\r\n");
  }
  if (framing.close) {
    out.append("Connection: close\r\n");
  } else if (http10) {
    out.append("Connection: keep-alive\r\n");
  }
  append_fields(out, at, plan.fields.end());
  out.append("\r\n");
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
