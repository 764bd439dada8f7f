#include "core/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace corral::core {
namespace {

// A non-blocking socketpair: [0] goes to the transport, [1] is the peer the test drives.
struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    transport = std::make_unique<PlainTransport>(UniqueFd(fds[0]));
    peer.reset(fds[1]);
  }
  std::unique_ptr<PlainTransport> transport;
  UniqueFd peer;
};

std::string drain(int fd) {
  std::string got;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST(PlainTransport, HandshakeIsDoneAtOnceAndNotSecure) {
  Pair p;
  EXPECT_EQ(p.transport->handshake(), Transport::Step::kDone);
  EXPECT_FALSE(p.transport->secure());
  EXPECT_TRUE(p.transport->can_send_file());
  EXPECT_EQ(p.transport->pending(), 0u);
}

TEST(PlainTransport, ReadsWhatArrivedThenWouldBlockThenEof) {
  Pair p;
  Buffer in;
  auto r = p.transport->read_into(in, 4096);
  EXPECT_TRUE(r.again());
  ASSERT_EQ(::write(p.peer.get(), "hello", 5), 5);
  r = p.transport->read_into(in, 4096);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.bytes, 5u);
  EXPECT_EQ(in.view(), "hello");
  // At most n per read: the rest stays in the socket for the next one.
  ASSERT_EQ(::write(p.peer.get(), "0123456789", 10), 10);
  char buf[4];
  r = p.transport->read(buf, sizeof buf);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::string(buf, r.bytes), "0123");
  r = p.transport->read_into(in, 4096);
  EXPECT_EQ(r.bytes, 6u);
  EXPECT_EQ(in.view(), "hello456789");
  p.peer.reset();
  r = p.transport->read_into(in, 4096);
  EXPECT_EQ(r.status, IoResult::Status::kEof);
}

TEST(PlainTransport, WritevStopsInsideABufferWhenTheSocketIsFull) {
  Pair p;
  int small = 4096;
  ASSERT_EQ(setsockopt(p.transport->fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  std::string head = "HTTP/1.1 200 OK\r\n\r\n";
  std::string body(1 << 20, 'b');
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>('a' + i % 26);
  std::string want = head + body;

  // Write both from where the last partial write stopped, as a connection's flush does.
  size_t off = 0;
  std::string got;
  int partial = 0;
  for (int round = 0; round < 100000 && got.size() < want.size(); ++round) {
    if (off < want.size()) {
      iovec iov[2];
      int count = 0;
      if (off < head.size()) iov[count++] = {head.data() + off, head.size() - off};
      size_t boff = off > head.size() ? off - head.size() : 0;
      iov[count++] = {body.data() + boff, body.size() - boff};
      auto r = p.transport->writev(iov, count);
      if (r.ok()) {
        if (r.bytes < want.size() - off) ++partial;
        off += r.bytes;
      } else {
        ASSERT_TRUE(r.again()) << r.error;
      }
    }
    got += drain(p.peer.get());
  }
  EXPECT_GT(partial, 0);  // the socket buffer is far smaller than 1 MiB
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
}

TEST(PlainTransport, WriteToAClosedPeerIsAnErrorNotASignal) {
  Pair p;
  p.peer.reset();
  auto r = p.transport->write("x", 1);
  EXPECT_EQ(r.status, IoResult::Status::kError);
  EXPECT_EQ(r.error, EPIPE);
  iovec iov{const_cast<char*>("y"), 1};
  r = p.transport->writev(&iov, 1);
  EXPECT_EQ(r.error, EPIPE);
}

TEST(PlainTransport, ShutdownSendsFinAndKeepsReading) {
  Pair p;
  ASSERT_TRUE(p.transport->write("bye", 3).ok());
  p.transport->shutdown();
  char buf[16];
  ASSERT_EQ(::read(p.peer.get(), buf, sizeof buf), 3);
  EXPECT_EQ(::read(p.peer.get(), buf, sizeof buf), 0);  // our FIN
  // Our side still reads what the peer sends after it.
  ASSERT_EQ(::write(p.peer.get(), "late", 4), 4);
  Buffer in;
  auto r = p.transport->read_into(in, 64);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(in.view(), "late");
}

TEST(PlainTransport, SendFileSendsARangeAndReportsTheEnd) {
  Pair p;
  char path[] = "/tmp/corral-transport-test-XXXXXX";
  int file = ::mkstemp(path);
  ASSERT_GE(file, 0);
  UniqueFd file_fd(file);
  ::unlink(path);
  ASSERT_EQ(::write(file, "0123456789", 10), 10);
  auto r = p.transport->send_file(file, 3, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.bytes, 4u);
  EXPECT_EQ(drain(p.peer.get()), "3456");
  r = p.transport->send_file(file, 10, 4);
  EXPECT_EQ(r.status, IoResult::Status::kEof);
}

}  // namespace
}  // namespace corral::core
