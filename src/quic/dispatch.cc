#include "quic/dispatch.h"

namespace corral::quic {

Dispatch dispatch(const DispatchSelf& self, const DatagramFacts& d) {
  const unsigned other = self.parity ^ 1u;
  if (d.forwarded) return {};
  if (self.steering && d.owner != kNoOwner && d.owner != self.slot) {
    // A client-chosen DCID has no parity: it goes to the generation we think serves the slot
    // (the newer one once we are closing; a datagram queued for a process that is not running
    // yet waits in its pair).
    unsigned parity = d.ours ? d.cid_parity : (self.closing ? other : self.parity);
    return {Route::kToSlot, d.owner, parity};
  }
  if (d.known) return {};
  if (d.ours && d.owner == self.slot && d.cid_parity != self.parity) {
    // Always: a newer generation's (we are closing, or generation 1) or an older one's that may
    // still drain. (A deadline after which an older parity drew a stateless reset left a window
    // at the next reload in which an old process not yet told to close reset the new
    // generation's first connections; the price is no reset for a killed older generation.)
    return {Route::kToOtherGeneration, self.slot, other};
  }
  if (d.long_header && self.closing) return {Route::kToOtherGeneration, self.slot, other};
  return {};
}

}  // namespace corral::quic
