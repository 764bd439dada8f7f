#include "quic/dispatch.h"

namespace corral::quic {

Dispatch dispatch(const DispatchSelf& self, const DatagramFacts& d) {
  if (d.forwarded) return {};
  if (self.steering && d.owner != kNoOwner && d.owner != self.slot) {
    // A client-chosen DCID has no generation: it goes to the one serving the slot (a datagram
    // queued for a process that is not reading yet waits in its pair).
    return {Route::kToSlot, d.owner, d.ours ? d.cid_generation : d.serving};
  }
  if (d.known) return {};
  if (d.ours && d.owner == self.slot && d.cid_generation != self.generation) {
    // Always: a newer generation's (we are draining, or it is) or an older one's that may still
    // drain. (A deadline after which an older index drew a stateless reset left a window at the
    // next reload in which an old process not yet told to drain reset the new generation's first
    // connections; the price is no reset for a killed older generation.) The supervisor never
    // lets two live processes of a slot share an index.
    return {Route::kToOtherGeneration, self.slot, d.cid_generation};
  }
  if (d.long_header && self.closing && d.serving != self.generation)
    return {Route::kToOtherGeneration, self.slot, d.serving};
  return {};
}

}  // namespace corral::quic
