// Dispatch: where one received datagram goes, decided without sockets (the endpoint gathers the
// facts, this decides, the endpoint acts), so the rules are unit-tested on their own.
//
// Two kinds of forwarding meet here. Steering (steering.h): a datagram another slot owns goes to
// that slot. Generations: on SIGHUP a new process of slot i starts while the old one drains, and
// both read slot i's UDP socket. Every server CID carries its generation's parity (byte 0, bit 0),
// and each slot has one forwarding pair per parity, so a datagram for the other generation's
// connection is handed to that generation instead of being answered with a stateless reset:
//
//   another slot's datagram (not itself forwarded)   -> that slot, pair of the CID's parity (a
//                                                       client-chosen DCID: the newest parity we
//                                                       know of)
//   a connection we have                             -> here
//   our slot, the other parity (a newer generation,  -> the other generation of our slot
//   or an older one that may still drain)
//   a new connection (long header, unknown) while    -> the other (newer) generation of our slot
//   we are closing
//   anything else                                    -> here (a new connection, a stateless
//                                                       reset, or dropped)
// A datagram read from a forwarding socket is never forwarded again.
#pragma once

#include <cstdint>

#include "quic/steering.h"

namespace corral::quic {

// What the process knows about itself.
struct DispatchSelf {
  int slot = 0;
  unsigned parity = 1;    // this generation's parity (generation & 1)
  bool steering = false;  // forwarding to other slots is on (mode != off, more than one slot)
  bool closing = false;   // draining after SIGTERM: a newer generation serves the slot
};

// What the endpoint found out about the datagram.
struct DatagramFacts {
  bool forwarded = false;    // read from our forwarding socket
  int owner = kNoOwner;      // packet_owner()
  bool ours = false;         // the DCID is one of our CIDs (cid_is_ours)
  unsigned cid_parity = 0;   // when ours: cid_parity(dcid)
  bool known = false;        // the connection table has it
  bool long_header = false;  // a long header (a new connection when not known)
};

enum class Route {
  kHere,               // the connection table, a new connection, a stateless answer or a drop
  kToSlot,             // forward to another slot's pair `parity`
  kToOtherGeneration,  // forward to our own slot's other-parity pair (counted on its own)
};

struct Dispatch {
  Route route = Route::kHere;
  int slot = 0;
  unsigned parity = 0;
};

Dispatch dispatch(const DispatchSelf& self, const DatagramFacts& d);

}  // namespace corral::quic
