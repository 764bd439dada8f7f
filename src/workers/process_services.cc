#include "workers/process_services.h"

#include "workers/link_codec.h"

namespace corral::workers {

ProcessServices::ProcessServices(core::EventLoop& loop, core::UniqueFd link,
                                 std::shared_ptr<ResolverSlot> slot, bool report)
    : slot_(std::move(slot)), resolver_(loop, std::move(link)), pool_(loop) {
  slot_->resolver = &resolver_;
  slot_->pool = &pool_;
  if (!report) return;
  report_.bind(loop.timers(), [this] {
    send_report();
    report_.arm_after(1000);
  });
  report_.arm_after(100);
}

ProcessServices::~ProcessServices() {
  if (slot_->resolver == &resolver_) slot_->resolver = nullptr;
  if (slot_->pool == &pool_) slot_->pool = nullptr;
}

void ProcessServices::send_report() {
  link::Report report;
  report.fields["proxy"] = {
      {"requests", pool_.stats().requests},   {"resolves", resolver_.sent()},
      {"cached", resolver_.cached()},         {"idle_upstreams", pool_.idle()},
      {"pipelined", pool_.stats().pipelined}, {"rescued", pool_.stats().rescued}};
  resolver_.report(link::encode(report));
}

}  // namespace corral::workers
