#include "tls/credentials.h"

#include <fcntl.h>
#include <gnutls/abstract.h>
#include <gnutls/crypto.h>
#include <gnutls/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "core/owned_path.h"

namespace corral::tls {

namespace {

core::Error tls_error(const std::string& what, int code) {
  return core::Error{code, what + ": " + gnutls_strerror(code)};
}

// Frees a GnuTLS-allocated datum on scope exit.
struct Datum {
  gnutls_datum_t d{};
  ~Datum() { gnutls_free(d.data); }
};

bool readable_file(const std::string& path, std::string& why) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    why = std::strerror(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
    return false;
  }
  if (::access(path.c_str(), R_OK) != 0) {
    why = std::strerror(errno);
    return false;
  }
  return true;
}

core::Result<std::string> spki_pin(const gnutls_datum_t& der_cert) {
  gnutls_x509_crt_t crt = nullptr;
  gnutls_pubkey_t pub = nullptr;
  std::string out;
  int rc = gnutls_x509_crt_init(&crt);
  if (rc == 0) rc = gnutls_x509_crt_import(crt, &der_cert, GNUTLS_X509_FMT_DER);
  if (rc == 0) rc = gnutls_pubkey_init(&pub);
  if (rc == 0) rc = gnutls_pubkey_import_x509(pub, crt, 0);
  Datum spki;
  if (rc == 0) rc = gnutls_pubkey_export2(pub, GNUTLS_X509_FMT_DER, &spki.d);
  unsigned char digest[32];
  if (rc == 0) rc = gnutls_hash_fast(GNUTLS_DIG_SHA256, spki.d.data, spki.d.size, digest);
  Datum b64;
  gnutls_datum_t raw{digest, sizeof digest};
  if (rc == 0) rc = gnutls_base64_encode2(&raw, &b64.d);
  if (rc == 0) out.assign(reinterpret_cast<const char*>(b64.d.data), b64.d.size);
  if (pub) gnutls_pubkey_deinit(pub);
  if (crt) gnutls_x509_crt_deinit(crt);
  if (rc != 0) return tls_error("certificate public key", rc);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// Writes `data` to `path` through a temporary file and a rename, so a reader never sees half.
core::Result<void> write_file(const std::string& path, const gnutls_datum_t& data, mode_t mode) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return core::errno_error(("create " + tmp).c_str());
  size_t off = 0;
  while (off < data.size) {
    ssize_t n = ::write(fd, data.data + off, data.size - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      auto e = core::errno_error(("write " + tmp).c_str());
      ::close(fd);
      return e;
    }
    off += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return core::errno_error(("rename " + path).c_str());
  return {};
}

// The dev certificate is reused while it parses, names localhost and stays valid for a day more.
bool dev_cert_usable(const CertPaths& p) {
  std::string why;
  if (!readable_file(p.cert, why) || !readable_file(p.key, why)) return false;
  std::ifstream in(p.cert, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  gnutls_datum_t d{reinterpret_cast<unsigned char*>(pem.data()), static_cast<unsigned>(pem.size())};
  gnutls_x509_crt_t crt = nullptr;
  if (gnutls_x509_crt_init(&crt) != 0) return false;
  bool ok = gnutls_x509_crt_import(crt, &d, GNUTLS_X509_FMT_PEM) == 0 &&
            gnutls_x509_crt_get_expiration_time(crt) > std::time(nullptr) + 24 * 3600 &&
            gnutls_x509_crt_check_hostname(crt, "localhost") != 0;
  gnutls_x509_crt_deinit(crt);
  return ok;
}

core::Result<void> make_dev_cert(const CertPaths& p) {
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
  serial[0] = static_cast<unsigned char>((serial[0] & 0x7f) | 0x01);  // positive, 16 bytes
  if (rc == 0) rc = gnutls_x509_crt_set_serial(crt, serial, sizeof serial);
  time_t now = std::time(nullptr);
  // Backdated a little so a client whose clock is slightly behind still accepts it.
  if (rc == 0) rc = gnutls_x509_crt_set_activation_time(crt, now - 3600);
  if (rc == 0) rc = gnutls_x509_crt_set_expiration_time(crt, now + 365 * 24 * 3600);
  if (rc == 0)
    rc = gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, "localhost", 9);
  if (rc == 0)
    rc = gnutls_x509_crt_set_issuer_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, "localhost", 9);
  if (rc == 0)
    rc = gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, "localhost", 9,
                                              GNUTLS_FSAN_APPEND);
  unsigned char v4[4], v6[16];
  inet_pton(AF_INET, "127.0.0.1", v4);
  inet_pton(AF_INET6, "::1", v6);
  if (rc == 0)
    rc = gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_IPADDRESS, v4, sizeof v4,
                                              GNUTLS_FSAN_APPEND);
  if (rc == 0)
    rc = gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_IPADDRESS, v6, sizeof v6,
                                              GNUTLS_FSAN_APPEND);
  // A leaf (CA:FALSE) that clients trust directly with --cacert / cafile.
  if (rc == 0) rc = gnutls_x509_crt_set_basic_constraints(crt, 0, -1);
  if (rc == 0) rc = gnutls_x509_crt_set_key_usage(crt, GNUTLS_KEY_DIGITAL_SIGNATURE);
  if (rc == 0) rc = gnutls_x509_crt_set_key_purpose_oid(crt, GNUTLS_KP_TLS_WWW_SERVER, 0);
  if (rc == 0) rc = gnutls_x509_crt_set_key(crt, key);
  unsigned char kid[64];
  size_t kid_size = sizeof kid;
  if (rc == 0) rc = gnutls_x509_crt_get_key_id(crt, GNUTLS_KEYID_USE_SHA1, kid, &kid_size);
  if (rc == 0) rc = gnutls_x509_crt_set_subject_key_id(crt, kid, kid_size);
  if (rc == 0) rc = gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA256, 0);
  Datum cert_pem, key_pem;
  if (rc == 0) rc = gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &cert_pem.d);
  if (rc == 0)
    rc = gnutls_x509_privkey_export2_pkcs8(key, GNUTLS_X509_FMT_PEM, nullptr, GNUTLS_PKCS_PLAIN,
                                           &key_pem.d);
  if (crt) gnutls_x509_crt_deinit(crt);
  if (key) gnutls_x509_privkey_deinit(key);
  if (rc != 0) return tls_error("dev certificate", rc);
  // The key first: a certificate on disk always has its key next to it.
  if (auto r = write_file(p.key, key_pem.d, 0600); !r) return r;
  return write_file(p.cert, cert_pem.d, 0644);
}

}  // namespace

core::Result<std::shared_ptr<Credentials>> Credentials::load(const std::string& cert_path,
                                                             const std::string& key_path) {
  std::string why;
  if (!readable_file(cert_path, why)) return core::Error{ENOENT, "cert: " + cert_path + ": " + why};
  if (!readable_file(key_path, why)) return core::Error{ENOENT, "key: " + key_path + ": " + why};
  std::shared_ptr<Credentials> c(new Credentials());
  c->cert_path_ = cert_path;
  int rc = gnutls_certificate_allocate_credentials(&c->cred_);
  if (rc != 0) return tls_error("credentials", rc);
  // Loads the whole chain in the PEM file (leaf first) and checks the key matches the leaf.
  rc = gnutls_certificate_set_x509_key_file2(c->cred_, cert_path.c_str(), key_path.c_str(),
                                             GNUTLS_X509_FMT_PEM, nullptr, 0);
  if (rc == GNUTLS_E_CERTIFICATE_KEY_MISMATCH)
    return core::Error{rc, "key: " + key_path + ": does not match the certificate " + cert_path};
  if (rc < 0) return tls_error("cert: " + cert_path + " / key: " + key_path, rc);
  gnutls_datum_t der{};
  rc = gnutls_certificate_get_crt_raw(c->cred_, 0, 0, &der);  // not a copy: not freed
  if (rc != 0) return tls_error("cert: " + cert_path, rc);
  auto pin = spki_pin(der);
  if (!pin) return pin.error();
  c->spki_ = std::move(pin.value());
  return c;
}

core::Result<std::shared_ptr<Credentials>> Credentials::from_memory(const std::string& cert_pem,
                                                                    const std::string& key_pem,
                                                                    const std::string& label) {
  std::shared_ptr<Credentials> c(new Credentials());
  c->cert_path_ = label;
  int rc = gnutls_certificate_allocate_credentials(&c->cred_);
  if (rc != 0) return tls_error("credentials", rc);
  gnutls_datum_t cert{reinterpret_cast<unsigned char*>(const_cast<char*>(cert_pem.data())),
                      static_cast<unsigned>(cert_pem.size())};
  gnutls_datum_t key{reinterpret_cast<unsigned char*>(const_cast<char*>(key_pem.data())),
                     static_cast<unsigned>(key_pem.size())};
  rc = gnutls_certificate_set_x509_key_mem2(c->cred_, &cert, &key, GNUTLS_X509_FMT_PEM, nullptr, 0);
  if (rc < 0) return tls_error(label, rc);
  gnutls_datum_t der{};
  rc = gnutls_certificate_get_crt_raw(c->cred_, 0, 0, &der);
  if (rc != 0) return tls_error(label, rc);
  auto pin = spki_pin(der);
  if (!pin) return pin.error();
  c->spki_ = std::move(pin.value());
  return c;
}

Credentials::~Credentials() {
  if (cred_) gnutls_certificate_free_credentials(cred_);
}

core::Result<std::shared_ptr<TicketKey>> TicketKey::generate() {
  std::shared_ptr<TicketKey> k(new TicketKey());
  if (int rc = gnutls_session_ticket_key_generate(&k->key_); rc != 0)
    return tls_error("session ticket key", rc);
  return k;
}

TicketKey::~TicketKey() {
  if (key_.data) {
    gnutls_memset(key_.data, 0, key_.size);
    gnutls_free(key_.data);
  }
}

core::Result<CertPaths> ensure_dev_cert(const std::string& dir) {
  // Someone else's directory or key would be adopted as ours: refused (core/owned_path.h).
  if (auto r = core::ensure_owned_dir(dir); !r) return r.error();
  CertPaths p{dir + "/dev-cert.pem", dir + "/dev-key.pem"};
  for (const auto& path : {p.key, p.cert})
    if (auto r = core::check_owned_if_present(path); !r) return r.error();
  if (dev_cert_usable(p)) return p;
  if (auto r = make_dev_cert(p); !r) return r.error();
  return p;
}

}  // namespace corral::tls
