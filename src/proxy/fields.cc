#include "proxy/fields.h"

#include "http/request.h"

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
