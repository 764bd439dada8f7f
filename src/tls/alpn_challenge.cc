#include "tls/alpn_challenge.h"

#include <gnutls/crypto.h>
#include <gnutls/x509.h>

#include <ctime>

namespace corral::tls {

namespace {
struct Datum {
  gnutls_datum_t d{};
  ~Datum() { gnutls_free(d.data); }
  std::string str() const { return std::string(reinterpret_cast<const char*>(d.data), d.size); }
};
}  // namespace

core::Result<ChallengeCertificate> make_alpn_challenge_certificate(
    const std::string& domain, const std::string& key_authorization) {
  // The extension's value: OCTET STRING (0x04), 32 bytes, the digest.
  unsigned char ext[2 + 32] = {0x04, 32};
  gnutls_hash_fast(GNUTLS_DIG_SHA256, key_authorization.data(), key_authorization.size(), ext + 2);
  gnutls_x509_privkey_t key = nullptr;
  gnutls_x509_crt_t crt = nullptr;
  int rc = gnutls_x509_privkey_init(&key);
  if (rc == 0)
    rc = gnutls_x509_privkey_generate(key, GNUTLS_PK_ECDSA,
                                      GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0);
  if (rc == 0) rc = gnutls_x509_crt_init(&crt);
  if (rc == 0) rc = gnutls_x509_crt_set_version(crt, 3);
  unsigned char serial[16];
  if (rc == 0) rc = gnutls_rnd(GNUTLS_RND_NONCE, serial, sizeof serial);
  serial[0] = static_cast<unsigned char>((serial[0] & 0x7f) | 0x01);
  if (rc == 0) rc = gnutls_x509_crt_set_serial(crt, serial, sizeof serial);
  time_t now = std::time(nullptr);
  if (rc == 0) rc = gnutls_x509_crt_set_activation_time(crt, now - 3600);
  if (rc == 0) rc = gnutls_x509_crt_set_expiration_time(crt, now + 7 * 24 * 3600);
  if (rc == 0)
    rc = gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, domain.data(),
                                       static_cast<unsigned>(domain.size()));
  if (rc == 0)
    rc = gnutls_x509_crt_set_issuer_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, domain.data(),
                                              static_cast<unsigned>(domain.size()));
  if (rc == 0)
    rc =
        gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, domain.data(),
                                             static_cast<unsigned>(domain.size()), GNUTLS_FSAN_SET);
  if (rc == 0)
    rc = gnutls_x509_crt_set_extension_by_oid(crt, kAcmeIdentifierOid, ext, sizeof ext,
                                              /*critical=*/1);
  if (rc == 0) rc = gnutls_x509_crt_set_key(crt, key);
  if (rc == 0) rc = gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA256, 0);
  Datum cert_pem, key_pem;
  if (rc == 0) rc = gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &cert_pem.d);
  if (rc == 0)
    rc = gnutls_x509_privkey_export2_pkcs8(key, GNUTLS_X509_FMT_PEM, nullptr, GNUTLS_PKCS_PLAIN,
                                           &key_pem.d);
  if (crt) gnutls_x509_crt_deinit(crt);
  if (key) gnutls_x509_privkey_deinit(key);
  if (rc != 0)
    return core::Error{rc, std::string("tls-alpn-01 certificate: ") + gnutls_strerror(rc)};
  return ChallengeCertificate{cert_pem.str(), key_pem.str()};
}

core::Result<std::shared_ptr<Credentials>> make_alpn_challenge_credentials(
    const std::string& domain, const std::string& key_authorization) {
  auto made = make_alpn_challenge_certificate(domain, key_authorization);
  if (!made) return made.error();
  return Credentials::from_memory(made->cert_pem, made->key_pem, "tls-alpn-01:" + domain);
}

}  // namespace corral::tls
