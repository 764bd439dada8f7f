#include "fanout/listen_claim.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "core/event_loop.h"
#include "fanout/quic_sockets.h"
#include "fanout/supervisor.h"

namespace corral::fanout {
namespace {

core::SocketAddress free_port() {
  // A port the kernel picks, resolved: claims are by the real port.
  auto fd = core::listen_tcp(core::parse_address("127.0.0.1:0").value());
  return core::local_address(fd->get()).value();
}

TEST(ListenClaim, SecondClaimNamesTheOwnerAndTheAddress) {
  auto addr = free_port();
  auto first = claim_listen("tcp", addr);
  ASSERT_TRUE(first) << first.error().reason;
  EXPECT_EQ(first.value()->name(), "tcp-" + addr.to_string());
  auto second = claim_listen("tcp", addr);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, kErrorClaimed);
  EXPECT_EQ(second.error().reason, "listen " + addr.to_string() +
                                       " (tcp) is held by another corral (pid " +
                                       std::to_string(getpid()) + ")");
  // UDP is a name of its own.
  auto udp = claim_listen("udp", addr);
  ASSERT_TRUE(udp) << udp.error().reason;
  // Released with its last reference: the next claim takes it.
  first.value().reset();
  EXPECT_TRUE(claim_listen("tcp", addr));
}

TEST(ListenClaim, ProbesAreAcceptedOnTheOwnersLoop) {
  auto addr = free_port();
  auto claim = claim_listen("tcp", addr);
  ASSERT_TRUE(claim);
  core::EventLoop loop;
  claim.value()->watch(loop);
  // Far more probes than the claim's backlog (64): each is accepted and closed, so each still
  // reads the pid.
  for (int i = 0; i < 200; ++i) {
    auto again = claim_listen("tcp", addr);
    ASSERT_FALSE(again);
    ASSERT_NE(again.error().reason.find("(pid " + std::to_string(getpid()) + ")"),
              std::string::npos)
        << i << ": " << again.error().reason;
    loop.run_once(0);
  }
  claim.value()->unwatch();
}

TEST(ListenClaim, AClaimHeldByAForkedChildNamesTheChild) {
  auto addr = free_port();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = claim_listen("tcp", addr);
    char b = c ? 'y' : 'n';
    (void)!write(ready[1], &b, 1);
    pause();
    _exit(0);
  }
  char b = 0;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  ASSERT_EQ(b, 'y');
  auto mine = claim_listen("tcp", addr);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  ASSERT_FALSE(mine);
  EXPECT_NE(mine.error().reason.find("(pid " + std::to_string(child) + ")"), std::string::npos)
      << mine.error().reason;
  // Its claim died with it (SIGKILL: nothing to clean up).
  EXPECT_TRUE(claim_listen("tcp", addr));
}

TEST(ListenClaim, ListenersAndQuicSocketsClaimTheirAddresses) {
  auto any = core::parse_address("127.0.0.1:0").value();
  auto set = make_listeners({any}, 2);
  ASSERT_TRUE(set) << set.error().reason;
  ASSERT_EQ(set->claims.size(), 1u);
  EXPECT_EQ(set->claims[0]->name(), "tcp-" + set->addresses[0].to_string());
  // A second set on the same address is refused; one replacing it in a reload shares the claim.
  auto again = make_listeners({set->addresses[0]}, 1);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, kErrorClaimed);
  auto reload = make_listeners({set->addresses[0]}, 1, &set.value());
  ASSERT_TRUE(reload) << reload.error().reason;
  EXPECT_EQ(reload->claims[0], set->claims[0]);

  auto quic = make_quic_sockets({any}, 2);
  ASSERT_TRUE(quic) << quic.error().reason;
  ASSERT_EQ(quic->claims.size(), 1u);
  auto quic_again = make_quic_sockets({quic->addresses[0]}, 1);
  ASSERT_FALSE(quic_again);
  EXPECT_EQ(quic_again.error().code, kErrorClaimed);
  quic->close();  // terminate(): the claims go with the sockets
  EXPECT_TRUE(make_quic_sockets({quic->addresses[0]}, 1));
}

}  // namespace
}  // namespace corral::fanout
