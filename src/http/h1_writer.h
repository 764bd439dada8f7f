// HTTP/1.1 serialization of a ResponsePlan (response_plan.h): the status line, the plan's fields,
// and the framing HTTP/1.1 adds itself — Content-Length, Transfer-Encoding: chunked for a stream
// of unknown length, or the connection's close for such a stream to an HTTP/1.0 client, and
// Connection: close / keep-alive. It decides nothing about the response (that is the plan's), and
// does no I/O: it appends to the connection's output buffer, which the connection then writes.
// Stateless functions; the chunk framing of a stream body is here too.
#pragma once

#include <string_view>

#include "core/buffer.h"
#include "http/response_plan.h"

namespace corral::http {

// How the body after the head is delimited.
struct H1Framing {
  bool chunked = false;  // each write is a chunk; end() writes the last chunk
  bool close = false;  // the connection closes after the response (plan.close, or close-delimited)
};

// Appends the head of `plan` (every kind but kDeferred, which has none yet). `http10`: the
// request was HTTP/1.0 (status line, keep-alive, no chunked coding). A 101 is written as is:
// status line, Server, Date, the route's fields.
H1Framing write_h1_head(const ResponsePlan& plan, bool http10, core::Buffer& out);

// One chunk of a chunked body (nothing for empty data: an empty chunk would end the body).
void append_h1_chunk(core::Buffer& out, std::string_view data);
constexpr std::string_view kH1LastChunk = "0\r\n\r\n";

}  // namespace corral::http
