// ServerProcess: one server process of a generation, run in the child the supervisor forked: the
// slot's listeners (plain, then TLS), the generation's site and policy, the link to the
// supervisor (workers::ProcessServices: the resolver of worker addresses, the keep-alive pool to
// the workers, the process's report every second) and HTTP/3 (Http3Companion), over
// http::run_server.
//
// Lifetime: made and run() in the child (fanout::ChildMain); run() returns the exit status when
// the process stops. run_server owns the ProcessServices (destroyed before the loop) and the
// Http3Companion (destroyed before the Server): the type-erased owners of RunOptions.
#pragma once

#include <memory>

#include "app/generation.h"
#include "app/quic_service.h"
#include "control/metrics.h"
#include "core/timer_wheel.h"
#include "fanout/supervisor.h"
#include "http/runner.h"
#include "workers/process_services.h"
#include "workers/proxy_routes.h"

namespace corral::app {

// HTTP/3 next to the process's Server, and its report every second (GET /processes).
class Http3Companion {
 public:
  Http3Companion(std::unique_ptr<quic::Http3Server> h3, core::EventLoop& loop,
                 std::shared_ptr<workers::ResolverSlot> slot);
  void close(std::function<void()> done) { h3_->close(std::move(done)); }

 private:
  void report();
  std::unique_ptr<quic::Http3Server> h3_;
  std::shared_ptr<workers::ResolverSlot> slot_;  // the generation's, which outlives this process
  core::Timer report_;
};

class ServerProcess {
 public:
  // `metrics`: the supervisor's region (null: counted in the process's own block, read by none).
  ServerProcess(core::Logger& log, std::shared_ptr<const Generation> generation,
                const fanout::ChildContext& ctx, const QuicService* quic,
                const control::MetricsRegion* metrics);
  int run();

 private:
  http::RunOptions run_options();
  core::Logger& log_;
  std::shared_ptr<const Generation> generation_;
  const fanout::ChildContext& ctx_;
  const QuicService* quic_;  // null: no HTTP/3
  const control::MetricsRegion* metrics_;
};

}  // namespace corral::app
