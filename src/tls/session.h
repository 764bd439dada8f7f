// TLS over a non-blocking TCP socket, server side (GnuTLS).
//
// ServerConfig is what every connection of a process shares: the credentials (certificate chain
// and key), the session-ticket key (the same in every process, so a ticket from one resumes on
// another), the priority string (TLS 1.3 and 1.2, AEAD ciphers only, ECDHE) and ALPN "http/1.1".
// It is built in the supervisor before the fork and is read-only afterwards, but for ACME: with an
// AcmeBoard (tls/acme_board.h) it also offers ALPN "acme-tls/1" and answers TLS-ALPN-01
// validations with a challenge certificate, and it takes the board's newer certificate for the
// next handshakes (current_credentials(), checked once per accepted connection: one atomic load).
//
// Session is one connection's TLS state over a socket it does not own. handshake(), read() and
// send() never block; read() and send() keep the ::read()/::send() conventions (bytes, 0 at the
// end, -1 with errno EAGAIN/EINTR or another errno on failure), so callers keep one code path.
// GnuTLS rules the callers must keep:
//  * a send() that failed with EAGAIN must be called again with the same bytes at the front (the
//    record is already encrypted; GnuTLS returns the size of the first call);
//  * after read(), pending() decrypted bytes may sit inside GnuTLS where epoll cannot see them:
//    read until pending() is 0 before waiting for EPOLLIN again.
// Lifetime: owned by the connection; destroyed before (or with) the socket; one thread.
#pragma once

#include <gnutls/gnutls.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "core/result.h"
#include "tls/acme_board.h"
#include "tls/credentials.h"
#include "tls/session_ptr.h"

namespace corral::tls {

// Protocol versions and ciphers both TLS 1.3 and TLS 1.2 clients get: AEAD only, forward secret.
inline constexpr const char* kDefaultPriority =
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:"
    "+CHACHA20-POLY1305:-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA:%SERVER_PRECEDENCE";

class ServerConfig {
 public:
  // The shared_ptrs: the credentials and the ticket key outlive a reload generation's config and
  // are shared with HTTP/3's contexts in the same process.
  static core::Result<std::shared_ptr<const ServerConfig>> create(
      std::shared_ptr<Credentials> credentials, std::shared_ptr<TicketKey> ticket_key,
      const char* priority = kDefaultPriority, std::shared_ptr<AcmeBoard> acme = nullptr);
  ~ServerConfig();
  ServerConfig(const ServerConfig&) = delete;
  ServerConfig& operator=(const ServerConfig&) = delete;

  const Credentials& credentials() const { return *credentials_; }
  const TicketKey* ticket_key() const { return ticket_key_.get(); }
  gnutls_priority_t priority() const { return priority_; }
  const AcmeBoard* acme() const { return acme_.get(); }

  // The credentials a new handshake gets: the configured ones, or the board's newest certificate
  // once one was published (loaded from its files when the version moves; a file that does not
  // load keeps the previous credentials). The mutable state is this process's alone.
  std::shared_ptr<Credentials> current_credentials() const;
  // The TLS-ALPN-01 certificate for `domain` answering `key_authorization` (made once, kept).
  std::shared_ptr<Credentials> challenge_credentials(const std::string& domain,
                                                     const std::string& key_authorization) const;

 private:
  ServerConfig() = default;
  std::shared_ptr<AcmeBoard> acme_;
  mutable std::shared_ptr<Credentials> acme_credentials_;
  mutable uint64_t acme_version_ = 0;
  mutable std::map<std::string, std::shared_ptr<Credentials>> challenges_;
  std::shared_ptr<Credentials> credentials_;
  std::shared_ptr<TicketKey> ticket_key_;
  gnutls_priority_t priority_ = nullptr;
};

class Session {
 public:
  // A server session over `fd` (non-blocking, not owned). Allocates; nothing is sent yet.
  static core::Result<SessionPtr> accept(const ServerConfig& config, int fd);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  enum class Step { kDone, kWantRead, kWantWrite, kFailed };
  // Drives the handshake; kWantRead/kWantWrite: call again when the socket is readable/writable.
  Step handshake();
  // Why the handshake or the last read/send failed (GnuTLS's reason).
  const std::string& error() const { return error_; }

  ssize_t read(void* buf, size_t n);
  ssize_t send(const void* buf, size_t n);
  // Decrypted bytes inside GnuTLS plus received bytes in the read-ahead buffer: both are invisible
  // to epoll.
  size_t pending() const {
    return gnutls_record_check_pending(session_) + (ahead_len_ - ahead_off_);
  }
  // The last EAGAIN was waiting to write (GnuTLS's record direction), not to read.
  bool wants_write() const { return gnutls_record_get_direction(session_) == 1; }
  // close_notify, best effort: one non-blocking attempt.
  void bye();

  std::string_view alpn() const;  // the negotiated protocol, empty if none
  bool resumed() const { return gnutls_session_is_resumed(session_) != 0; }
  std::string version() const;  // "TLS1.3"
  gnutls_session_t get() const { return session_; }

 private:
  Session() = default;
  ssize_t fail(int rc);
  // GnuTLS's post-client-hello hook (ACME only): ALPN and SNI are known, the certificate is not
  // chosen yet, so an "acme-tls/1" validation gets its challenge certificate here.
  static int on_client_hello(gnutls_session_t session);
  const ServerConfig* config_ = nullptr;
  std::shared_ptr<Credentials> credentials_;  // what gnutls_credentials_set() borrows
  bool challenge_ = false;                    // an acme-tls/1 validation handshake
  // GnuTLS's pull function: GnuTLS reads a record's 5-byte header and its body in two calls;
  // one recv() into this buffer serves both (and the next records that came with them).
  static ssize_t pull(gnutls_transport_ptr_t self, void* buf, size_t n);
  static int pull_timeout(gnutls_transport_ptr_t self, unsigned int ms);
  static ssize_t push(gnutls_transport_ptr_t self, const giovec_t* iov, int count);
  gnutls_session_t session_ = nullptr;
  int fd_ = -1;
  std::unique_ptr<char[]> ahead_;
  size_t ahead_off_ = 0;
  size_t ahead_len_ = 0;
  std::string error_;
};

}  // namespace corral::tls
