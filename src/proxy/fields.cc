#include "proxy/fields.h"

#include "http/request.h"
#include "http/text.h"

namespace corral::proxy {

using http::iequals;

bool hop_by_hop(std::string_view name) {
  switch (name.size()) {
    case 2:
      return iequals(name, "te");
    case 7:
      return iequals(name, "trailer") || iequals(name, "upgrade");
    case 10:
      return iequals(name, "connection") || iequals(name, "keep-alive");
    case 16:
      return iequals(name, "proxy-connection");
    case 17:
      return iequals(name, "transfer-encoding");
    case 18:
      return iequals(name, "proxy-authenticate");
    case 19:
      return iequals(name, "proxy-authorization");
    default:
      return false;
  }
}

namespace {

// Calls `f(token)` for each non-empty comma-separated token of `values`, OWS trimmed, until it
// returns true; returns whether one did.
template <class F>
bool any_token(std::string_view values, F f) {
  while (!values.empty()) {
    size_t comma = values.find(',');
    std::string_view token = http::trim_ows(values.substr(0, comma));
    if (!token.empty() && f(token)) return true;
    if (comma == std::string_view::npos) break;
    values.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

bool connection_lists(std::string_view values, std::string_view field) {
  return any_token(values, [field](std::string_view t) { return iequals(t, field); });
}

bool connection_names_fields(std::string_view values) {
  return any_token(
      values, [](std::string_view t) { return !iequals(t, "close") && !iequals(t, "keep-alive"); });
}

bool dropped_response_header(std::string_view name) {
  switch (name.size()) {
    case 4:
      return iequals(name, "date");
    case 6:
      return iequals(name, "server");
    case 14:
      return iequals(name, "content-length");
    case 15:
      return iequals(name, "referrer-policy");
    case 22:
      return iequals(name, "x-content-type-options");
    default:
      return hop_by_hop(name);
  }
}

}  // namespace corral::proxy
