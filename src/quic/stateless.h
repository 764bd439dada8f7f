// The endpoint's stateless answers, as pure rules (unit-tested): how large a stateless reset may
// be, the reset token of a connection ID (derived from the shared secret, so any process of the
// deployment, and a respawned one, computes the same token for a CID it never saw), when Retry is
// required, and a per-second counter used both to measure the Initial rate (RetryMode::kAuto) and
// to cap the stateless resets sent.
#pragma once

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

// Whether a new connection without a valid token must go through Retry first.
inline bool retry_required(RetryMode mode, uint32_t initials_this_second, uint32_t auto_limit) {
  switch (mode) {
    case RetryMode::kOn:
      return true;
    case RetryMode::kOff:
      return false;
    case RetryMode::kAuto:
      break;
  }
  return initials_this_second > auto_limit;
}

}  // namespace corral::quic
