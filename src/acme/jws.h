// JSON Web Signatures for ACME (RFC 8555 §6.2, RFC 7515): the account key (ECDSA P-256, so ES256),
// its JWK and RFC 7638 thumbprint (the key authorizations' second half), and the flattened JWS
// JSON an ACME request body is. Also the pieces an order needs from the same primitives: base64url
// without padding, SHA-256, the certificate's own key and its CSR (PKCS#10, GnuTLS's x509_crq).
//
// Pure computation on GnuTLS: no I/O. An AccountKey owns its GnuTLS key (move-only); any thread.
#pragma once

#include <gnutls/abstract.h>

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace corral::acme {

std::string base64url(std::string_view bytes);
// Decodes unpadded (or padded) base64url; an invalid character is an error.
core::Result<std::string> base64url_decode(std::string_view text);
std::string sha256(std::string_view bytes);  // the 32 raw bytes

// ECDSA's DER signature (SEQUENCE { r INTEGER, s INTEGER }) as JWS wants it for ES256: r || s, each
// left-padded to 32 bytes (RFC 7518 §3.4).
core::Result<std::string> der_signature_to_raw(std::string_view der, size_t half = 32);

class AccountKey {
 public:
  static core::Result<AccountKey> generate();  // a fresh P-256 key
  static core::Result<AccountKey> from_pem(std::string_view pem);
  AccountKey(AccountKey&& other) noexcept;
  AccountKey& operator=(AccountKey&& other) noexcept;
  ~AccountKey();

  core::Result<std::string> pem() const;  // PKCS#8, unencrypted (stored 0600)
  const nlohmann::json& jwk() const { return jwk_; }
  const std::string& thumbprint() const { return thumbprint_; }  // base64url(SHA-256(JWK))
  // ES256 over `input`: the raw r || s, 64 bytes.
  core::Result<std::string> sign(std::string_view input) const;

 private:
  AccountKey() = default;
  core::Result<void> describe();  // fills jwk_ and thumbprint_ from key_
  gnutls_privkey_t key_ = nullptr;
  nlohmann::json jwk_;
  std::string thumbprint_;
};

// The flattened JWS of `payload` ("" for POST-as-GET) to `url`: the protected header carries the
// account's JWK when `kid` is empty (newAccount), else the account URL as kid (§6.2).
core::Result<std::string> sign_request(const AccountKey& key, std::string_view kid,
                                       std::string_view nonce, std::string_view url,
                                       std::string_view payload);

// The key authorization of a challenge token (§8.1): "<token>.<thumbprint>".
std::string key_authorization(std::string_view token, const AccountKey& key);

// A certificate's private key (P-256) and its CSR naming `domains` (the first as CN too), DER.
struct CertificateRequest {
  std::string key_pem;  // PKCS#8
  std::string csr_der;
};
core::Result<CertificateRequest> make_certificate_request(const std::vector<std::string>& domains);

}  // namespace corral::acme
