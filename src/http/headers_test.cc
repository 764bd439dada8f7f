#include <gtest/gtest.h>

#include "http/request.h"

namespace corral::http {
namespace {

TEST(Headers, HasTokenMatchesWholeCommaSeparatedTokensOfEveryField) {
  Headers h;
  h.add("Connection", "keep-alive, Upgrade");
  h.add("Upgrade", "websocket");
  h.add("Sec-WebSocket-Protocol", "chat");
  h.add("sec-websocket-protocol", " superchat ,json ");
  EXPECT_TRUE(h.has_token("connection", "upgrade"));
  EXPECT_TRUE(h.has_token("CONNECTION", "KEEP-ALIVE"));
  EXPECT_TRUE(h.has_token("upgrade", "websocket"));
  EXPECT_TRUE(h.has_token("sec-websocket-protocol", "chat"));
  EXPECT_TRUE(h.has_token("sec-websocket-protocol", "superchat"));
  EXPECT_TRUE(h.has_token("sec-websocket-protocol", "json"));
  EXPECT_FALSE(h.has_token("connection", "close"));
  EXPECT_FALSE(h.has_token("te", "trailers"));  // no such field
}

TEST(Headers, HasTokenIsNotASubstringMatch) {
  Headers h;
  h.add("Connection", "x-upgrade-later, upgrades");
  EXPECT_FALSE(h.has_token("connection", "upgrade"));
  h.add("Connection", "");
  EXPECT_FALSE(h.has_token("connection", ""));  // an empty list has no token
}

}  // namespace
}  // namespace corral::http
