#include "quic/server.h"

#include "quic/endpoint.h"

namespace corral::quic {

Http3Server::Http3Server(http::Server& tcp, ProcessContext ctx, Http3Options options)
    : endpoint_(std::make_unique<Endpoint>(tcp, std::move(ctx), options)) {}

Http3Server::~Http3Server() = default;

core::Result<void> Http3Server::start() {
  return endpoint_->start();
}

void Http3Server::close(std::function<void()> done) {
  endpoint_->close(std::move(done));
}

const Http3Stats& Http3Server::stats() const {
  return endpoint_->stats();
}

SteeringMode Http3Server::steering_mode() const {
  return endpoint_->ctx().mode;
}

nlohmann::json Http3Server::stats_json() const {
  const auto& s = stats();
  return {{"steering", steering_name(steering_mode())},
          {"connections", s.connections_active},
          {"handshakes", s.handshakes},
          {"requests", s.requests},
          {"packets_in", s.packets_in},
          {"packets_out", s.packets_out},
          {"forwarded_out", s.forwarded_out},
          {"forwarded_in", s.forwarded_in},
          {"forwarded_generation", s.forwarded_generation},
          {"stateless_resets", s.stateless_resets},
          {"retries_sent", s.retries_sent},
          {"version_negotiations", s.version_negotiations},
          {"retries_limited", s.retries_limited},
          {"stateless_resets_limited", s.stateless_resets_limited},
          {"handshakes_unvalidated", s.handshakes_unvalidated},
          {"handshake_timeouts", s.handshake_timeouts},
          {"initials_refused", s.initials_refused},
          {"requests_incomplete", s.requests_incomplete},
          {"dropped", s.dropped}};
}

int Http3Server::slot() const {
  return endpoint_->ctx().slot;
}

}  // namespace corral::quic
