// The upgrade's Sec-WebSocket-Accept (RFC 6455 §4.2.2): the SHA-1 (nettle's) of the key and the
// protocol's GUID, in base64.
#include "ws/handshake.h"

#include <gtest/gtest.h>

namespace corral::ws {
namespace {

TEST(Handshake, AcceptKeyIsTheRfcExample) {
  EXPECT_EQ(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

}  // namespace
}  // namespace corral::ws
