// The sd_notify datagrams and the LISTEN_FDS parsing, against sockets the test owns.
#include "core/systemd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/event_loop.h"

namespace corral::core {
namespace {

// A datagram socket bound at `name` ("@x": abstract), as systemd's notify socket is.
UniqueFd bound_datagram(const std::string& name) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = name;
  if (path[0] == '@') path[0] = '\0';
  memcpy(addr.sun_path, path.data(), path.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() +
                                    (path[0] == '\0' ? 0 : 1));
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len), 0) << strerror(errno);
  return fd;
}

std::string receive(int fd) {
  char buf[512];
  ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  return n < 0 ? std::string("<none>") : std::string(buf, static_cast<size_t>(n));
}

TEST(NotifierTest, SendsToAnAbstractNameAndUnsetsTheEnvironment) {
  std::string name = "@corral-notify-test-" + std::to_string(getpid());
  UniqueFd sock = bound_datagram(name);
  setenv("NOTIFY_SOCKET", name.c_str(), 1);
  Notifier n = Notifier::take_from_environment();
  EXPECT_EQ(getenv("NOTIFY_SOCKET"), nullptr);  // no child notifies in our name
  ASSERT_TRUE(n.enabled());
  n.ready();
  EXPECT_EQ(receive(sock.get()), "READY=1");
  n.reloading();
  std::string r = receive(sock.get());
  EXPECT_EQ(r.rfind("RELOADING=1\nMONOTONIC_USEC=", 0), 0u) << r;
  EXPECT_GT(std::stoull(r.substr(r.find('=', 12) + 1)), 0u);
  n.status("2/2 processes");
  n.status("2/2 processes");  // unchanged: not sent again
  n.stopping();
  EXPECT_EQ(receive(sock.get()), "STATUS=2/2 processes");
  EXPECT_EQ(receive(sock.get()), "STOPPING=1");
  EXPECT_EQ(n.watchdog_interval_ms(), 0u);
}

TEST(NotifierTest, SendsToAPathAndPingsTheWatchdogAtHalfItsPeriod) {
  char dir[] = "/tmp/corral-notify-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/notify";
  UniqueFd sock = bound_datagram(path);
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  setenv("WATCHDOG_USEC", "3000000", 1);
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  Notifier n = Notifier::take_from_environment();
  EXPECT_EQ(getenv("WATCHDOG_USEC"), nullptr);
  EXPECT_EQ(n.watchdog_interval_ms(), 1500u);
  uint64_t now = 1'000'000;
  EventLoop loop([&] { return now; });
  {
    Watchdog dog(n, loop);
    EXPECT_EQ(receive(sock.get()), "WATCHDOG=1");  // at once
    now += 1'499;
    loop.run_once(0);
    EXPECT_EQ(receive(sock.get()), "<none>");
    now += 2;
    loop.run_once(0);
    EXPECT_EQ(receive(sock.get()), "WATCHDOG=1");
  }
  unlink(path.c_str());
  rmdir(dir);
}

TEST(NotifierTest, AWatchdogForAnotherPidIsNotOurs) {
  setenv("NOTIFY_SOCKET", "@corral-notify-nobody", 1);
  setenv("WATCHDOG_USEC", "1000000", 1);
  setenv("WATCHDOG_PID", "1", 1);
  Notifier n = Notifier::take_from_environment();
  EXPECT_TRUE(n.enabled());
  EXPECT_EQ(n.watchdog_interval_ms(), 0u);
  unsetenv("NOTIFY_SOCKET");
  EXPECT_FALSE(Notifier::take_from_environment().enabled());
}

TEST(PassedSocketsTest, TakesFdsFromThreeWithTheirNamesWhenTheyAreOurs) {
  // Put two sockets at 3 and 4 (what was there is kept aside and put back).
  int saved3 = fcntl(3, F_DUPFD_CLOEXEC, 100), saved4 = fcntl(4, F_DUPFD_CLOEXEC, 100);
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  for (int i = 0; i < 2; ++i) {  // above 4 first: socketpair may have returned 3 or 4 itself
    int high = fcntl(pair[i], F_DUPFD, 100);
    close(pair[i]);
    ASSERT_EQ(dup2(high, 3 + i), 3 + i);
    close(high);
  }

  setenv("LISTEN_FDS", "2", 1);
  setenv("LISTEN_PID", "1", 1);  // for another process: left alone
  auto none = take_passed_sockets();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none.value().empty());
  EXPECT_EQ(getenv("LISTEN_FDS"), nullptr);
  EXPECT_NE(fcntl(3, F_GETFD), -1);

  setenv("LISTEN_FDS", "2", 1);
  setenv("LISTEN_PID", std::to_string(getpid()).c_str(), 1);
  setenv("LISTEN_FDNAMES", "http:https", 1);
  auto got = take_passed_sockets();
  ASSERT_TRUE(got.ok()) << got.error().reason;
  ASSERT_EQ(got.value().size(), 2u);
  EXPECT_EQ(got.value()[0].fd.get(), 3);
  EXPECT_EQ(got.value()[0].name, "http");
  EXPECT_EQ(got.value()[1].name, "https");
  EXPECT_TRUE(fcntl(3, F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(fcntl(4, F_GETFL) & O_NONBLOCK);
  EXPECT_EQ(getenv("LISTEN_FDNAMES"), nullptr);
  got.value().clear();  // closes 3 and 4

  setenv("LISTEN_FDS", "x", 1);
  setenv("LISTEN_PID", std::to_string(getpid()).c_str(), 1);
  EXPECT_FALSE(take_passed_sockets().ok());

  if (saved3 >= 0) dup2(saved3, 3), close(saved3);
  if (saved4 >= 0) dup2(saved4, 4), close(saved4);
}

}  // namespace
}  // namespace corral::core
