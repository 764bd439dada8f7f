#include "app/server_process.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/logs.h"
#include "tls/transport.h"
#include "workers/link_codec.h"

namespace corral::app {

Http3Companion::Http3Companion(std::unique_ptr<quic::Http3Server> h3, core::EventLoop& loop,
                               std::shared_ptr<workers::ResolverSlot> slot)
    : h3_(std::move(h3)), slot_(std::move(slot)) {
  report_.bind(loop.timers(), [this] { report(); });
  report_.arm_after(100);
}

void Http3Companion::report() {
  // {"type":"report","quic":{...}}: what GET /processes shows of the process's HTTP/3.
  if (slot_->resolver) {
    workers::link::Report message;
    message.fields["quic"] = h3_->stats_json();
    slot_->resolver->report(workers::link::encode(message));
  }
  report_.arm_after(1000);
}

ServerProcess::ServerProcess(core::Logger& log, std::shared_ptr<const Generation> generation,
                             const fanout::ChildContext& ctx, const QuicService* quic,
                             const control::MetricsRegion* metrics)
    : log_(log), generation_(std::move(generation)), ctx_(ctx), quic_(quic), metrics_(metrics) {}

http::RunOptions ServerProcess::run_options() {
  const Options& o = generation_->options;
  http::RunOptions run;
  // The slot's sockets in make_listeners' order: the plain listener, then the TLS one.
  run.adopt_fds = {ctx_.listen_fds.front()};
  if (o.tls && ctx_.listen_fds.size() > 1) {
    run.adopt_tls_fds = {ctx_.listen_fds[1]};
    run.tls = std::make_shared<tls::TlsTransportFactory>(o.tls);
  }
  run.server = o.server;
  run.policy = o.policy;
  run.drain_signal = fanout::kDrainSignal;  // a newer generation serves the slot
  run.on_listening = [this](http::Server&, const std::vector<core::SocketAddress>&) {
    ctx_.notify_ready();
  };
  if (ctx_.link_fd >= 0 && o.resolver_slot) {
    run.on_loop = [this](core::EventLoop& loop) -> std::shared_ptr<void> {
      const Options& o = generation_->options;
      return std::make_shared<workers::ProcessServices>(loop, core::UniqueFd(ctx_.link_fd),
                                                        o.resolver_slot, !o.kinds.empty());
    };
  }
  if (quic_ && o.credentials && !ctx_.udp_fds.empty()) {
    run.server.alt_svc = fmt::format("h3=\":{}\"; ma=86400", generation_->tls_port);
    run.on_server = [this](http::Server& server) {
      auto h3 = quic_->start(log_, server, ctx_, *generation_);
      if (!h3) return http::RunOptions::Companion{};
      auto companion = std::make_shared<Http3Companion>(std::move(h3), server.loop(),
                                                        generation_->options.resolver_slot);
      return http::RunOptions::Companion{
          companion, [c = companion.get()](std::function<void()> done) { c->close(done); }};
    };
  }
  return run;
}

int ServerProcess::run() {
  // From here on this process counts in its block of the supervisor's region (http/metrics.h):
  // the block of its slot and generation index, which no other live process has.
  if (metrics_) http::adopt_metrics(metrics_->block(ctx_.slot, ctx_.generation), metrics_->kinds());
  if (generation_->options.on_process) generation_->options.on_process(ctx_.slot);
  auto run = run_options();
  log_.set_level(generation_->options.log_level);
  log_.forget_access_file();  // the launcher closed what this process inherited
  if (auto problem = apply_log_options(log_, generation_->options); !problem.empty())
    log_.error("access_log_failed", "error=\"{}\"", problem);
#ifdef CORRAL_FAULT_INJECTION
  // Test builds only (src/app/CMakeLists.txt): a slot that crashes at startup (a crash loop);
  // every server process exiting with a status at startup (a configuration it cannot run: 78).
  if (const char* crash = getenv("CORRAL_TEST_CRASH_AT_START");
      crash && std::to_string(ctx_.slot) == crash)
    abort();
  if (const char* code = getenv("CORRAL_TEST_EXIT_AT_START"); code && *code) return atoi(code);
#endif
  return http::run_server(log_, run, generation_->options.site);
}

}  // namespace corral::app
