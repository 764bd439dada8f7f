#include "tls/session.h"

#include <errno.h>

namespace corral::tls {

namespace {
constexpr char kHttp11[] = "http/1.1";
}  // namespace

void SessionDelete::operator()(Session* s) const {
  delete s;
}

core::Result<std::shared_ptr<const ServerConfig>> ServerConfig::create(
    std::shared_ptr<Credentials> credentials, std::shared_ptr<TicketKey> ticket_key,
    const char* priority) {
  std::shared_ptr<ServerConfig> c(new ServerConfig());
  c->credentials_ = std::move(credentials);
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

core::Result<SessionPtr> Session::accept(const ServerConfig& config, int fd) {
  SessionPtr s(new Session());
  int rc = gnutls_init(&s->session_, GNUTLS_SERVER | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL);
  if (rc == 0) rc = gnutls_priority_set(s->session_, config.priority());
  if (rc == 0)
    rc = gnutls_credentials_set(s->session_, GNUTLS_CRD_CERTIFICATE, config.credentials().get());
  if (rc == 0) {
    gnutls_datum_t proto{reinterpret_cast<unsigned char*>(const_cast<char*>(kHttp11)),
                         sizeof kHttp11 - 1};
    rc = gnutls_alpn_set_protocols(s->session_, &proto, 1, GNUTLS_ALPN_SERVER_PRECEDENCE);
  }
  if (rc == 0 && config.ticket_key())
    rc = gnutls_session_ticket_enable_server(s->session_, config.ticket_key()->get());
  if (rc != 0) return core::Error{rc, std::string("tls session: ") + gnutls_strerror(rc)};
  gnutls_certificate_server_set_request(s->session_, GNUTLS_CERT_IGNORE);
  gnutls_transport_set_int(s->session_, fd);
  return s;
}

Session::~Session() {
  if (session_) gnutls_deinit(session_);
}

Session::Step Session::handshake() {
  for (;;) {
    int rc = gnutls_handshake(session_);
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
