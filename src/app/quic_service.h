// QuicService: HTTP/3 in the supervisor. Made once per start, before the first fork, and kept
// across SIGHUP generations (the UDP sockets too, in fanout::SupervisorOptions::quic): tokens and
// stateless resets of one generation stay valid in the next. Per slot a UDP socket on the TLS
// listener's port and the forwarding pairs, the steering program, one secret for tokens and
// stateless resets. In each server process, start() makes the process's Http3Server from them.
//
// Lifetime: owned by the Supervision for the supervisor's life; the forked processes use their
// copy of it (read-only).
#pragma once

#include <memory>

#include "app/generation.h"
#include "fanout/quic_sockets.h"
#include "fanout/supervisor.h"
#include "quic/server.h"
#include "quic/steering_setup.h"

namespace corral::app {

class QuicService {
 public:
  // Null, with the problem on stderr (or in the log) and `status` set, when HTTP/3 cannot run.
  static std::unique_ptr<QuicService> create(core::Logger& log, const Generation& generation,
                                             const core::SocketAddress& tls_address, int processes,
                                             int& status);

  // For fanout::SupervisorOptions::quic.
  std::shared_ptr<fanout::QuicSockets> sockets() const { return sockets_; }

  // In a server process: its HTTP/3 server next to `server` (null, logged, when it cannot start).
  std::unique_ptr<quic::Http3Server> start(core::Logger& log, http::Server& server,
                                           const fanout::ChildContext& ctx,
                                           const Generation& generation) const;

 private:
  QuicService() = default;
  std::shared_ptr<fanout::QuicSockets> sockets_;
  std::shared_ptr<quic::Steering> steering_;
  std::shared_ptr<const quic::Secrets> secrets_;
  std::shared_ptr<tls::TicketKey> ticket_key_;
};

}  // namespace corral::app
