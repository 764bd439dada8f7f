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

int Http3Server::slot() const {
  return endpoint_->ctx().slot;
}

}  // namespace corral::quic
