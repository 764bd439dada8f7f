// The Manager's heartbeat on a worker's control link (issue 14; docs/worker-protocol.md, "Ping"):
// a worker whose `ready` said `ping: true` gets `{"type":"ping","id":N}` every heartbeat_ms of
// its kind and answers `{"type":"pong","id":N}` from the thread that runs its lifecycle (the C++
// library's loop, the Python library's main thread). A worker whose loop is stuck (a handler that
// blocks, a deadlock) still holds its link open, so without this it would look alive forever and
// hold its address: no pong within 2 x heartbeat_ms of a ping is handled as a lost link
// (worker_unresponsive, then the lost-link path: a stop, recovered from once per
// link_recovery_window_ms, a second one fails the address).
//
// One ping at a time per worker, one timer per worker: armed for the next ping, then for the
// waiting ping's deadline. A stopping worker is no longer pinged (its stop has its own grace).
#include "workers/control_codec.h"
#include "workers/manager_impl.h"

namespace corral::workers {

using namespace detail;

void Manager::heartbeat_on_ready(Worker& w, const nlohmann::json& ready) {
  auto ping = ready.find("ping");
  w.can_ping = ping != ready.end() && ping->is_boolean() && ping->get<bool>();
  const uint32_t every = w.home->kind->config.heartbeat_ms;
  if (!w.can_ping || every == 0) return;
  Worker* wp = &w;
  w.heartbeat.bind(loop_.timers(), [this, wp] { heartbeat_due(*wp); });
  w.heartbeat.arm_after(every);
}

void Manager::heartbeat_on_pong(Worker& w, const nlohmann::json& pong) {
  auto id = pong.find("id");
  if (w.ping_waiting == 0 || id == pong.end() || !id->is_number_unsigned() ||
      id->get<uint64_t>() != w.ping_waiting)
    return;  // late (a ping already given up on) or not ours: ignored
  w.ping_waiting = 0;
  if (w.stopping) return w.heartbeat.cancel();
  // The next ping a heartbeat after this one was sent (at once if the answer took that long).
  w.heartbeat.arm_at(w.ping_sent_ms + w.home->kind->config.heartbeat_ms);
}

void Manager::heartbeat_due(Worker& w) {
  // Its home may be gone once it exited (it waits for deferred destruction); a link already
  // closed is the lost-link check's (on_link_check).
  if (w.exited || w.stopping || !w.control) return;
  const uint32_t every = w.home->kind->config.heartbeat_ms;
  const uint64_t now = loop_.now();
  if (w.ping_waiting != 0) {
    log_.warn("worker_unresponsive", "address=\"{}\" pid={} ping={} waited_ms={} heartbeat_ms={}",
              w.home->address, w.pid, w.ping_waiting, now - w.ping_sent_ms, every);
    w.ping_waiting = 0;
    return link_lost(w, "unresponsive",
                     public_error("The worker stopped answering.", "unresponsive"));
  }
  w.ping_waiting = ++w.ping_ids;
  w.ping_sent_ms = now;
  // A ping that cannot be sent (the worker does not read its link, so the socket's buffer is
  // full) is as unanswered as one that was.
  send(w, control::ping(w.ping_waiting));
  w.heartbeat.arm_after(2 * static_cast<uint64_t>(every));
}

}  // namespace corral::workers
