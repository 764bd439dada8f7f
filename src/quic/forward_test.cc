#include "quic/forward.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace corral::quic {
namespace {

core::SocketAddress addr(const char* text) {
  auto a = core::parse_address(text);
  EXPECT_TRUE(a.ok()) << text;
  return a.value();
}

void round_trip(const char* local, const char* remote, uint8_t ecn) {
  ForwardHeader h;
  h.local = addr(local);
  h.remote = addr(remote);
  h.ecn = ecn;
  std::vector<uint8_t> payload(1200);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> buf(2000);
  size_t n = encode_forwarded(h, payload.data(), payload.size(), buf.data(), buf.size());
  ASSERT_GT(n, payload.size());
  ForwardHeader out;
  const uint8_t* data = nullptr;
  size_t len = 0;
  ASSERT_TRUE(decode_forwarded(buf.data(), n, out, &data, &len));
  EXPECT_EQ(out.local.to_string(), h.local.to_string());
  EXPECT_EQ(out.remote.to_string(), h.remote.to_string());
  EXPECT_EQ(out.local.len, h.local.len);
  EXPECT_EQ(out.ecn, ecn);
  ASSERT_EQ(len, payload.size());
  EXPECT_EQ(std::memcmp(data, payload.data(), len), 0);
}

TEST(Forward, RoundTripV4) {
  round_trip("127.0.0.1:8443", "10.1.2.3:50000", 2);
}
TEST(Forward, RoundTripV6) {
  round_trip("[::1]:8443", "[2001:db8::7]:40000", 3);
}

TEST(Forward, DoesNotFit) {
  ForwardHeader h;
  h.local = addr("127.0.0.1:1");
  h.remote = addr("127.0.0.1:2");
  uint8_t data[100] = {};
  uint8_t buf[110];
  EXPECT_EQ(encode_forwarded(h, data, sizeof data, buf, sizeof buf), 0u);
}

TEST(Forward, TruncatedAndGarbageRejected) {
  ForwardHeader h;
  h.local = addr("[::1]:443");
  h.remote = addr("127.0.0.1:9");
  uint8_t data[16] = {0xc0, 1, 2, 3};
  uint8_t buf[256];
  size_t n = encode_forwarded(h, data, sizeof data, buf, sizeof buf);
  ASSERT_GT(n, sizeof data);
  ForwardHeader out;
  const uint8_t* p;
  size_t len;
  // Every cut inside the header is rejected; cuts in the payload just shorten it.
  size_t header = n - sizeof data;
  for (size_t cut = 0; cut < header; ++cut)
    EXPECT_FALSE(decode_forwarded(buf, cut, out, &p, &len)) << "cut at " << cut;
  EXPECT_TRUE(decode_forwarded(buf, header, out, &p, &len));
  EXPECT_EQ(len, 0u);
  // Wrong magic.
  std::vector<uint8_t> bad(buf, buf + n);
  bad[0] = 'X';
  EXPECT_FALSE(decode_forwarded(bad.data(), n, out, &p, &len));
  // A raw QUIC packet is not a forwarded one.
  EXPECT_FALSE(decode_forwarded(data, sizeof data, out, &p, &len));
  // An address length that does not match its family.
  bad.assign(buf, buf + n);
  bad[5] = static_cast<uint8_t>(sizeof(sockaddr_in));  // local is v6
  EXPECT_FALSE(decode_forwarded(bad.data(), n, out, &p, &len));
  // An unknown family.
  bad.assign(buf, buf + n);
  sa_family_t unix_family = AF_UNIX;
  std::memcpy(&bad[6], &unix_family, sizeof unix_family);
  EXPECT_FALSE(decode_forwarded(bad.data(), n, out, &p, &len));
  // ECN is two bits.
  bad.assign(buf, buf + n);
  bad[4] = 4;
  EXPECT_FALSE(decode_forwarded(bad.data(), n, out, &p, &len));
}

TEST(Forward, OverSocketpair) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);
  ForwardHeader h;
  h.local = addr("127.0.0.1:443");
  h.remote = addr("127.0.0.1:5555");
  h.ecn = 1;
  uint8_t data[1350];
  std::memset(data, 0x5a, sizeof data);
  ASSERT_TRUE(forward_datagram(sv[1], h, data, sizeof data));
  uint8_t buf[2048];
  ssize_t r = recv(sv[0], buf, sizeof buf, 0);
  ASSERT_GT(r, 0);
  ForwardHeader out;
  const uint8_t* p;
  size_t len;
  ASSERT_TRUE(decode_forwarded(buf, static_cast<size_t>(r), out, &p, &len));
  EXPECT_EQ(len, sizeof data);
  EXPECT_EQ(out.remote.to_string(), "127.0.0.1:5555");
  EXPECT_EQ(out.ecn, 1);
  close(sv[0]);
  close(sv[1]);
}

TEST(Forward, FullQueueDropsInsteadOfBlocking) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);  // blocking sockets on purpose
  int small = 4096;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ForwardHeader h;
  h.local = addr("127.0.0.1:443");
  h.remote = addr("127.0.0.1:5555");
  uint8_t data[1200] = {};
  int sent = 0;
  bool dropped = false;
  // Nobody reads: the queue fills (buffer or net.unix.max_dgram_qlen) and a send must fail at
  // once rather than block this test forever.
  for (int i = 0; i < 100000 && !dropped; ++i) {
    if (forward_datagram(sv[1], h, data, sizeof data))
      ++sent;
    else
      dropped = true;
  }
  EXPECT_TRUE(dropped);
  EXPECT_GT(sent, 0);
  close(sv[0]);
  close(sv[1]);
}

TEST(Forward, ClosedPeerFailsWithoutSignal) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);
  close(sv[0]);
  ForwardHeader h;
  h.local = addr("127.0.0.1:443");
  h.remote = addr("127.0.0.1:5555");
  uint8_t data[10] = {};
  EXPECT_FALSE(forward_datagram(sv[1], h, data, sizeof data));  // EPIPE/ECONNREFUSED, no SIGPIPE
  close(sv[1]);
}

}  // namespace
}  // namespace corral::quic
