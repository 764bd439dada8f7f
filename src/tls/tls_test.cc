#include <fcntl.h>
#include <gnutls/x509.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <arpa/inet.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include "tls/credentials.h"
#include "tls/session.h"

namespace corral::tls {
namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/corral-tls-test-XXXXXX";
  char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Crt {
  gnutls_x509_crt_t crt = nullptr;
  explicit Crt(const std::string& pem) {
    gnutls_x509_crt_init(&crt);
    gnutls_datum_t d{reinterpret_cast<unsigned char*>(const_cast<char*>(pem.data())),
                     static_cast<unsigned>(pem.size())};
    EXPECT_EQ(gnutls_x509_crt_import(crt, &d, GNUTLS_X509_FMT_PEM), 0);
  }
  ~Crt() { gnutls_x509_crt_deinit(crt); }
};

TEST(DevCert, NamesLocalhostAndLoopbackForAYear) {
  auto dir = temp_dir();
  auto paths = ensure_dev_cert(dir + "/tls");
  ASSERT_TRUE(paths) << paths.error().reason;
  struct stat st;
  ASSERT_EQ(stat(paths->key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Crt c(slurp(paths->cert));
  EXPECT_NE(gnutls_x509_crt_check_hostname(c.crt, "localhost"), 0u);
  EXPECT_NE(
      gnutls_x509_crt_check_ip(c.crt, reinterpret_cast<const unsigned char*>("\x7f\0\0\1"), 4, 0),
      0u);
  unsigned char v6[16] = {};
  v6[15] = 1;
  EXPECT_NE(gnutls_x509_crt_check_ip(c.crt, v6, 16, 0), 0u);
  EXPECT_EQ(gnutls_x509_crt_check_hostname(c.crt, "example.com"), 0u);
  time_t now = time(nullptr);
  EXPECT_LE(gnutls_x509_crt_get_activation_time(c.crt), now);
  time_t exp = gnutls_x509_crt_get_expiration_time(c.crt);
  EXPECT_GT(exp, now + 364 * 24 * 3600);
  EXPECT_LT(exp, now + 366 * 24 * 3600);
  // Self-signed: it verifies against itself as the only trust anchor.
  unsigned int status = 0;
  EXPECT_EQ(gnutls_x509_crt_list_verify(&c.crt, 1, &c.crt, 1, nullptr, 0, 0, &status), 0);
  EXPECT_EQ(status, 0u);
  // Loads as credentials (the key matches) with a base64 SHA-256 pin (44 characters).
  auto creds = Credentials::load(paths->cert, paths->key);
  ASSERT_TRUE(creds) << creds.error().reason;
  EXPECT_EQ(creds.value()->spki_sha256().size(), 44u);
  EXPECT_EQ(creds.value()->spki_sha256().back(), '=');
}

TEST(DevCert, ReusedWhileValidRegeneratedWhenExpiringOrBroken) {
  auto dir = temp_dir();
  auto first = ensure_dev_cert(dir);
  ASSERT_TRUE(first);
  std::string pem1 = slurp(first->cert);
  auto again = ensure_dev_cert(dir);
  ASSERT_TRUE(again);
  EXPECT_EQ(slurp(again->cert), pem1);  // still valid: the same certificate

  // A certificate that expires within the day is replaced.
  gnutls_x509_privkey_t key;
  gnutls_x509_privkey_init(&key);
  ASSERT_EQ(gnutls_x509_privkey_generate(key, GNUTLS_PK_ECDSA,
                                         GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0),
            0);
  gnutls_x509_crt_t crt;
  gnutls_x509_crt_init(&crt);
  gnutls_x509_crt_set_version(crt, 3);
  unsigned char serial = 7;
  gnutls_x509_crt_set_serial(crt, &serial, 1);
  gnutls_x509_crt_set_activation_time(crt, time(nullptr) - 3600);
  gnutls_x509_crt_set_expiration_time(crt, time(nullptr) + 600);
  gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, "localhost", 9);
  gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, "localhost", 9, GNUTLS_FSAN_APPEND);
  gnutls_x509_crt_set_key(crt, key);
  ASSERT_EQ(gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA256, 0), 0);
  gnutls_datum_t out;
  ASSERT_EQ(gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &out), 0);
  std::ofstream(first->cert, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<char*>(out.data), out.size);
  gnutls_free(out.data);
  gnutls_x509_crt_deinit(crt);
  gnutls_x509_privkey_deinit(key);
  auto renewed = ensure_dev_cert(dir);
  ASSERT_TRUE(renewed);
  std::string pem2 = slurp(renewed->cert);
  EXPECT_NE(pem2, pem1);
  Crt c(pem2);
  EXPECT_GT(gnutls_x509_crt_get_expiration_time(c.crt), time(nullptr) + 300 * 24 * 3600);

  // Garbage is replaced too.
  std::ofstream(renewed->cert, std::ios::trunc) << "not a certificate\n";
  auto fixed = ensure_dev_cert(dir);
  ASSERT_TRUE(fixed);
  EXPECT_NE(slurp(fixed->cert).find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_TRUE(Credentials::load(fixed->cert, fixed->key));
}

TEST(Credentials, LoadErrorsNameTheFile) {
  auto dir = temp_dir();
  auto a = ensure_dev_cert(dir + "/a");
  auto b = ensure_dev_cert(dir + "/b");
  ASSERT_TRUE(a && b);
  auto missing = Credentials::load(dir + "/nope.pem", a->key);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().reason.find("nope.pem"), std::string::npos);
  auto missing_key = Credentials::load(a->cert, dir + "/nokey.pem");
  ASSERT_FALSE(missing_key);
  EXPECT_NE(missing_key.error().reason.find("nokey.pem"), std::string::npos);
  auto mismatch = Credentials::load(a->cert, b->key);
  ASSERT_FALSE(mismatch);
  EXPECT_NE(mismatch.error().reason.find("does not match"), std::string::npos)
      << mismatch.error().reason;
  EXPECT_NE(mismatch.error().reason.find(b->key), std::string::npos);
  std::ofstream(dir + "/junk.pem") << "junk\n";
  auto junk = Credentials::load(dir + "/junk.pem", a->key);
  ASSERT_FALSE(junk);
  EXPECT_NE(junk.error().reason.find("junk.pem"), std::string::npos);
}

TEST(TicketKey, GeneratedKeysDiffer) {
  auto a = TicketKey::generate();
  auto b = TicketKey::generate();
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a.value()->get()->size, b.value()->get()->size);
  EXPECT_NE(std::string(reinterpret_cast<char*>(a.value()->get()->data), a.value()->get()->size),
            std::string(reinterpret_cast<char*>(b.value()->get()->data), b.value()->get()->size));
}

// A GnuTLS client against the server Session over a non-blocking socketpair, both driven by
// poll() in one thread.
class Loopback : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir();
    auto paths = ensure_dev_cert(dir_);
    ASSERT_TRUE(paths);
    cert_ = paths->cert;
    auto creds = Credentials::load(paths->cert, paths->key);
    ASSERT_TRUE(creds);
    auto ticket = TicketKey::generate();
    ASSERT_TRUE(ticket);
    auto cfg = ServerConfig::create(creds.value(), ticket.value());
    ASSERT_TRUE(cfg) << cfg.error().reason;
    config_ = cfg.value();
    gnutls_certificate_allocate_credentials(&client_cred_);
    ASSERT_GT(
        gnutls_certificate_set_x509_trust_file(client_cred_, cert_.c_str(), GNUTLS_X509_FMT_PEM),
        0);
  }
  void TearDown() override { gnutls_certificate_free_credentials(client_cred_); }

  struct Pair {
    int fds[2] = {-1, -1};
    gnutls_session_t client = nullptr;
    SessionPtr server;
    ~Pair() {
      if (client) gnutls_deinit(client);
      server.reset();
      for (int fd : fds)
        if (fd >= 0) close(fd);
    }
  };

  void make_pair(Pair& p, const char* client_priority, gnutls_datum_t* resume = nullptr) {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p.fds), 0);
    auto s = Session::accept(*config_, p.fds[0]);
    ASSERT_TRUE(s);
    p.server = std::move(s.value());
    ASSERT_EQ(gnutls_init(&p.client, GNUTLS_CLIENT | GNUTLS_NONBLOCK), 0);
    ASSERT_EQ(gnutls_priority_set_direct(p.client, client_priority, nullptr), 0);
    gnutls_credentials_set(p.client, GNUTLS_CRD_CERTIFICATE, client_cred_);
    gnutls_server_name_set(p.client, GNUTLS_NAME_DNS, "localhost", 9);
    gnutls_session_set_verify_cert(p.client, "localhost", 0);
    gnutls_datum_t protos[2] = {{(unsigned char*)"h2", 2}, {(unsigned char*)"http/1.1", 8}};
    gnutls_alpn_set_protocols(p.client, protos, 2, 0);
    if (resume) gnutls_session_set_data(p.client, resume->data, resume->size);
    gnutls_transport_set_int(p.client, p.fds[1]);
  }

  // Runs both handshakes to the end; false if either failed.
  bool handshake(Pair& p) {
    bool client_done = false, server_done = false;
    for (int round = 0; round < 200 && !(client_done && server_done); ++round) {
      if (!client_done) {
        int rc = gnutls_handshake(p.client);
        if (rc == 0)
          client_done = true;
        else if (rc != GNUTLS_E_AGAIN) {
          ADD_FAILURE() << "client: " << gnutls_strerror(rc);
          return false;
        }
      }
      if (!server_done) {
        auto step = p.server->handshake();
        if (step == Session::Step::kDone) server_done = true;
        if (step == Session::Step::kFailed) {
          ADD_FAILURE() << "server: " << p.server->error();
          return false;
        }
      }
    }
    return client_done && server_done;
  }

  // Reads from the server until `want` bytes arrived (draining pending()).
  std::string server_read(Pair& p, size_t want) {
    std::string got;
    char buf[4096];
    for (int round = 0; round < 1000 && got.size() < want; ++round) {
      ssize_t n = p.server->read(buf, sizeof buf);
      if (n > 0)
        got.append(buf, static_cast<size_t>(n));
      else if (n == 0)
        break;
      else if (errno != EAGAIN)
        break;
      else {
        pollfd pfd{p.fds[0], POLLIN, 0};
        poll(&pfd, 1, 100);
      }
    }
    return got;
  }

  std::string client_read(Pair& p, size_t want) {
    std::string got;
    char buf[4096];
    for (int round = 0; round < 1000 && got.size() < want; ++round) {
      ssize_t n = gnutls_record_recv(p.client, buf, sizeof buf);
      if (n > 0)
        got.append(buf, static_cast<size_t>(n));
      else if (n != GNUTLS_E_AGAIN)
        break;
      else {
        pollfd pfd{p.fds[1], POLLIN, 0};
        poll(&pfd, 1, 100);
      }
    }
    return got;
  }

  std::string dir_, cert_;
  std::shared_ptr<const ServerConfig> config_;
  gnutls_certificate_credentials_t client_cred_ = nullptr;
};

TEST_F(Loopback, Tls13HandshakeAlpnAndData) {
  Pair p;
  make_pair(p, "NORMAL");
  ASSERT_TRUE(handshake(p));
  EXPECT_EQ(p.server->version(), "TLS1.3");
  EXPECT_EQ(p.server->alpn(), "http/1.1");  // the only one the server offers
  std::string req = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ASSERT_EQ(gnutls_record_send(p.client, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  EXPECT_EQ(server_read(p, req.size()), req);
  // Larger than one record: the server's send() takes at most a record per call.
  std::string body(100000, 'x');
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>('a' + i % 26);
  size_t off = 0;
  std::string got;
  for (int round = 0; round < 10000 && (off < body.size() || got.size() < body.size()); ++round) {
    if (off < body.size()) {
      ssize_t n = p.server->send(body.data() + off, body.size() - off);
      if (n > 0)
        off += static_cast<size_t>(n);
      else
        ASSERT_EQ(errno, EAGAIN);  // retried with the same front bytes
    }
    char buf[16384];
    ssize_t n = gnutls_record_recv(p.client, buf, sizeof buf);
    if (n > 0) got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got, body);
  // close_notify reaches the client as a clean end.
  p.server->bye();
  EXPECT_EQ(client_read(p, 1), "");
}

TEST_F(Loopback, Tls12Works) {
  Pair p;
  make_pair(p, "NORMAL:-VERS-ALL:+VERS-TLS1.2");
  ASSERT_TRUE(handshake(p));
  EXPECT_EQ(p.server->version(), "TLS1.2");
  std::string msg = "ping";
  gnutls_record_send(p.client, msg.data(), msg.size());
  EXPECT_EQ(server_read(p, msg.size()), msg);
}

TEST_F(Loopback, Tls11AndWeakCiphersRefused) {
  Pair p;
  make_pair(p, "NORMAL:-VERS-ALL:+VERS-TLS1.1:+VERS-TLS1.0");
  bool client_failed = false, server_failed = false;
  for (int round = 0; round < 50 && !(client_failed && server_failed); ++round) {
    int rc = gnutls_handshake(p.client);
    if (rc != GNUTLS_E_AGAIN && rc != 0) client_failed = true;
    if (p.server->handshake() == Session::Step::kFailed) server_failed = true;
  }
  EXPECT_TRUE(server_failed);
  EXPECT_FALSE(p.server->error().empty());
}

TEST_F(Loopback, GarbageFailsTheHandshake) {
  Pair p;
  make_pair(p, "NORMAL");
  std::string plain = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ASSERT_EQ(write(p.fds[1], plain.data(), plain.size()), static_cast<ssize_t>(plain.size()));
  Session::Step step = Session::Step::kWantRead;
  for (int i = 0; i < 10 && step == Session::Step::kWantRead; ++i) step = p.server->handshake();
  EXPECT_EQ(step, Session::Step::kFailed);
  EXPECT_FALSE(p.server->error().empty());
}

TEST_F(Loopback, PendingBytesAreReportedAndDrainable) {
  Pair p;
  make_pair(p, "NORMAL");
  ASSERT_TRUE(handshake(p));
  std::string msg(3000, 'q');
  gnutls_record_send(p.client, msg.data(), msg.size());  // one record
  pollfd pfd{p.fds[0], POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 1000), 1);
  char small[1000];
  ASSERT_EQ(p.server->read(small, sizeof small), 1000);
  // The rest of the record is inside GnuTLS; the socket itself has nothing left to signal.
  EXPECT_EQ(p.server->pending(), 2000u);
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
  EXPECT_EQ(server_read(p, 2000).size(), 2000u);
}

TEST_F(Loopback, RecordsReadAheadCountAsPending) {
  Pair p;
  make_pair(p, "NORMAL");
  ASSERT_TRUE(handshake(p));
  for (char c : {'a', 'b', 'c'}) {  // three records in one segment train
    std::string m(100, c);
    ASSERT_EQ(gnutls_record_send(p.client, m.data(), m.size()), 100);
  }
  pollfd pfd{p.fds[0], POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 1000), 1);
  usleep(10'000);  // let all three arrive, so one recv() takes them
  char buf[4096];
  ASSERT_EQ(p.server->read(buf, sizeof buf), 100);  // GnuTLS returns one record per call
  EXPECT_EQ(std::string(buf, 100), std::string(100, 'a'));
  // The other two were received already: the socket is silent, pending() is not.
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
  EXPECT_GE(p.server->pending(), 200u);
  std::string rest;
  while (p.server->pending() > 0) {
    ssize_t n = p.server->read(buf, sizeof buf);
    ASSERT_GT(n, 0);
    rest.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(rest, std::string(100, 'b') + std::string(100, 'c'));
}

TEST_F(Loopback, TicketFromOneSessionResumesAnother) {
  gnutls_datum_t ticket{};
  {
    Pair p;
    make_pair(p, "NORMAL");
    ASSERT_TRUE(handshake(p));
    // TLS 1.3 tickets arrive after the handshake: the client reads them with the first data.
    std::string hi = "hi";
    ASSERT_EQ(p.server->send(hi.data(), hi.size()), 2);
    EXPECT_EQ(client_read(p, 2), "hi");
    ASSERT_EQ(gnutls_session_get_data2(p.client, &ticket), 0);
  }
  Pair q;
  make_pair(q, "NORMAL", &ticket);
  ASSERT_TRUE(handshake(q));
  EXPECT_TRUE(q.server->resumed());
  EXPECT_NE(gnutls_session_is_resumed(q.client), 0);
  gnutls_free(ticket.data);
}

}  // namespace
}  // namespace corral::tls
