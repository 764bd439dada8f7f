// Sockets as routes: add_socket_route() registers a route that accepts a WebSocket upgrade and
// hands the application a Socket (send text/binary, close with a code and reason, on_message,
// on_close, buffered_amount), with the request's params, principal and chosen subprotocol.
//
// A Socket lives from on_open until on_close returns; the application must forget it then (it is
// destroyed right after, on the event loop). Everything runs on the server process's loop; calls
// after close are ignored.
//
// Limits per socket (SocketLimits, chosen per request: they may depend on the principal): the
// largest message (1009 closes that socket only), an output cap for a peer that does not read
// (every queued frame counts, pongs and other control frames too: over it the connection is
// dropped with 1008 and its memory freed rather than the process's memory grown), a ping when idle
// and a close when the peer stays silent, and a timeout for the closing handshake. Pings that
// arrive while our last pong is stuck behind unread output are coalesced (only the most recent is
// answered, RFC 6455 §5.5.3); a peer that sends over 1024 of them is dropped with 1008.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/site.h"
#include "ws/handshake.h"

namespace corral::ws {

struct SocketLimits {
  uint64_t max_message = 1024 * 1024;     // bytes per message (after inflation); 1009 above
  size_t max_buffered = 4 * 1024 * 1024;  // queued output, all frames; above it: dropped, 1008
  uint32_t ping_interval_ms = 20'000;     // silent this long: a ping
  uint32_t idle_timeout_ms = 60'000;      // silent this long (pings unanswered): close 1001
  uint32_t close_timeout_ms = 5'000;      // the peer's answer to our close frame
};

class Socket {
 public:
  using MessageCallback = std::function<void(Socket&, std::string_view data, bool binary)>;
  using CloseCallback = std::function<void(Socket&, uint16_t code, std::string_view reason)>;

  // Queue a message; false if the socket is closing or closed (or was just dropped for passing
  // its output cap).
  virtual bool send_text(std::string_view text) = 0;
  virtual bool send_binary(std::string_view data) = 0;
  // Start the closing handshake (code 1000 or 3000-4999 from applications).
  virtual void close(uint16_t code = kCloseNormal, std::string_view reason = {}) = 0;
  virtual size_t buffered_amount() const = 0;
  virtual bool is_open() const = 0;

  std::string_view param(std::string_view name) const;
  const std::vector<http::Param>& params() const { return params_; }
  const std::optional<http::Principal>& principal() const { return principal_; }
  std::string_view protocol() const { return protocol_; }
  std::string_view remote_address() const { return remote_address_; }
  std::string_view pattern() const { return pattern_; }

  MessageCallback on_message;
  CloseCallback on_close;  // once, with the code that ended the socket (1006: connection lost)

 protected:
  Socket() = default;
  ~Socket() = default;
  std::vector<http::Param> params_;
  std::optional<http::Principal> principal_;
  std::string protocol_;
  std::string remote_address_;
  std::string pattern_;
};

struct SocketRoute {
  HandshakeOptions handshake;
  // Limits for this request's socket (it may look at req.principal); default SocketLimits{}.
  std::function<SocketLimits(const http::Request&)> limits;
  // The socket is open: set on_message / on_close, send a greeting.
  std::function<void(Socket&)> on_open;
};

// Registers `pattern` ("/chat/{room}"; GET is implied) as a socket route. A request to it that is
// not a WebSocket upgrade gets 426; a foreign Origin 403.
void add_socket_route(http::SiteBuilder& site, std::string pattern, SocketRoute route);

}  // namespace corral::ws
