// The TLS-ALPN-01 challenge certificate (RFC 8737 §3): self-signed, for one domain (its only
// subjectAltName), with the critical acmeIdentifier extension (1.3.6.1.5.5.7.1.31) holding the
// SHA-256 of the key authorization as an OCTET STRING. A server process makes one when a CA's
// validation handshake offers ALPN "acme-tls/1" for a domain the AcmeBoard has an answer for
// (Session's client-hello hook); ServerConfig keeps the few it made.
#pragma once

#include <memory>
#include <string>

#include "core/result.h"
#include "tls/credentials.h"

namespace corral::tls {

inline constexpr char kAcmeIdentifierOid[] = "1.3.6.1.5.5.7.1.31";

// The certificate (PEM) and its key (PEM, PKCS#8); make_alpn_challenge_credentials loads them.
struct ChallengeCertificate {
  std::string cert_pem;
  std::string key_pem;
};
core::Result<ChallengeCertificate> make_alpn_challenge_certificate(
    const std::string& domain, const std::string& key_authorization);
core::Result<std::shared_ptr<Credentials>> make_alpn_challenge_credentials(
    const std::string& domain, const std::string& key_authorization);

}  // namespace corral::tls
