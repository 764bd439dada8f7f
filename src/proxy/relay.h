// The relay of an upgraded connection (a WebSocket, say) proxied to an upstream: once the
// upstream answered 101, the client's connection and the upstream's socket are relayed byte for
// byte, both ways, with backpressure (a side is not read while the other side's queue is full)
// and half-closes passed on.
//
// Lifetime: RelayUpgrade is the Response::upgrade handler of the 101 the client gets; when the
// server hands the connection over, it makes a Relay, which owns itself from then on (attached
// to the Server as an Upgraded connection) and is destroyed after the loop round it finishes in.
// Both sides are core::Transports: the client's is the one the upgraded connection handed over
// (plain or TLS), the upstream's a PlainTransport. All I/O of a side is in Relay's read_side and
// flush.
#pragma once

#include <memory>
#include <string>

#include "core/unique_fd.h"
#include "http/response.h"

namespace corral::proxy {

class RelayUpgrade final : public http::UpgradeHandler {
 public:
  // `upstream`: the upstream's socket (not registered with the loop); `upstream_leftover`: what
  // it sent after its 101, for the client.
  RelayUpgrade(core::UniqueFd upstream, std::string upstream_leftover)
      : upstream_(std::move(upstream)), leftover_(std::move(upstream_leftover)) {}
  void take_over(http::UpgradeContext ctx) override;

 private:
  core::UniqueFd upstream_;
  std::string leftover_;
};

}  // namespace corral::proxy
