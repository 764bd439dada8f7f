// Dispatch: where one received datagram goes, decided without sockets (the endpoint gathers the
// facts, this decides, the endpoint acts), so the rules are unit-tested on their own.
//
// Two kinds of forwarding meet here. Steering (steering.h): a datagram another slot owns goes to
// that slot. Generations: on SIGHUP a new process of slot i starts while the old ones drain (up to
// kGenerations of them at once), and all read slot i's UDP socket. Every server CID carries its
// generation's index (byte 0, bits 0..1), and each slot has one forwarding pair per index, so a
// datagram for another generation's connection is handed to that generation instead of being
// answered with a stateless reset. The supervisor publishes, per slot, the generation that serves
// it now (the newest one that is ready): that is where new connections go.
//
//   another slot's datagram (not itself forwarded)   -> that slot, pair of the CID's generation
//                                                       (a client-chosen DCID: the generation
//                                                       serving that slot)
//   a connection we have                             -> here
//   our slot, another generation's CID (a newer one, -> that generation of our slot
//   or an older one that may still drain)
//   a new connection (long header, unknown) while    -> the generation serving our slot (when it
//   we are closing                                      is not us)
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
  unsigned generation = 1;  // this generation's index (generation_index())
  bool steering = false;    // forwarding to other slots is on (mode != off, more than one slot)
  bool closing = false;     // draining: a newer generation serves the slot
};

// What the endpoint found out about the datagram.
struct DatagramFacts {
  bool forwarded = false;       // read from our forwarding socket
  int owner = kNoOwner;         // packet_owner()
  bool ours = false;            // the DCID is one of our CIDs (cid_is_ours)
  unsigned cid_generation = 0;  // when ours: cid_generation(dcid)
  bool known = false;           // the connection table has it
  bool long_header = false;     // a long header (a new connection when not known)
  // The index of the generation serving the owner's slot (ours when there is no owner) now; the
  // process's own index when nobody publishes it (a single-generation embedding).
  unsigned serving = 0;
};

enum class Route {
  kHere,               // the connection table, a new connection, a stateless answer or a drop
  kToSlot,             // forward to another slot's pair `generation`
  kToOtherGeneration,  // forward to our own slot's pair `generation` (counted on its own)
};

struct Dispatch {
  Route route = Route::kHere;
  int slot = 0;
  unsigned generation = 0;
};

Dispatch dispatch(const DispatchSelf& self, const DatagramFacts& d);

}  // namespace corral::quic
