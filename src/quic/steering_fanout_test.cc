// Steering over the supervisor's real sockets: a fan-out of server processes (fanout::run_fanout
// in a forked supervisor, as `corral serve` runs it) whose processes answer every datagram with
// their slot, after forwarding it to its owner when the kernel gave it to the wrong one (the
// same packet_owner + forward_datagram path the HTTP/3 endpoint takes). Every datagram comes from
// a new client socket, i.e. a new 4-tuple, like a migrated or NAT-rebound connection.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>

#include "fanout/quic_sockets.h"
#include "fanout/supervisor.h"
#include "quic/forward.h"
#include "quic/steering_setup.h"

namespace corral::quic {
namespace {

constexpr int kSlots = 4;

// The server process: answers "slot=<i> pid=<pid> via=direct|forwarded".
int serve(const ProcessContext& ctx) {
  int udp = ctx.udp_fds.at(0);
  pollfd pfds[2] = {{udp, POLLIN, 0}, {ctx.forward_rx, POLLIN, 0}};
  uint8_t buf[2048];
  for (;;) {
    if (poll(pfds, 2, -1) < 0) continue;
    if (pfds[0].revents & POLLIN) {
      ForwardHeader h;
      h.remote.len = sizeof h.remote.storage;
      ssize_t n = recvfrom(udp, buf, sizeof buf, MSG_DONTWAIT,
                           reinterpret_cast<sockaddr*>(&h.remote.storage), &h.remote.len);
      if (n > 0) {
        size_t len = static_cast<size_t>(n);
        int owner = packet_owner(buf, len, ctx.key);
        bool mine = ctx.mode == SteeringMode::kOff || owner == kNoOwner || owner == ctx.slot;
        if (!mine) {
          auto local = core::local_address(udp);
          h.local = local.value();
          (void)forward_datagram(
              ctx.forward_tx.at(static_cast<size_t>(owner))[ctx.generation_index()], h, buf, len);
        } else {
          char reply[64];
          int r = snprintf(reply, sizeof reply, "slot=%d pid=%d via=direct", ctx.slot, getpid());
          sendto(udp, reply, static_cast<size_t>(r), 0,
                 reinterpret_cast<const sockaddr*>(&h.remote.storage), h.remote.len);
        }
      }
    }
    if (pfds[1].revents & POLLIN) {
      ssize_t n = recv(ctx.forward_rx, buf, sizeof buf, MSG_DONTWAIT);
      ForwardHeader h;
      const uint8_t* data;
      size_t len;
      if (n > 0 && decode_forwarded(buf, static_cast<size_t>(n), h, &data, &len)) {
        char reply[64];
        int r = snprintf(reply, sizeof reply, "slot=%d pid=%d via=forwarded", ctx.slot, getpid());
        sendto(udp, reply, static_cast<size_t>(r), 0,
               reinterpret_cast<const sockaddr*>(&h.remote.storage), h.remote.len);
      }
    }
  }
}

struct Reply {
  int slot = -1;
  int pid = 0;
  bool forwarded = false;
};

// Sends from a fresh socket; waits for the answer (the bound only ends a broken run).
Reply ask(const core::SocketAddress& server, const uint8_t* pkt, size_t len, int wait_ms = 3000) {
  Reply rep;
  core::UniqueFd c(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (sendto(c.get(), pkt, len, 0, reinterpret_cast<const sockaddr*>(&server.storage), server.len) <
      0)
    return rep;
  pollfd p{c.get(), POLLIN, 0};
  if (poll(&p, 1, wait_ms) <= 0) return rep;
  char buf[128] = {};
  if (recv(c.get(), buf, sizeof buf - 1, 0) <= 0) return rep;
  char via[16] = {};
  if (sscanf(buf, "slot=%d pid=%d via=%15s", &rep.slot, &rep.pid, via) == 3)
    rep.forwarded = std::strcmp(via, "forwarded") == 0;
  return rep;
}

class SteeringFanout : public ::testing::TestWithParam<SteeringRequest> {
 protected:
  void SetUp() override {
    if (GetParam() == SteeringRequest::kBpf && !has_bpf_capability())
      GTEST_SKIP() << "needs CAP_BPF (or root)";
    auto made = fanout::make_quic_sockets({core::parse_address("127.0.0.1:0").value()}, kSlots);
    ASSERT_TRUE(made.ok()) << made.error().reason;
    quic_ = std::make_shared<fanout::QuicSockets>(std::move(made.value()));
    core::Logger log(2, core::LogLevel::kError);
    auto s = setup_steering({quic_->group(0)}, kSlots, GetParam(), log);
    ASSERT_TRUE(s.ok()) << s.error().reason;
    steering_ = s.value();
    quic_->steering = steering_;
    server_ = quic_->addresses[0];
    supervisor_ = fork();
    ASSERT_GE(supervisor_, 0);
    if (supervisor_ == 0) {
      core::Logger sup_log(2, core::LogLevel::kError);
      fanout::SupervisorOptions options;
      options.processes = kSlots;
      options.backoff_min_ms = 10;
      options.quic = quic_;
      auto listeners = std::make_shared<fanout::ListenerSet>();
      listeners->slots.resize(kSlots);
      auto steering = steering_;
      fanout::ChildMain main = [steering](const fanout::ChildContext& c) {
        c.notify_ready();
        return serve(
            steering->context(c.slot, c.generation, c.udp_fds, c.forward_rx, c.forward_tx));
      };
      fanout::ForkLauncher launcher(sup_log);
      _exit(fanout::run_fanout(sup_log, launcher, options, listeners, main));
    }
    quic_.reset();  // the supervisor holds the sockets now
    // Serving (and so handling SIGTERM: run_fanout sets that up before it forks) once any
    // process answers.
    uint8_t pkt[48];
    short_packet(pkt, 0);
    Reply r;
    for (int attempt = 0; attempt < 20 && r.slot < 0; ++attempt) r = ask(server_, pkt, 48, 500);
    ASSERT_GE(r.slot, 0) << "the fan-out does not answer";
  }
  void TearDown() override {
    if (supervisor_ > 0) {
      kill(supervisor_, SIGTERM);
      int status = 0;
      waitpid(supervisor_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "supervisor status " << status;
    }
  }
  // A 1-RTT (short header) packet for a connection owned by `slot`.
  void short_packet(uint8_t* pkt, int slot) const {
    std::memset(pkt, 0x11, 48);
    pkt[0] = 0x41;
    make_cid(pkt + 1, static_cast<uint32_t>(slot), steering_->key.tag,
             static_cast<unsigned>(slot) & 1u);
  }

  std::shared_ptr<fanout::QuicSockets> quic_;
  std::shared_ptr<Steering> steering_;
  core::SocketAddress server_;
  pid_t supervisor_ = -1;
};

TEST_P(SteeringFanout, EveryPacketReachesItsOwner) {
  int hits = 0, forwarded = 0, total = 0;
  for (int i = 0; i < 80; ++i) {
    uint8_t pkt[48];
    int expect;
    if (i % 2 == 0) {
      short_packet(pkt, i / 2 % kSlots);
      expect = i / 2 % kSlots;
    } else {  // a client's first Initial: an 8-byte DCID of its choosing
      std::memset(pkt, 0, sizeof pkt);
      pkt[0] = 0xc3;
      pkt[4] = 1;
      pkt[5] = 8;
      for (int b = 0; b < 8; ++b) pkt[6 + b] = static_cast<uint8_t>(i * 37 + b * 101);
      expect = packet_owner(pkt, sizeof pkt, steering_->key);
    }
    Reply r = ask(server_, pkt, sizeof pkt);
    ASSERT_GE(r.slot, 0) << "packet " << i << ": no answer";
    ++total;
    hits += r.slot == expect;
    forwarded += r.forwarded;
    if (GetParam() != SteeringRequest::kOff) {
      EXPECT_EQ(r.slot, expect) << "packet " << i;
    }
  }
  std::cout << "[ report ] steering " << steering_request_name(GetParam()) << ": " << hits << "/"
            << total << " at their owner, " << forwarded << " by forwarding\n";
  if (GetParam() == SteeringRequest::kBpf) {
    EXPECT_EQ(forwarded, 0);  // the kernel steered all
  }
  // Forward mode: the kernel's hash put most packets elsewhere (each at its owner 1 time in 4).
  if (GetParam() == SteeringRequest::kForward) {
    EXPECT_GT(forwarded, 0);
  }
}

TEST_P(SteeringFanout, RespawnedProcessServesItsOwnSlot) {
  if (GetParam() == SteeringRequest::kOff) GTEST_SKIP() << "no owner to serve with steering off";
  uint8_t pkt[48];
  short_packet(pkt, 2);
  Reply before = ask(server_, pkt, sizeof pkt);
  ASSERT_EQ(before.slot, 2);
  ASSERT_GT(before.pid, 0);
  ASSERT_EQ(kill(before.pid, SIGKILL), 0);
  // Until the replacement runs, packets for slot 2 wait in its queue; then it answers them.
  Reply after;
  for (int attempt = 0; attempt < 20 && (after.slot != 2 || after.pid == before.pid); ++attempt) {
    short_packet(pkt, 2);
    after = ask(server_, pkt, sizeof pkt, 500);
  }
  EXPECT_EQ(after.slot, 2);
  EXPECT_NE(after.pid, before.pid);
  EXPECT_GT(after.pid, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, SteeringFanout,
                         ::testing::Values(SteeringRequest::kBpf, SteeringRequest::kForward,
                                           SteeringRequest::kOff),
                         [](const auto& info) { return steering_request_name(info.param); });

}  // namespace
}  // namespace corral::quic
