#include "core/message_link.h"

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace corral::core {
namespace {

TEST(MessageLink, MessagesKeepTheirBoundariesAndOrder) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  EventLoop loop;
  MessageLink a(loop, UniqueFd(sv[0])), b(loop, UniqueFd(sv[1]));
  std::vector<std::string> got;
  b.on_message = [&](std::string_view m) { got.emplace_back(m); };
  for (int i = 0; i < 500; ++i) a.send("message " + std::to_string(i));  // more than the buffer
  for (int i = 0; i < 200 && got.size() < 500; ++i) loop.run_once(5);
  ASSERT_EQ(got.size(), 500u);
  EXPECT_EQ(got.front(), "message 0");
  EXPECT_EQ(got.back(), "message 499");
}

TEST(MessageLink, ThePeerClosingIsReportedOnce) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  EventLoop loop;
  MessageLink b(loop, UniqueFd(sv[1]));
  int closed = 0;
  b.on_closed = [&] { ++closed; };
  ::close(sv[0]);
  for (int i = 0; i < 20 && closed == 0; ++i) loop.run_once(5);
  EXPECT_EQ(closed, 1);
  EXPECT_FALSE(b.open());
  b.send("nobody listens");  // harmless
}

}  // namespace
}  // namespace corral::core
