// The headers corral adds to every response, whatever the protocol: HTTP/1.1 writes them in
// Connection::write_head, HTTP/3 in quic::response_head. One definition, so the two never differ
// (the security defaults above all).
//
//   X-Content-Type-Options: nosniff
//   Referrer-Policy: <ServerOptions::referrer_policy>
//   Content-Security-Policy (HTML only, unless the route set its own), with the request's fresh
//   nonce for inline scripts and styles.
#pragma once

#include <string_view>

#include "http/response.h"

namespace corral::http {

constexpr std::string_view kNosniff = "nosniff";

// Whether an HTML response gets the default Content-Security-Policy.
inline bool wants_default_csp(bool has_nonce, const Response& r) {
  return has_nonce && r.is_html() && !r.find_header("content-security-policy");
}

// Appends the default Content-Security-Policy value for `nonce` to `out` (a std::string or a
// core::Buffer: anything with append(std::string_view)).
template <typename Out>
void append_default_csp(Out& out, std::string_view nonce) {
  out.append(std::string_view("default-src 'self'; script-src 'self' 'nonce-"));
  out.append(nonce);
  out.append(std::string_view("'; style-src 'self' 'nonce-"));
  out.append(nonce);
  out.append(std::string_view("'; object-src 'none'; base-uri 'self'; frame-ancestors 'self'"));
}

}  // namespace corral::http
