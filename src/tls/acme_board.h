// AcmeBoard: what the supervisor's ACME renewer tells every server process, through one small
// shared memory mapping made before the first fork (so every process of every generation sees
// the same pages): the challenge answers to give while a CA validates (HTTP-01 on
// /.well-known/acme-challenge/<token>, TLS-ALPN-01 by ALPN "acme-tls/1" and SNI), and the version
// of the certificate in <state>/acme (cert.pem, key.pem): a server process whose TLS config sees a
// newer version loads those files for its next handshakes, with no restart and no message.
//
// One writer (the renewer's thread in the supervisor), readers in every server process. The
// answers are guarded by a sequence lock (a reader copies, then checks the sequence did not move);
// the certificate version is an atomic the writer bumps after the files are renamed into place.
// Lifetime: shared_ptr (Options, the TLS configs, the site's route); the mapping is unmapped when
// the last holder in a process goes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace corral::tls {

inline constexpr char kAcmeTlsAlpn[] = "acme-tls/1";

class AcmeBoard {
 public:
  struct Answer {
    std::string type;  // "http-01" or "tls-alpn-01"
    std::string domain;
    std::string token;
    std::string key_authorization;
  };
  static constexpr size_t kMaxAnswers = 32;

  // `dir`: where the renewer keeps cert.pem and key.pem. `refuse_until_issued`: TLS handshakes
  // (other than acme-tls/1) fail until a certificate is published, instead of getting the dev one.
  static core::Result<std::shared_ptr<AcmeBoard>> create(std::string dir, bool refuse_until_issued);
  ~AcmeBoard();
  AcmeBoard(const AcmeBoard&) = delete;
  AcmeBoard& operator=(const AcmeBoard&) = delete;

  const std::string& dir() const { return dir_; }
  std::string cert_path() const { return dir_ + "/cert.pem"; }
  std::string key_path() const { return dir_ + "/key.pem"; }
  bool refuse_until_issued() const { return refuse_until_issued_; }

  // Writer side. Answers that do not fit (too many, or a field too long) are dropped.
  void publish_answers(const std::vector<Answer>& answers);
  void publish_certificate();  // the files in dir() are a new certificate: bump the version

  // Reader side.
  uint64_t certificate_version() const;
  std::optional<std::string> http01(std::string_view token) const;
  std::optional<std::string> tls_alpn01(std::string_view domain) const;

 private:
  struct Shared;
  AcmeBoard() = default;
  std::optional<std::string> find(std::string_view type, std::string_view domain,
                                  std::string_view token) const;
  Shared* shared_ = nullptr;
  std::string dir_;
  bool refuse_until_issued_ = false;
};

}  // namespace corral::tls
