#include "app/quic_service.h"

#include <gnutls/crypto.h>

#include "app/problems.h"

namespace corral::app {

// The generation index bits of QUIC CIDs and the supervisor's forwarding pairs per slot agree.
static_assert(fanout::kGenerations == quic::kGenerations);

std::unique_ptr<QuicService> QuicService::create(core::Logger& log, const Generation& generation,
                                                 const core::SocketAddress& tls_address,
                                                 int processes, int& status) {
  const Options& o = generation.options;
  auto request = quic::parse_steering_request(o.steering);
  if (!request) {
    status = print_problem("http3.steering", request.error().reason);
    return nullptr;
  }
  auto sockets = fanout::make_quic_sockets({tls_address}, processes);
  if (!sockets) {
    status = listen_problem(log, tls_address, sockets.error());
    return nullptr;
  }
  fanout::report_claims(log, sockets->claims);
  std::unique_ptr<QuicService> q(new QuicService);
  q->sockets_ = std::make_shared<fanout::QuicSockets>(std::move(sockets.value()));
  std::vector<std::vector<int>> groups;
  for (size_t a = 0; a < q->sockets_->addresses.size(); ++a)
    groups.push_back(q->sockets_->group(a));
  auto steering =
      quic::setup_steering(groups, static_cast<uint32_t>(processes), request.value(), log);
  if (!steering) {
    status = print_problem("http3.steering", steering.error().reason);
    return nullptr;
  }
  q->sockets_->steering = steering.value();
  q->steering_ = steering.value();
  auto secrets = std::make_shared<quic::Secrets>();
  if (gnutls_rnd(GNUTLS_RND_KEY, secrets->static_secret, sizeof secrets->static_secret) != 0) {
    status = print_problem("http3", "no random bytes for the QUIC secret");
    return nullptr;
  }
  q->secrets_ = std::move(secrets);
  q->ticket_key_ = o.ticket_key;
  log.info("http3_listening", "address={} processes={} steering={} retry={}",
           q->sockets_->addresses.front().to_string(), processes,
           quic::steering_name(q->steering_->mode), o.retry);
  return q;
}

std::unique_ptr<quic::Http3Server> QuicService::start(core::Logger& log, http::Server& server,
                                                      const fanout::ChildContext& ctx,
                                                      const Generation& generation) const {
  auto pc = steering_->context(ctx.slot, ctx.generation, ctx.udp_fds, ctx.forward_rx,
                               ctx.forward_tx, ctx.quic_serving);
  pc.secrets = secrets_;
  pc.credentials = generation.options.credentials;
  pc.ticket_key = ticket_key_;
  auto h3 =
      std::make_unique<quic::Http3Server>(server, std::move(pc), generation.options.http3_options);
  if (auto r = h3->start(); !r) {
    log.error("http3_failed", "slot={} error=\"{}\"", ctx.slot, r.error().reason);
    return nullptr;
  }
  return h3;
}

}  // namespace corral::app
