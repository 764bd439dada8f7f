// The endpoint's stateless answers, as pure rules (unit-tested): how large a stateless reset may
// be, the reset token of a connection ID (derived from the shared secret, so any process of the
// deployment, and a respawned one, computes the same token for a CID it never saw), what a new
// connection's Initial gets (a connection, a Retry, or nothing), a per-second counter that
// measures the Initial rate (RetryMode::kAuto), and the token bucket that caps the stateless
// answers (Retry, Version Negotiation, stateless reset) a process sends.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "quic/context.h"

namespace corral::quic {

// RFC 9000 §10.3.3: a reset is smaller than the packet that triggered it (so two endpoints can
// never loop) and needs 5 unpredictable bytes (the first is the header byte) + the 16-byte token
// at least; we send at most 59 bytes. Returns the total length to send (the random part is that
// minus 16), or 0 when no reset may be sent.
size_t stateless_reset_length(size_t trigger_len);

// The stateless-reset token of `cid`: HKDF over the secret (ngtcp2_crypto). False on failure.
bool stateless_reset_token(const uint8_t* secret, size_t secret_len, const uint8_t* cid,
                           size_t cid_len, uint8_t token[16]);

// Counts events per wall-clock-free second (monotonic ms / 1000).
class PerSecond {
 public:
  // Records one event at `now_ms`; returns how many happened in that second, this one included.
  uint32_t add(uint64_t now_ms) {
    uint64_t s = now_ms / 1000;
    if (s != second_) {
      second_ = s;
      count_ = 0;
    }
    return ++count_;
  }
  uint32_t current(uint64_t now_ms) const { return now_ms / 1000 == second_ ? count_ : 0; }

 private:
  uint64_t second_ = UINT64_MAX;
  uint32_t count_ = 0;
};

// A token bucket: `per_sec` events a second on average, at most `burst` at once. Time is the
// loop's monotonic milliseconds; tokens are kept in thousandths so that any rate refills
// exactly (per_sec thousandths per millisecond).
class TokenBucket {
 public:
  TokenBucket(uint32_t per_sec, uint32_t burst)
      : per_ms_(per_sec), cap_(uint64_t{burst} * 1000), milli_(cap_) {}
  // Takes one token if there is one.
  bool take(uint64_t now_ms) {
    if (now_ms > last_ms_) {
      milli_ = std::min(cap_, milli_ + (now_ms - last_ms_) * per_ms_);
      last_ms_ = now_ms;
    }
    if (milli_ < 1000) return false;
    milli_ -= 1000;
    return true;
  }

 private:
  uint64_t per_ms_;
  uint64_t cap_;
  uint64_t milli_;
  uint64_t last_ms_ = 0;
};

// What an Initial that would open a new connection gets.
enum class Admission {
  kAccept,  // a new connection (handshake state)
  kRetry,   // a stateless Retry: the address proves itself first, no state is kept
  kRefuse,  // dropped (over a cap, with Retry off or for an address already validated)
};

struct AdmissionFacts {
  RetryMode mode = RetryMode::kAuto;
  bool validated = false;             // a valid Retry or NEW_TOKEN token: the address is real
  uint32_t initials_this_second = 0;  // new-connection Initials seen in this second
  uint32_t auto_limit = 1000;         // kAuto: Retry above this rate
  size_t unvalidated = 0;             // handshakes in progress from unvalidated addresses
  size_t max_unvalidated = 256;       // the cap on those
  size_t connections = 0;
  size_t max_connections = 10'000;
};

// The order matters (issue 11, defect 14): an unvalidated Initial under a flood gets a Retry
// before any cap is looked at, so spoofed Initials never fill the table while a real client
// (which answers the Retry) still gets in. Only validated addresses and Retry-off deployments
// meet the caps.
inline Admission admit_initial(const AdmissionFacts& f) {
  const bool full = f.connections >= f.max_connections;
  if (f.validated) return full ? Admission::kRefuse : Admission::kAccept;
  const bool flood = f.unvalidated >= f.max_unvalidated;
  switch (f.mode) {
    case RetryMode::kOn:
      return Admission::kRetry;
    case RetryMode::kOff:
      return full || flood ? Admission::kRefuse : Admission::kAccept;
    case RetryMode::kAuto:
      break;
  }
  if (full || flood || f.initials_this_second > f.auto_limit) return Admission::kRetry;
  return Admission::kAccept;
}

}  // namespace corral::quic
