#include "acme/jws.h"

#include <gnutls/crypto.h>
#include <gnutls/x509.h>

#include <utility>

namespace corral::acme {

namespace {

core::Error gnutls_problem(const std::string& what, int rc) {
  return core::Error{rc, what + ": " + gnutls_strerror(rc)};
}

struct Datum {
  gnutls_datum_t d{};
  ~Datum() { gnutls_free(d.data); }
  std::string str() const { return std::string(reinterpret_cast<const char*>(d.data), d.size); }
};

gnutls_datum_t view(std::string_view s) {
  return {reinterpret_cast<unsigned char*>(const_cast<char*>(s.data())),
          static_cast<unsigned>(s.size())};
}

// An unsigned big-endian integer, left-padded (or stripped of leading zeros) to `n` bytes.
core::Result<std::string> fixed_width(const gnutls_datum_t& v, size_t n) {
  std::string s(reinterpret_cast<const char*>(v.data), v.size);
  while (s.size() > n && s.front() == '\0') s.erase(s.begin());
  if (s.size() > n) return core::Error{EINVAL, "ECDSA value longer than the curve"};
  return std::string(n - s.size(), '\0') + s;
}

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

}  // namespace

std::string base64url(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<unsigned char>(bytes[k]); };
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (at(i) << 16) | (at(i + 1) << 8) | at(i + 2);
    for (int shift = 18; shift >= 0; shift -= 6) out.push_back(kAlphabet[(v >> shift) & 63]);
  }
  size_t rest = bytes.size() - i;
  if (rest == 1) {
    uint32_t v = at(i) << 16;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
  } else if (rest == 2) {
    uint32_t v = (at(i) << 16) | (at(i + 1) << 8);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
  }
  return out;
}

core::Result<std::string> base64url_decode(std::string_view text) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '-')
      v = 62;
    else if (c == '_')
      v = 63;
    else
      return core::Error{EINVAL, "invalid base64url"};
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if (bits >= 6) return core::Error{EINVAL, "invalid base64url length"};
  return out;
}

std::string sha256(std::string_view bytes) {
  unsigned char digest[32];
  gnutls_hash_fast(GNUTLS_DIG_SHA256, bytes.data(), bytes.size(), digest);
  return std::string(reinterpret_cast<char*>(digest), sizeof digest);
}

core::Result<std::string> der_signature_to_raw(std::string_view der, size_t half) {
  gnutls_datum_t sig = view(der);
  Datum r, s;
  if (int rc = gnutls_decode_rs_value(&sig, &r.d, &s.d); rc != 0)
    return gnutls_problem("ECDSA signature", rc);
  auto rr = fixed_width(r.d, half);
  if (!rr) return rr.error();
  auto ss = fixed_width(s.d, half);
  if (!ss) return ss.error();
  return rr.value() + ss.value();
}

AccountKey::AccountKey(AccountKey&& other) noexcept
    : key_(std::exchange(other.key_, nullptr)),
      jwk_(std::move(other.jwk_)),
      thumbprint_(std::move(other.thumbprint_)) {}

AccountKey& AccountKey::operator=(AccountKey&& other) noexcept {
  if (this != &other) {
    if (key_) gnutls_privkey_deinit(key_);
    key_ = std::exchange(other.key_, nullptr);
    jwk_ = std::move(other.jwk_);
    thumbprint_ = std::move(other.thumbprint_);
  }
  return *this;
}

AccountKey::~AccountKey() {
  if (key_) gnutls_privkey_deinit(key_);
}

core::Result<AccountKey> AccountKey::generate() {
  AccountKey k;
  int rc = gnutls_privkey_init(&k.key_);
  if (rc == 0)
    rc = gnutls_privkey_generate(k.key_, GNUTLS_PK_ECDSA,
                                 GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0);
  if (rc != 0) return gnutls_problem("account key", rc);
  if (auto r = k.describe(); !r) return r.error();
  return k;
}

core::Result<AccountKey> AccountKey::from_pem(std::string_view pem) {
  AccountKey k;
  gnutls_datum_t d = view(pem);
  int rc = gnutls_privkey_init(&k.key_);
  if (rc == 0) rc = gnutls_privkey_import_x509_raw(k.key_, &d, GNUTLS_X509_FMT_PEM, nullptr, 0);
  if (rc != 0) return gnutls_problem("account key", rc);
  if (gnutls_privkey_get_pk_algorithm(k.key_, nullptr) != GNUTLS_PK_ECDSA)
    return core::Error{EINVAL, "account key: not an ECDSA key"};
  if (auto r = k.describe(); !r) return r.error();
  return k;
}

core::Result<void> AccountKey::describe() {
  gnutls_ecc_curve_t curve;
  Datum x, y;
  int rc = gnutls_privkey_export_ecc_raw2(key_, &curve, &x.d, &y.d, nullptr, 0);
  if (rc != 0) return gnutls_problem("account key", rc);
  if (curve != GNUTLS_ECC_CURVE_SECP256R1) return core::Error{EINVAL, "account key: not P-256"};
  auto xs = fixed_width(x.d, 32);
  auto ys = fixed_width(y.d, 32);
  if (!xs || !ys) return core::Error{EINVAL, "account key: bad point"};
  // nlohmann::json keeps members sorted and dumps without spaces: RFC 7638's canonical form.
  jwk_ = {
      {"crv", "P-256"}, {"kty", "EC"}, {"x", base64url(xs.value())}, {"y", base64url(ys.value())}};
  thumbprint_ = base64url(sha256(jwk_.dump()));
  return {};
}

core::Result<std::string> AccountKey::pem() const {
  gnutls_x509_privkey_t x = nullptr;
  Datum out;
  int rc = gnutls_privkey_export_x509(key_, &x);
  if (rc == 0)
    rc = gnutls_x509_privkey_export2_pkcs8(x, GNUTLS_X509_FMT_PEM, nullptr, GNUTLS_PKCS_PLAIN,
                                           &out.d);
  if (x) gnutls_x509_privkey_deinit(x);
  if (rc != 0) return gnutls_problem("account key export", rc);
  return out.str();
}

core::Result<std::string> AccountKey::sign(std::string_view input) const {
  gnutls_datum_t data = view(input);
  Datum sig;
  if (int rc = gnutls_privkey_sign_data(key_, GNUTLS_DIG_SHA256, 0, &data, &sig.d); rc != 0)
    return gnutls_problem("ES256 signature", rc);
  return der_signature_to_raw(sig.str());
}

core::Result<std::string> sign_request(const AccountKey& key, std::string_view kid,
                                       std::string_view nonce, std::string_view url,
                                       std::string_view payload) {
  nlohmann::json header = {{"alg", "ES256"}, {"nonce", nonce}, {"url", url}};
  if (kid.empty())
    header["jwk"] = key.jwk();
  else
    header["kid"] = kid;
  // The nonce and the kid come from the server's headers: bytes that are not UTF-8 are replaced
  // (the server then refuses the request) rather than thrown on.
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  std::string protected64 = base64url(header.dump(-1, ' ', false, kReplace));
  std::string payload64 = base64url(payload);
  auto sig = key.sign(protected64 + "." + payload64);
  if (!sig) return sig.error();
  nlohmann::json body = {
      {"protected", protected64}, {"payload", payload64}, {"signature", base64url(sig.value())}};
  return body.dump(-1, ' ', false, kReplace);
}

std::string key_authorization(std::string_view token, const AccountKey& key) {
  return std::string(token) + "." + key.thumbprint();
}

core::Result<CertificateRequest> make_certificate_request(const std::vector<std::string>& domains) {
  if (domains.empty()) return core::Error{EINVAL, "no domain to certify"};
  gnutls_x509_privkey_t key = nullptr;
  gnutls_privkey_t signer = nullptr;
  gnutls_x509_crq_t crq = nullptr;
  CertificateRequest out;
  int rc = gnutls_x509_privkey_init(&key);
  if (rc == 0)
    rc = gnutls_x509_privkey_generate(key, GNUTLS_PK_ECDSA,
                                      GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0);
  if (rc == 0) rc = gnutls_x509_crq_init(&crq);
  if (rc == 0) rc = gnutls_x509_crq_set_version(crq, 1);
  if (rc == 0)
    rc = gnutls_x509_crq_set_dn_by_oid(crq, GNUTLS_OID_X520_COMMON_NAME, 0, domains[0].data(),
                                       static_cast<unsigned>(domains[0].size()));
  for (const auto& d : domains)
    if (rc == 0)
      rc = gnutls_x509_crq_set_subject_alt_name(
          crq, GNUTLS_SAN_DNSNAME, d.data(), static_cast<unsigned>(d.size()), GNUTLS_FSAN_APPEND);
  if (rc == 0) rc = gnutls_x509_crq_set_key(crq, key);
  if (rc == 0) rc = gnutls_privkey_init(&signer);
  if (rc == 0) rc = gnutls_privkey_import_x509(signer, key, 0);
  if (rc == 0) rc = gnutls_x509_crq_privkey_sign(crq, signer, GNUTLS_DIG_SHA256, 0);
  Datum der, pem;
  if (rc == 0) rc = gnutls_x509_crq_export2(crq, GNUTLS_X509_FMT_DER, &der.d);
  if (rc == 0)
    rc = gnutls_x509_privkey_export2_pkcs8(key, GNUTLS_X509_FMT_PEM, nullptr, GNUTLS_PKCS_PLAIN,
                                           &pem.d);
  if (crq) gnutls_x509_crq_deinit(crq);
  if (signer) gnutls_privkey_deinit(signer);
  if (key) gnutls_x509_privkey_deinit(key);
  if (rc != 0) return gnutls_problem("certificate request", rc);
  out.csr_der = der.str();
  out.key_pem = pem.str();
  return out;
}

}  // namespace corral::acme
