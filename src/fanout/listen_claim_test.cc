#include "fanout/listen_claim.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

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

// How another user's process holds an abstract name.
enum class Squat { kListening, kBoundOnly, kBacklogFull };

// Forks a process of uid/gid 65534 (nobody) that binds the abstract `name` the way `how` says,
// then waits to be killed; returns its pid once the name is bound. Needs root (setresuid).
pid_t squat(const std::string& name, Squat how) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  pid_t child = fork();
  if (child != 0) {
    close(ready[1]);
    char b = 0;
    bool ok = read(ready[0], &b, 1) == 1 && b == 'y';
    close(ready[0]);
    if (!ok && child > 0) {
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
      return -1;
    }
    return child;
  }
  char b = 'n';
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path + 1, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  // The socket is made after the switch: its owner (what sock_diag reports) is then nobody too.
  int fd = -1;
  if (setresgid(65534, 65534, 65534) == 0 && setresuid(65534, 65534, 65534) == 0 &&
      (fd = socket(AF_UNIX, SOCK_STREAM, 0)) >= 0 &&
      bind(fd, reinterpret_cast<sockaddr*>(&sun), len) == 0) {
    b = 'y';
    if (how != Squat::kBoundOnly && listen(fd, 0) != 0) b = 'n';
    // A backlog of 0 holds one connection: this one fills it, and nobody accepts it.
    if (how == Squat::kBacklogFull && connect(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0),
                                              reinterpret_cast<sockaddr*>(&sun), len) != 0)
      b = 'n';
  }
  (void)!write(ready[1], &b, 1);
  pause();
  _exit(0);
}

// Kills and reaps the squatter when the test ends, failed or not.
struct Squatter {
  pid_t pid;
  explicit Squatter(pid_t p) : pid(p) {}
  Squatter(const Squatter&) = delete;
  Squatter& operator=(const Squatter&) = delete;
  ~Squatter() { end(); }
  void end() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = 0;
  }
};

TEST(ListenClaim, AClaimOfAnotherUserDoesNotKeepUsOut) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process of another uid";
  for (Squat how : {Squat::kListening, Squat::kBoundOnly, Squat::kBacklogFull}) {
    SCOPED_TRACE(static_cast<int>(how));
    auto addr = free_port();
    Squatter squatter(squat("corral-listen-tcp-" + addr.to_string(), how));
    pid_t other = squatter.pid;
    ASSERT_GT(other, 0);
    auto mine = claim_listen("tcp", addr);
    ASSERT_TRUE(mine) << mine.error().reason;
    ASSERT_TRUE(mine.value()->foreign());
    EXPECT_EQ(mine.value()->foreign()->uid, 65534u);
    // The pid is read from a listener that takes the probe's connection only.
    EXPECT_EQ(mine.value()->foreign()->pid, how == Squat::kListening ? other : 0);
    // Claimed under this user's own name: a second claim of ours is still refused, by pid.
    EXPECT_TRUE(mine.value()->exclusive());
    auto second = claim_listen("tcp", addr);
    ASSERT_FALSE(second);
    EXPECT_EQ(second.error().reason, "listen " + addr.to_string() +
                                         " (tcp) is held by another corral (pid " +
                                         std::to_string(getpid()) + ")");
  }
}

TEST(ListenClaim, BothNamesHeldByAnotherUserLeaveTheClaimNotExclusive) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process of another uid";
  auto addr = free_port();
  std::string base = "corral-listen-tcp-" + addr.to_string();
  Squatter a(squat(base, Squat::kListening));
  Squatter b(squat(base + "-uid" + std::to_string(geteuid()), Squat::kBoundOnly));
  ASSERT_GT(a.pid, 0);
  ASSERT_GT(b.pid, 0);
  auto mine = claim_listen("tcp", addr);
  ASSERT_TRUE(mine) << mine.error().reason;
  EXPECT_FALSE(mine.value()->exclusive());
  ASSERT_TRUE(mine.value()->foreign());
  EXPECT_EQ(mine.value()->foreign()->pid, a.pid);
  core::EventLoop loop;
  mine.value()->watch(loop);  // nothing to watch
  mine.value()->unwatch();
}

TEST(ListenClaim, AClaimOfOurOwnUserThatTakesNoConnectionIsStillRefused) {
  // Bound but not listening (a corral between its bind and its listen): the kernel's socket
  // diagnostics say it is ours.
  auto addr = free_port();
  std::string name = "corral-listen-tcp-" + addr.to_string();
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path + 1, name.data(), name.size());
  core::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&sun),
                 static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())),
            0);
  auto mine = claim_listen("tcp", addr);
  ASSERT_FALSE(mine);
  EXPECT_EQ(mine.error().code, kErrorClaimed);
  EXPECT_EQ(mine.error().reason, "listen " + addr.to_string() + " (tcp) is held by another corral");
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
