// ProcessServices: what one server process needs for the worker path once its event loop exists:
// the LinkResolver over its link to the supervisor, the keep-alive pool of upstream connections
// to its workers, and (with worker kinds configured) the timer that reports the proxy's state to
// the supervisor every second (GET /processes). Constructing it fills the site's ResolverSlot;
// destroying it empties the slot again.
//
// Lifetime: one per server process, made in the process's on_loop and destroyed before its loop.
// Single-threaded.
#pragma once

#include <memory>

#include "core/event_loop.h"
#include "core/timer_wheel.h"
#include "core/unique_fd.h"
#include "proxy/proxy.h"
#include "workers/proxy_routes.h"
#include "workers/resolver.h"

namespace corral::workers {

class ProcessServices {
 public:
  // `link` is the process's end of its link to the supervisor; `report`: send the proxy's state
  // every second (the first after 100 ms).
  ProcessServices(core::EventLoop& loop, core::UniqueFd link, std::shared_ptr<ResolverSlot> slot,
                  bool report);
  ~ProcessServices();
  ProcessServices(const ProcessServices&) = delete;
  ProcessServices& operator=(const ProcessServices&) = delete;

  LinkResolver& resolver() { return resolver_; }
  proxy::UpstreamPool& pool() { return pool_; }

 private:
  void send_report();

  std::shared_ptr<ResolverSlot> slot_;
  LinkResolver resolver_;
  proxy::UpstreamPool pool_;
  core::Timer report_;
};

}  // namespace corral::workers
