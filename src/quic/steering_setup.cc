#include "quic/steering_setup.h"

#include <gnutls/crypto.h>

#include <cerrno>
#include <utility>

namespace corral::quic {

const char* steering_name(SteeringMode m) {
  switch (m) {
    case SteeringMode::kBpf:
      return "bpf";
    case SteeringMode::kForward:
      return "forward";
    case SteeringMode::kOff:
      return "off";
  }
  return "?";
}

const char* steering_request_name(SteeringRequest r) {
  switch (r) {
    case SteeringRequest::kAuto:
      return "auto";
    case SteeringRequest::kBpf:
      return "bpf";
    case SteeringRequest::kForward:
      return "forward";
    case SteeringRequest::kOff:
      return "off";
  }
  return "?";
}

core::Result<SteeringRequest> parse_steering_request(std::string_view text) {
  if (text == "auto") return SteeringRequest::kAuto;
  if (text == "bpf") return SteeringRequest::kBpf;
  if (text == "forward") return SteeringRequest::kForward;
  if (text == "off") return SteeringRequest::kOff;
  return core::Error{
      EINVAL, "steering must be auto, bpf, forward or off (got \"" + std::string(text) + "\")"};
}

ProcessContext Steering::context(int slot, uint64_t generation, std::vector<int> udp_fds,
                                 int forward_rx, std::vector<ForwardPair> forward_tx,
                                 ServingGenerations serving) const {
  ProcessContext ctx;
  ctx.slot = slot;
  ctx.generation = generation;
  ctx.key = key;
  ctx.mode = mode;
  ctx.udp_fds = std::move(udp_fds);
  ctx.forward_rx = forward_rx;
  ctx.forward_tx = std::move(forward_tx);
  ctx.serving = serving;
  return ctx;
}

core::Result<std::shared_ptr<Steering>> setup_steering(const std::vector<std::vector<int>>& groups,
                                                       uint32_t slots, SteeringRequest request,
                                                       core::Logger& log) {
  if (slots == 0 || slots > kMaxSlots)
    return core::Error{EINVAL, "QUIC steering supports 1.." + std::to_string(kMaxSlots) +
                                   " processes (got " + std::to_string(slots) + ")"};
  for (const auto& g : groups)
    if (g.size() != slots) return core::Error{EINVAL, "a QUIC socket group lacks slots"};

  auto s = std::make_shared<Steering>();
  s->key.slots = slots;
  if (gnutls_rnd(GNUTLS_RND_RANDOM, &s->key.tag, sizeof s->key.tag) < 0 ||
      gnutls_rnd(GNUTLS_RND_RANDOM, &s->key.seed, sizeof s->key.seed) < 0)
    return core::Error{EIO, "gnutls_rnd failed"};

  auto load_all = [&]() -> core::Result<void> {
    std::vector<BpfSteering> programs;
    for (const auto& g : groups) {
      auto p = load_bpf_steering(g, s->key, &log);
      if (!p) return p.error();
      programs.push_back(std::move(p.value()));
    }
    s->programs = std::move(programs);
    return {};
  };

  switch (request) {
    case SteeringRequest::kOff:
      s->mode = SteeringMode::kOff;
      break;
    case SteeringRequest::kForward:
      s->mode = SteeringMode::kForward;
      break;
    case SteeringRequest::kBpf:
      if (auto r = load_all(); !r)
        return core::Error{r.error().code, "BPF steering: " + r.error().reason};
      s->mode = SteeringMode::kBpf;
      break;
    case SteeringRequest::kAuto:
      if (auto r = load_all(); r) {
        s->mode = SteeringMode::kBpf;
      } else {
        s->mode = SteeringMode::kForward;
        s->fallback_reason = r.error().reason;
        log.warn("quic_steering_fallback", "mode=forward reason=\"{}\"", s->fallback_reason);
      }
      break;
  }
  log.info("quic_steering", "mode={} requested={} slots={} groups={}", steering_name(s->mode),
           steering_request_name(request), slots, groups.size());
  return s;
}

}  // namespace corral::quic
