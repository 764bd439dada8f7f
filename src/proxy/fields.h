// The proxy's field rules, in one place for the request it rewrites (proxy.cc) and the response
// head it reads (the ResponseReader of every upstream connection stores only what is passed on).
// By length first: one or two comparisons per field instead of a dozen calls (they run for every
// field of every proxied request and response).
#pragma once

#include <string_view>

namespace corral::proxy {

// Hop-by-hop fields (RFC 9110 §7.6.1) and the other connection-specific ones: never forwarded.
bool hop_by_hop(std::string_view name);

// The options of a Connection field (RFC 9110 §7.6.1): the fields they name are hop-by-hop in
// that message and are not forwarded either way. `values`: comma-separated (several Connection
// fields joined by ','). Tokens are whole and case-insensitive ("x-secret" does not list
// "x-secret-2").
bool connection_lists(std::string_view values, std::string_view field);
// Whether `values` lists an option besides close and keep-alive (which name no field the proxy
// passes on): only then is each field looked up in it.
bool connection_names_fields(std::string_view values);

// Response fields the proxy does not pass on: hop-by-hop, the framing, and those the front adds
// itself (Date, Server and the default security headers).
bool dropped_response_header(std::string_view name);

}  // namespace corral::proxy
