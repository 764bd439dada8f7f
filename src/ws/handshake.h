// The WebSocket opening handshake (RFC 6455 §4.2), server side, as a pure function of the request:
// whether it is an upgrade at all (426 otherwise), the version (13, else 426 with the supported
// version), the key, the Origin (the server's own origin or an allowed one, else 403: a page on
// another site must not open a socket with the user's cookies), the subprotocol and the
// permessage-deflate offer. Runs after admission, authenticators and wraps, before any upgrade.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "http/request.h"
#include "http/response.h"
#include "ws/frame.h"

namespace corral::ws {

struct HandshakeOptions {
  // Origins accepted besides the request's own ("scheme://host[:port]" exactly, lowercase).
  std::vector<std::string> allowed_origins;
  // Subprotocols the route speaks, in preference order; the first one the client offers wins.
  std::vector<std::string> subprotocols;
  bool deflate = true;  // accept a permessage-deflate offer
};

struct Handshake {
  int status = 0;  // 0: accepted; else 400, 403 or 426 to answer instead of upgrading
  std::string_view reason;
  std::string accept;    // Sec-WebSocket-Accept
  std::string protocol;  // the chosen subprotocol, empty if none
  std::optional<DeflateParams> deflate;
  std::string extensions;  // the Sec-WebSocket-Extensions response value, empty if none
};

Handshake check_handshake(const http::Request& req, const HandshakeOptions& options);

// The response to a refused handshake (426 carries Upgrade and Sec-WebSocket-Version).
http::Response refusal(const Handshake& h);

// base64(SHA-1(key + GUID)).
std::string accept_key(std::string_view key);

}  // namespace corral::ws
