// TLS credentials and keys shared by every server process. The supervisor loads them before it
// forks (so a bad certificate is a startup error, exit 78) and the children inherit them; a SIGHUP
// builds a new generation with freshly loaded credentials, so a new certificate is picked up by
// new connections while old ones finish on the old processes.
#pragma once

#include <gnutls/gnutls.h>

#include <memory>
#include <string>

#include "core/result.h"

namespace corral::tls {

// A certificate chain and its key (PEM files), as GnuTLS credentials.
class Credentials {
 public:
  static core::Result<std::shared_ptr<Credentials>> load(const std::string& cert_path,
                                                         const std::string& key_path);
  // The same from PEM text in memory; `label` stands for the path in cert_path() and errors.
  static core::Result<std::shared_ptr<Credentials>> from_memory(const std::string& cert_pem,
                                                                const std::string& key_pem,
                                                                const std::string& label);
  ~Credentials();
  Credentials(const Credentials&) = delete;
  Credentials& operator=(const Credentials&) = delete;

  gnutls_certificate_credentials_t get() const { return cred_; }
  const std::string& cert_path() const { return cert_path_; }
  // The SHA-256 of the leaf's SubjectPublicKeyInfo, base64 (Chromium's SPKI pin; logs).
  const std::string& spki_sha256() const { return spki_; }

 private:
  Credentials() = default;
  gnutls_certificate_credentials_t cred_ = nullptr;
  std::string cert_path_;
  std::string spki_;
};

// The session-ticket key (TCP TLS and QUIC): generated once per supervisor start, the same in every
// process, so a ticket issued by one process resumes on any other.
class TicketKey {
 public:
  static core::Result<std::shared_ptr<TicketKey>> generate();
  ~TicketKey();
  TicketKey(const TicketKey&) = delete;
  TicketKey& operator=(const TicketKey&) = delete;
  const gnutls_datum_t* get() const { return &key_; }

 private:
  TicketKey() = default;
  gnutls_datum_t key_{};
};

// The development certificate: a self-signed ECDSA P-256 certificate for localhost, 127.0.0.1
// and ::1 in <dir>/dev-cert.pem and <dir>/dev-key.pem (0600), made when absent or expiring within
// a day. `corral cert` and a TLS listener without a configured certificate use it. <dir> (made
// 0700 when absent) and the two files must be the running user's and not group/other writable
// (core/owned_path.h), or it fails with core::kErrorUnsafePath naming the path.
struct CertPaths {
  std::string cert;
  std::string key;
};
core::Result<CertPaths> ensure_dev_cert(const std::string& dir);

}  // namespace corral::tls
