// TlsTransport against a GnuTLS client over a non-blocking socketpair, both driven in one thread.
#include "tls/transport.h"

#include <gnutls/gnutls.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "tls/credentials.h"

namespace corral::tls {
namespace {

std::string pattern(size_t n, char base) {
  std::string s(n, base);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(base + i % 23);
  return s;
}

// timeout_ms 0: whether epoll would report the fd readable now.
bool readable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1;
}

class TlsTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral-tls-transport-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto paths = ensure_dev_cert(dir_);
    ASSERT_TRUE(paths) << paths.error().reason;
    auto creds = Credentials::load(paths->cert, paths->key);
    ASSERT_TRUE(creds);
    auto ticket = TicketKey::generate();
    ASSERT_TRUE(ticket);
    auto cfg = ServerConfig::create(creds.value(), ticket.value());
    ASSERT_TRUE(cfg) << cfg.error().reason;
    factory_ = std::make_unique<TlsTransportFactory>(cfg.value());
    ASSERT_EQ(gnutls_certificate_allocate_credentials(&client_cred_), 0);
    ASSERT_GT(gnutls_certificate_set_x509_trust_file(client_cred_, paths->cert.c_str(),
                                                     GNUTLS_X509_FMT_PEM),
              0);

    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    client_fd_ = fds[1];
    auto t = factory_->wrap(core::UniqueFd(fds[0]));
    ASSERT_TRUE(t) << t.error().reason;
    server_ = std::move(t.value());
    ASSERT_EQ(gnutls_init(&client_, GNUTLS_CLIENT | GNUTLS_NONBLOCK), 0);
    ASSERT_EQ(gnutls_priority_set_direct(client_, "NORMAL", nullptr), 0);
    gnutls_credentials_set(client_, GNUTLS_CRD_CERTIFICATE, client_cred_);
    gnutls_server_name_set(client_, GNUTLS_NAME_DNS, "localhost", 9);
    gnutls_session_set_verify_cert(client_, "localhost", 0);
    gnutls_transport_set_int(client_, client_fd_);
    ASSERT_TRUE(handshake());
  }

  void TearDown() override {
    if (client_) gnutls_deinit(client_);
    server_.reset();
    if (client_fd_ >= 0) ::close(client_fd_);
    gnutls_certificate_free_credentials(client_cred_);
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)std::system(cmd.c_str());
  }

  bool handshake() {
    bool client_done = false, server_done = false;
    for (int round = 0; round < 200 && !(client_done && server_done); ++round) {
      if (!client_done) {
        int rc = gnutls_handshake(client_);
        if (rc == 0) client_done = true;
        if (rc < 0 && rc != GNUTLS_E_AGAIN) return false;
      }
      if (!server_done) {
        auto step = server_->handshake();
        if (step == core::Transport::Step::kDone) server_done = true;
        if (step == core::Transport::Step::kFailed) return false;
      }
    }
    return client_done && server_done;
  }

  void client_send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = gnutls_record_send(client_, s.data() + off, s.size() - off);
      ASSERT_GT(n, 0) << gnutls_strerror(static_cast<int>(n));
      off += static_cast<size_t>(n);
    }
  }

  // What the client receives until nothing more comes for a moment.
  std::string client_read_available() {
    std::string got;
    char buf[16384];
    for (;;) {
      ssize_t n = gnutls_record_recv(client_, buf, sizeof buf);
      if (n > 0) {
        got.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == GNUTLS_E_AGAIN && gnutls_record_check_pending(client_) == 0) {
        pollfd p{client_fd_, POLLIN, 0};
        if (::poll(&p, 1, 0) != 1) break;
        continue;
      }
      break;
    }
    return got;
  }

  std::string dir_;
  std::unique_ptr<TlsTransportFactory> factory_;
  gnutls_certificate_credentials_t client_cred_ = nullptr;
  gnutls_session_t client_ = nullptr;
  int client_fd_ = -1;
  std::unique_ptr<core::Transport> server_;
};

TEST_F(TlsTransportTest, SecureAndNoSendfile) {
  EXPECT_TRUE(server_->secure());
  EXPECT_FALSE(server_->can_send_file());
  auto r = server_->send_file(0, 0, 1);
  EXPECT_EQ(r.status, core::IoResult::Status::kError);
  EXPECT_EQ(static_cast<TlsTransport&>(*server_).session().alpn(), "");  // the client asked none
}

// The case the copied loops existed for: several records arrive in one segment; the first read
// takes them all from the socket (one recv into the read-ahead) and returns part of the first.
// The rest is in pending(), where epoll cannot see it; read_into() must take it all.
TEST_F(TlsTransportTest, PendingRecordsAreDrainedByReadInto) {
  std::string a = pattern(300, 'a'), b = pattern(500, 'b'), c = pattern(9000, 'c');
  client_send(a);
  client_send(b);
  client_send(c);
  ASSERT_TRUE(readable(server_->fd(), 2000));

  char small[100];
  auto r = server_->read(small, sizeof small);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::string(small, r.bytes), a.substr(0, r.bytes));
  std::string got(small, r.bytes);
  // Everything else is inside the transport (the rest of `a` decrypted, `b` and `c` still
  // sealed in the read-ahead), none of it in the socket.
  EXPECT_GE(server_->pending(), a.size() - r.bytes + b.size() + c.size());
  EXPECT_FALSE(readable(server_->fd()));

  core::Buffer in;
  r = server_->read_into(in, 1024);  // n smaller than the records: still takes all of them
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.bytes, in.size());
  got.append(in.view());
  EXPECT_EQ(got, a + b + c);
  EXPECT_EQ(server_->pending(), 0u);
  EXPECT_TRUE(server_->read_into(in, 1024).again());
}

TEST_F(TlsTransportTest, WritevPartialWritesRetryWithTheSameFront) {
  int small = 8192;
  ASSERT_EQ(setsockopt(server_->fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n";
  std::string body = pattern(200000, 'A');
  std::string want = head + body;
  size_t off = 0;
  std::string got;
  int blocked = 0;
  for (int round = 0; round < 100000 && got.size() < want.size(); ++round) {
    if (off < want.size()) {
      iovec iov[2];
      int count = 0;
      if (off < head.size()) iov[count++] = {head.data() + off, head.size() - off};
      size_t boff = off > head.size() ? off - head.size() : 0;
      iov[count++] = {body.data() + boff, body.size() - boff};
      auto r = server_->writev(iov, count);
      if (r.ok()) {
        off += r.bytes;
      } else {
        ASSERT_TRUE(r.again()) << r.error;
        ++blocked;
      }
    }
    got += client_read_available();
  }
  EXPECT_GT(blocked, 0);  // the socket buffer is far smaller than the body
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
}

TEST_F(TlsTransportTest, ShutdownSendsCloseNotifyAndKeepsReading) {
  ASSERT_TRUE(server_->write("last", 4).ok());
  server_->shutdown();
  EXPECT_EQ(client_read_available(), "last");
  char buf[16];
  EXPECT_EQ(gnutls_record_recv(client_, buf, sizeof buf), 0);  // close_notify, not a bare FIN
  EXPECT_EQ(::recv(client_fd_, buf, sizeof buf, 0), 0);        // then the FIN

  client_send("after");
  core::Buffer in;
  ASSERT_TRUE(readable(server_->fd(), 2000));
  auto r = server_->read_into(in, 64);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(in.view(), "after");

  // The client's own close_notify: the end of the stream.
  ASSERT_EQ(gnutls_bye(client_, GNUTLS_SHUT_WR), 0);
  ASSERT_TRUE(readable(server_->fd(), 2000));
  EXPECT_EQ(server_->read_into(in, 64).status, core::IoResult::Status::kEof);
}

}  // namespace
}  // namespace corral::tls
