#include "quic/stateless.h"

#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include <algorithm>

namespace corral::quic {

size_t stateless_reset_length(size_t trigger_len) {
  // ngtcp2 writes randlen bytes (the first becomes the header byte) + the token.
  constexpr size_t kMin = NGTCP2_MIN_STATELESS_RESET_RANDLEN + NGTCP2_STATELESS_RESET_TOKENLEN;
  if (trigger_len <= kMin) return 0;
  return std::min<size_t>(trigger_len - 1, 59);
}

bool stateless_reset_token(const uint8_t* secret, size_t secret_len, const uint8_t* cid,
                           size_t cid_len, uint8_t token[16]) {
  if (cid_len > NGTCP2_MAX_CIDLEN) return false;
  ngtcp2_cid c;
  ngtcp2_cid_init(&c, cid, cid_len);
  return ngtcp2_crypto_generate_stateless_reset_token(token, secret, secret_len, &c) == 0;
}

}  // namespace corral::quic
