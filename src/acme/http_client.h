// A small blocking HTTP/1.1 client for the ACME server: one request per connection (Connection:
// close), https (GnuTLS, the server's certificate verified against the system's trust store or a
// given CA file, and its name) or plain http, bounded by a timeout on every socket operation.
// It runs on the renewer's thread, never on an event loop. parse_response() is its sans-IO half
// (status line, headers, Content-Length / chunked / read-to-close body), fuzzed with the order.
#pragma once

#include <string>
#include <string_view>

#include "acme/order.h"
#include "core/result.h"

namespace corral::acme {

struct HttpClientOptions {
  std::string ca_file;  // "": the system's trust store
  int timeout_ms = 15000;
  size_t max_response = 1 << 20;  // a directory, an order or a chain is a few KiB
};

// `raw` is a whole response (the connection closed after it). `head_only`: a HEAD's answer.
core::Result<Response> parse_response(std::string_view raw, bool head_only = false);

core::Result<Response> http_request(const Request& request, const HttpClientOptions& options);

}  // namespace corral::acme
