#include "tls/session.h"

#include "tls/alpn_challenge.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace corral::tls {

namespace {
constexpr char kHttp11[] = "http/1.1";
// One full TLS record (16 KiB of plaintext plus header and AEAD overhead), and then some.
constexpr size_t kReadAhead = 18 * 1024;
}  // namespace

void SessionDelete::operator()(Session* s) const {
  delete s;
}

core::Result<std::shared_ptr<const ServerConfig>> ServerConfig::create(
    std::shared_ptr<Credentials> credentials, std::shared_ptr<TicketKey> ticket_key,
    const char* priority, std::shared_ptr<AcmeBoard> acme) {
  std::shared_ptr<ServerConfig> c(new ServerConfig());
  c->credentials_ = std::move(credentials);
  c->acme_ = std::move(acme);
  c->ticket_key_ = std::move(ticket_key);
  const char* where = nullptr;
  if (int rc = gnutls_priority_init2(&c->priority_, priority, &where, 0); rc != 0)
    return core::Error{rc, std::string("tls priority: ") + gnutls_strerror(rc) + " at '" +
                               (where ? where : "") + "'"};
  return std::shared_ptr<const ServerConfig>(std::move(c));
}

ServerConfig::~ServerConfig() {
  if (priority_) gnutls_priority_deinit(priority_);
}

std::shared_ptr<Credentials> ServerConfig::current_credentials() const {
  if (!acme_) return credentials_;
  uint64_t version = acme_->certificate_version();
  if (version != acme_version_) {
    acme_version_ = version;  // a file that does not load is not retried until the next version
    if (auto fresh = Credentials::load(acme_->cert_path(), acme_->key_path()))
      acme_credentials_ = std::move(fresh.value());
  }
  return acme_credentials_ ? acme_credentials_ : credentials_;
}

std::shared_ptr<Credentials> ServerConfig::challenge_credentials(
    const std::string& domain, const std::string& key_authorization) const {
  std::string key = domain + " " + key_authorization;
  if (auto it = challenges_.find(key); it != challenges_.end()) return it->second;
  auto made = make_alpn_challenge_credentials(domain, key_authorization);
  if (!made) return nullptr;
  if (challenges_.size() >= 16) challenges_.clear();  // a validation lasts seconds
  challenges_[key] = made.value();
  return made.value();
}

int Session::on_client_hello(gnutls_session_t session) {
  auto* s = static_cast<Session*>(gnutls_session_get_ptr(session));
  const AcmeBoard* board = s->config_->acme();
  if (s->alpn() == kAcmeTlsAlpn) {
    char name[256];
    size_t len = sizeof name;
    unsigned type = 0;
    if (gnutls_server_name_get(session, name, &len, &type, 0) != 0 || type != GNUTLS_NAME_DNS) {
      s->error_ = "acme-tls/1 without a server name";
      return GNUTLS_E_NO_CERTIFICATE_FOUND;
    }
    std::string domain(name, len);
    auto answer = board->tls_alpn01(domain);
    if (!answer) {
      s->error_ = "acme-tls/1 for " + domain + ": no challenge published";
      return GNUTLS_E_NO_CERTIFICATE_FOUND;
    }
    auto cred = s->config_->challenge_credentials(domain, *answer);
    if (!cred) return GNUTLS_E_NO_CERTIFICATE_FOUND;
    s->credentials_ = std::move(cred);
    s->challenge_ = true;
    return gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, s->credentials_->get());
  }
  if (board->refuse_until_issued() && board->certificate_version() == 0) {
    s->error_ = "no ACME certificate yet";
    return GNUTLS_E_NO_CERTIFICATE_FOUND;
  }
  return 0;
}

core::Result<SessionPtr> Session::accept(const ServerConfig& config, int fd) {
  SessionPtr s(new Session());
  s->config_ = &config;
  s->credentials_ = config.current_credentials();
  int rc = gnutls_init(&s->session_, GNUTLS_SERVER | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL);
  if (rc == 0) rc = gnutls_priority_set(s->session_, config.priority());
  if (rc == 0)
    rc = gnutls_credentials_set(s->session_, GNUTLS_CRD_CERTIFICATE, s->credentials_->get());
  if (rc == 0) {
    // "acme-tls/1" after "http/1.1": the server's order wins, so only a client that offers it
    // alone (a CA's validation, RFC 8737) gets it.
    gnutls_datum_t protos[2] = {
        {reinterpret_cast<unsigned char*>(const_cast<char*>(kHttp11)), sizeof kHttp11 - 1},
        {reinterpret_cast<unsigned char*>(const_cast<char*>(kAcmeTlsAlpn)),
         sizeof kAcmeTlsAlpn - 1}};
    rc = gnutls_alpn_set_protocols(s->session_, protos, config.acme() ? 2 : 1,
                                   GNUTLS_ALPN_SERVER_PRECEDENCE);
  }
  if (rc == 0 && config.acme()) {
    gnutls_session_set_ptr(s->session_, s.get());
    gnutls_handshake_set_post_client_hello_function(s->session_, &Session::on_client_hello);
  }
  if (rc == 0 && config.ticket_key())
    rc = gnutls_session_ticket_enable_server(s->session_, config.ticket_key()->get());
  if (rc != 0) return core::Error{rc, std::string("tls session: ") + gnutls_strerror(rc)};
  gnutls_certificate_server_set_request(s->session_, GNUTLS_CERT_IGNORE);
  s->fd_ = fd;
  gnutls_transport_set_ptr(s->session_, s.get());
  gnutls_transport_set_vec_push_function(s->session_, &Session::push);
  gnutls_transport_set_pull_function(s->session_, &Session::pull);
  gnutls_transport_set_pull_timeout_function(s->session_, &Session::pull_timeout);
  return s;
}

ssize_t Session::pull(gnutls_transport_ptr_t self, void* buf, size_t n) {
  auto* s = static_cast<Session*>(self);
  if (s->ahead_off_ == s->ahead_len_) {
    if (!s->ahead_) s->ahead_ = std::make_unique<char[]>(kReadAhead);
    ssize_t r;
    do {
      r = ::recv(s->fd_, s->ahead_.get(), kReadAhead, 0);
    } while (r < 0 && errno == EINTR);
    if (r <= 0) {
      if (r < 0) gnutls_transport_set_errno(s->session_, errno);
      return r;
    }
    s->ahead_off_ = 0;
    s->ahead_len_ = static_cast<size_t>(r);
  }
  size_t take = std::min(n, s->ahead_len_ - s->ahead_off_);
  std::memcpy(buf, s->ahead_.get() + s->ahead_off_, take);
  s->ahead_off_ += take;
  return static_cast<ssize_t>(take);
}

ssize_t Session::push(gnutls_transport_ptr_t self, const giovec_t* iov, int count) {
  auto* s = static_cast<Session*>(self);
  msghdr msg{};
  // giovec_t is struct iovec on POSIX systems.
  msg.msg_iov = const_cast<iovec*>(reinterpret_cast<const iovec*>(iov));
  msg.msg_iovlen = static_cast<size_t>(count);
  ssize_t r;
  do {
    r = ::sendmsg(s->fd_, &msg, MSG_NOSIGNAL);
  } while (r < 0 && errno == EINTR);
  if (r < 0) gnutls_transport_set_errno(s->session_, errno);
  return r;
}

int Session::pull_timeout(gnutls_transport_ptr_t self, unsigned int ms) {
  auto* s = static_cast<Session*>(self);
  if (s->ahead_off_ < s->ahead_len_) return 1;
  pollfd p{s->fd_, POLLIN, 0};
  return ::poll(&p, 1, ms == GNUTLS_INDEFINITE_TIMEOUT ? -1 : static_cast<int>(ms));
}

Session::~Session() {
  if (session_) gnutls_deinit(session_);
}

Session::Step Session::handshake() {
  for (;;) {
    int rc = gnutls_handshake(session_);
    if (rc == GNUTLS_E_SUCCESS && challenge_) {
      // RFC 8737 §3: a validation handshake carries no application data; the CA closes it.
      error_ = "acme-tls/1 validation answered";
      bye();
      return Step::kFailed;
    }
    if (rc == GNUTLS_E_SUCCESS) return Step::kDone;
    if (rc == GNUTLS_E_AGAIN)
      return gnutls_record_get_direction(session_) == 1 ? Step::kWantWrite : Step::kWantRead;
    if (rc == GNUTLS_E_INTERRUPTED) continue;
    if (!gnutls_error_is_fatal(rc)) continue;  // a warning alert: go on
    error_ = gnutls_strerror(rc);
    // Tell the client why, best effort (one non-blocking try; a plain-HTTP client ignores it).
    (void)gnutls_alert_send_appropriate(session_, rc);
    return Step::kFailed;
  }
}

ssize_t Session::fail(int rc) {
  error_ = gnutls_strerror(rc);
  errno = rc == GNUTLS_E_PUSH_ERROR || rc == GNUTLS_E_PULL_ERROR ? ECONNRESET : EPROTO;
  return -1;
}

ssize_t Session::read(void* buf, size_t n) {
  for (;;) {
    ssize_t r = gnutls_record_recv(session_, buf, n);
    if (r >= 0) return r;  // 0: close_notify
    switch (r) {
      case GNUTLS_E_AGAIN:
        errno = EAGAIN;
        return -1;
      case GNUTLS_E_INTERRUPTED:
        errno = EINTR;
        return -1;
      case GNUTLS_E_PREMATURE_TERMINATION:
        return 0;  // a TCP FIN without close_notify: HTTP/1.1 framing tells truncation apart
      case GNUTLS_E_WARNING_ALERT_RECEIVED:
        continue;
      default:
        // Renegotiation (TLS 1.2 client hello after the handshake) is refused: it is closed.
        return fail(static_cast<int>(r));
    }
  }
}

ssize_t Session::send(const void* buf, size_t n) {
  ssize_t r = gnutls_record_send(session_, buf, n);
  if (r >= 0) return r;
  if (r == GNUTLS_E_AGAIN) {
    errno = EAGAIN;
    return -1;
  }
  if (r == GNUTLS_E_INTERRUPTED) {
    errno = EINTR;
    return -1;
  }
  return fail(static_cast<int>(r));
}

void Session::bye() {
  (void)gnutls_bye(session_, GNUTLS_SHUT_WR);
}

std::string_view Session::alpn() const {
  gnutls_datum_t p{};
  if (gnutls_alpn_get_selected_protocol(session_, &p) != 0) return {};
  return {reinterpret_cast<const char*>(p.data), p.size};
}

std::string Session::version() const {
  const char* v = gnutls_protocol_get_name(gnutls_protocol_get_version(session_));
  return v ? v : "";
}

}  // namespace corral::tls
