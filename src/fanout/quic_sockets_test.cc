#include "fanout/quic_sockets.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/event_loop.h"
#include "core/log.h"
#include "fanout/supervisor.h"

namespace corral::fanout {
namespace {

core::SocketAddress addr(const char* text) {
  return core::parse_address(text).value();
}

int int_opt(int fd, int level, int name) {
  int v = -1;
  socklen_t len = sizeof v;
  getsockopt(fd, level, name, &v, &len);
  return v;
}

TEST(QuicSockets, GroupsPerAddressInSlotOrder) {
  auto r = make_quic_sockets({addr("127.0.0.1:0"), addr("[::1]:0")}, 3);
  ASSERT_TRUE(r.ok()) << r.error().reason;
  QuicSockets& q = r.value();
  ASSERT_EQ(q.slots(), 3);
  ASSERT_EQ(q.addresses.size(), 2u);
  EXPECT_NE(q.addresses[0].port(), 0);
  EXPECT_NE(q.addresses[1].port(), 0);
  for (size_t a = 0; a < 2; ++a) {
    auto group = q.group(a);
    ASSERT_EQ(group.size(), 3u);
    for (int fd : group) {
      auto bound = core::local_address(fd);
      ASSERT_TRUE(bound.ok());
      EXPECT_EQ(bound->to_string(), q.addresses[a].to_string());  // one port per group
      EXPECT_EQ(int_opt(fd, SOL_SOCKET, SO_REUSEPORT), 1);
      EXPECT_EQ(int_opt(fd, SOL_SOCKET, SO_TYPE), SOCK_DGRAM);
      EXPECT_TRUE(fcntl(fd, F_GETFL) & O_NONBLOCK);
      EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
      if (a == 0) {
        EXPECT_EQ(int_opt(fd, IPPROTO_IP, IP_PKTINFO), 1);
        EXPECT_EQ(int_opt(fd, IPPROTO_IP, IP_RECVTOS), 1);
        EXPECT_EQ(int_opt(fd, IPPROTO_IP, IP_MTU_DISCOVER), IP_PMTUDISC_PROBE);
      } else {
        EXPECT_EQ(int_opt(fd, IPPROTO_IPV6, IPV6_V6ONLY), 1);
        EXPECT_EQ(int_opt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO), 1);
        EXPECT_EQ(int_opt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS), 1);
      }
      // Asked for 4 MiB; the kernel reports double what it granted. Without privileges it is
      // capped by net.core.rmem_max, so only check it is not below the default.
      EXPECT_GE(int_opt(fd, SOL_SOCKET, SO_RCVBUF), 200'000);
    }
  }
}

// kGenerations pairs per slot, one per generation index: tx[i][p] reaches rx[i][p] and nothing
// else.
TEST(QuicSockets, ForwardPairsConnectTxToRxOfTheSameSlotAndGeneration) {
  auto r = make_quic_sockets({addr("127.0.0.1:0")}, 4);
  ASSERT_TRUE(r.ok()) << r.error().reason;
  QuicSockets& q = r.value();
  for (size_t i = 0; i < 4; ++i) {
    for (size_t p = 0; p < kGenerations; ++p) {
      std::string msg = "to " + std::to_string(i) + "/" + std::to_string(p);
      ASSERT_EQ(send(q.forward_tx[i][p].get(), msg.data(), msg.size(), 0),
                static_cast<ssize_t>(msg.size()));
    }
  }
  for (size_t i = 0; i < 4; ++i) {
    for (size_t p = 0; p < kGenerations; ++p) {
      char buf[16] = {};
      ssize_t n = recv(q.forward_rx[i][p].get(), buf, sizeof buf - 1, 0);
      ASSERT_GT(n, 0);
      EXPECT_EQ(std::string(buf), "to " + std::to_string(i) + "/" + std::to_string(p));
      EXPECT_EQ(recv(q.forward_rx[i][p].get(), buf, sizeof buf, 0), -1);  // one each
    }
  }
}

TEST(QuicSockets, BindConflictIsAnError) {
  auto first = make_quic_sockets({addr("127.0.0.1:0")}, 1);
  ASSERT_TRUE(first.ok());
  // A socket without SO_REUSEPORT holds the port: our group cannot join it.
  core::UniqueFd plain(socket(AF_INET, SOCK_DGRAM, 0));
  auto taken = addr("127.0.0.1:0");
  ASSERT_EQ(bind(plain.get(), reinterpret_cast<sockaddr*>(&taken.storage), taken.len), 0);
  auto bound = core::local_address(plain.get());
  auto r = make_quic_sockets({bound.value()}, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find("bind udp"), std::string::npos) << r.error().reason;
}

ino_t inode(int fd) {
  struct stat st {};
  fstat(fd, &st);
  return st.st_ino;
}

// A respawned process gets the same UDP socket and forwarding pair as the one it replaces, and
// what was queued on the pair while the slot had no process is still there.
TEST(QuicSockets, RespawnedProcessGetsTheSameSockets) {
  constexpr int kSlots = 3;
  auto made = make_quic_sockets({addr("127.0.0.1:0")}, kSlots);
  ASSERT_TRUE(made.ok()) << made.error().reason;
  auto quic = std::make_shared<QuicSockets>(std::move(made.value()));
  std::map<int, ino_t> udp_inode, rx_inode;
  for (int i = 0; i < kSlots; ++i) {
    udp_inode[i] = inode(quic->udp[static_cast<size_t>(i)][0].get());
    rx_inode[i] = inode(quic->forward_rx[static_cast<size_t>(i)][1].get());  // generation 1
  }
  char dir_template[] = "/tmp/corral-fanout-quic-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string dir = dir_template;

  core::EventLoop loop;
  core::Logger log(2, core::LogLevel::kWarn);
  SupervisorOptions options;
  options.processes = kSlots;
  options.backoff_min_ms = 10;
  options.quic = quic;
  ForkLauncher launcher(log);
  Supervisor sup(loop, log, launcher, options);
  sup.on_finished = [&] { loop.stop(); };
  auto listeners = std::make_shared<ListenerSet>();
  listeners->slots.resize(kSlots);
  ChildMain main = [&](const ChildContext& ctx) {
    std::string path = dir + "/slot" + std::to_string(ctx.slot);
    bool first = access(path.c_str(), F_OK) != 0;
    std::string queued = "none";
    char buf[64] = {};
    ssize_t n = recv(ctx.forward_rx, buf, sizeof buf - 1, MSG_DONTWAIT);
    if (n > 0) queued = buf;
    bool same = ctx.udp_fds.size() == 1 && inode(ctx.udp_fds[0]) == udp_inode[ctx.slot] &&
                inode(ctx.forward_rx) == rx_inode[ctx.slot] &&
                ctx.forward_tx.size() == static_cast<size_t>(kSlots);
    FILE* f = fopen(path.c_str(), "a");
    fprintf(f, "%s %s\n", same ? "same" : "different", queued.c_str());
    fclose(f);
    if (!first) return 0;
    // Leave a datagram for the replacement, then crash.
    std::string note = "from-first-" + std::to_string(ctx.slot);
    send(ctx.forward_tx[static_cast<size_t>(ctx.slot)][generation_index(ctx.generation)],
         note.data(), note.size(), 0);
    raise(SIGKILL);
    return 1;
  };
  ASSERT_TRUE(sup.start(listeners, main).ok());
  loop.run();
  for (int i = 0; i < kSlots; ++i) {
    std::ifstream in(dir + "/slot" + std::to_string(i));
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(ss.str(), "same none\nsame from-first-" + std::to_string(i) + "\n") << "slot " << i;
    unlink((dir + "/slot" + std::to_string(i)).c_str());
  }
  rmdir(dir.c_str());
  for (const auto& st : sup.state()) EXPECT_EQ(st.restarts, 1u) << "slot " << st.index;
}

size_t count_lines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// A SIGHUP generation (Supervisor::reload) gets the same QUIC sockets as the one it replaces, but
// reads the slot's forwarding pair of its own generation index, so the old and the new process
// never read each other's forwarded datagrams; both can write to any.
TEST(QuicSockets, ReloadedGenerationGetsTheSameSockets) {
  constexpr int kSlots = 2;
  auto made = make_quic_sockets({addr("127.0.0.1:0")}, kSlots);
  ASSERT_TRUE(made.ok()) << made.error().reason;
  auto quic = std::make_shared<QuicSockets>(std::move(made.value()));
  std::map<int, ino_t> udp_inode;
  std::map<std::pair<int, int>, ino_t> rx_inode;  // (slot, generation index)
  for (int i = 0; i < kSlots; ++i) {
    udp_inode[i] = inode(quic->udp[static_cast<size_t>(i)][0].get());
    for (int p = 0; p < static_cast<int>(kGenerations); ++p)
      rx_inode[{i, p}] =
          inode(quic->forward_rx[static_cast<size_t>(i)][static_cast<size_t>(p)].get());
  }
  char dir_template[] = "/tmp/corral-fanout-reload-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string dir = dir_template;
  auto path = [&](int slot) { return dir + "/slot" + std::to_string(slot); };

  core::EventLoop loop;
  core::Logger log(2, core::LogLevel::kError);
  SupervisorOptions options;
  options.processes = kSlots;
  options.quic = quic;
  ForkLauncher launcher(log);
  Supervisor sup(loop, log, launcher, options);
  sup.on_finished = [&] { loop.stop(); };
  auto listeners = std::make_shared<ListenerSet>();
  listeners->slots.resize(kSlots);
  // Each process writes "<generation> same|different" and serves until SIGTERM.
  ChildMain main = [&](const ChildContext& ctx) {
    int index = static_cast<int>(generation_index(ctx.generation));
    bool same = ctx.udp_fds.size() == 1 && inode(ctx.udp_fds[0]) == udp_inode[ctx.slot] &&
                inode(ctx.forward_rx) == rx_inode[{ctx.slot, index}] &&
                ctx.forward_tx.size() == static_cast<size_t>(kSlots) && ctx.quic_serving;
    for (const auto& pair : ctx.forward_tx)
      for (int fd : pair) same = same && fd >= 0;
    FILE* f = fopen(path(ctx.slot).c_str(), "a");
    fprintf(f, "%llu %s\n", static_cast<unsigned long long>(ctx.generation),
            same ? "same" : "different");
    fclose(f);
    ctx.notify_ready();
    for (;;) pause();
    return 0;
  };
  // Reload once every first-generation process has written its line; stop after the second.
  bool reloaded = false;
  int checks = 0;
  core::Timer check;
  check.bind(loop.timers(), [&] {
    auto lines = [&](size_t want) {
      for (int i = 0; i < kSlots; ++i)
        if (count_lines(path(i)) < want) return false;
      return true;
    };
    if (!reloaded && lines(1)) {
      reloaded = true;
      sup.reload(listeners, main);
    } else if ((reloaded && lines(2)) || ++checks > 1000) {  // the bound only ends a broken run
      sup.terminate();
      return;
    }
    check.arm_after(10);
  });
  check.arm_after(10);
  ASSERT_TRUE(sup.start(listeners, main).ok());
  loop.run();
  for (int i = 0; i < kSlots; ++i) {
    std::ifstream in(path(i));
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(ss.str(), "1 same\n2 same\n") << "slot " << i;
    unlink(path(i).c_str());
  }
  rmdir(dir.c_str());
}

// Reloads with processes that keep draining (they ignore the drain signal's end: an open
// WebSocket, say): up to max_draining older generations per slot run next to the serving one;
// past it the oldest is closed, and no two live processes of a slot ever share a generation index
// (their CIDs and forwarding pair): generation 5 is forked only once generation 1 has exited.
// The serving table follows the newest ready process.
TEST(Generations, DrainingIsBoundedAndNoTwoLiveProcessesShareAnIndex) {
  constexpr int kLast = 7;
  auto made = make_quic_sockets({addr("127.0.0.1:0")}, 1);
  ASSERT_TRUE(made.ok()) << made.error().reason;
  auto quic = std::make_shared<QuicSockets>(std::move(made.value()));
  char dir_template[] = "/tmp/corral-fanout-drain-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string dir = dir_template;
  auto path = [&](uint64_t g) { return dir + "/gen" + std::to_string(g); };
  auto note = [&](uint64_t g, const char* what) {
    FILE* f = fopen(path(g).c_str(), "a");
    fprintf(f, "%s\n", what);
    fclose(f);
  };
  auto lines = [&](uint64_t g) {
    std::ifstream in(path(g));
    std::string all, line;
    while (std::getline(in, line)) all += line + " ";
    return all;
  };

  core::EventLoop loop;
  core::Logger log(2, core::LogLevel::kError);
  SupervisorOptions options;
  options.processes = 1;
  options.quic = quic;
  options.stop_timeout_ms = 5'000;
  ForkLauncher launcher(log);
  Supervisor sup(loop, log, launcher, options);
  sup.on_finished = [&] { loop.stop(); };
  auto listeners = std::make_shared<ListenerSet>();
  listeners->slots.resize(1);
  // A process notes "start", "drain" (kept running) and "exit" (at SIGTERM).
  ChildMain main = [&](const ChildContext& ctx) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, kDrainSignal);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    note(ctx.generation, "start");
    ctx.notify_ready();
    for (;;) {
      int signo = 0;
      sigwait(&set, &signo);
      if (signo == kDrainSignal) {
        note(ctx.generation, "drain");
      } else {
        note(ctx.generation, "exit");
        return 0;
      }
    }
  };
  auto live = [&] {
    std::vector<uint64_t> out;
    for (uint64_t g = 1; g <= kLast; ++g) {
      auto l = lines(g);
      if (l.find("start") != std::string::npos && l.find("exit") == std::string::npos)
        out.push_back(g);
    }
    return out;
  };
  uint64_t reloaded_to = 1;
  bool shared_index = false;
  std::vector<std::vector<uint64_t>> draining_seen;  // after each reload's new process is ready
  int ticks = 0;
  core::Timer tick;
  tick.bind(loop.timers(), [&] {
    auto now = live();
    for (size_t i = 0; i < now.size(); ++i)
      for (size_t j = i + 1; j < now.size(); ++j)
        shared_index = shared_index || generation_index(now[i]) == generation_index(now[j]);
    // The next reload once the newest generation serves and its predecessor was told to drain.
    auto st = sup.state();
    bool serving = st[0].generation == reloaded_to && st[0].status == "running" &&
                   (reloaded_to == 1 || lines(reloaded_to - 1).find("drain") != std::string::npos ||
                    lines(reloaded_to - 1).find("exit") != std::string::npos);
    if (serving) {
      EXPECT_EQ(quic->serving->words()[0].load(), reloaded_to);
      std::vector<uint64_t> draining;
      for (const auto& d : sup.draining())
        if (d.status == "draining") draining.push_back(d.generation);
      draining_seen.push_back(draining);
      if (reloaded_to == kLast) {
        sup.terminate();
        return;
      }
      ++reloaded_to;
      sup.reload(listeners, main);
    }
    if (++ticks > 2000) {  // the bound only ends a broken run
      sup.terminate();
      return;
    }
    tick.arm_after(5);
  });
  tick.arm_after(5);
  ASSERT_TRUE(sup.start(listeners, main).ok());
  loop.run();
  EXPECT_FALSE(shared_index);
  // The 3 newest older generations keep draining; from generation 5 on the oldest was closed
  // (generation_index_reused at the fork of g + 4) before it could be a fourth.
  std::vector<std::vector<uint64_t>> want = {{},        {1},       {1, 2},   {1, 2, 3},
                                             {2, 3, 4}, {3, 4, 5}, {4, 5, 6}};
  EXPECT_EQ(draining_seen, want);
  for (uint64_t g = 1; g <= kLast; ++g) {
    EXPECT_EQ(lines(g), g == kLast ? "start exit " : "start drain exit ") << "generation " << g;
    unlink(path(g).c_str());
  }
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace corral::fanout
