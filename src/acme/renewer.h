// acme::Renewer: the supervisor's ACME client at work. On its own thread (the HTTP client blocks;
// the supervisor's loop must not), it keeps a certificate for the configured domains in the
// board's directory (<state>/acme: account-key.pem, cert.pem, key.pem, all 0600):
//
//  * at start, a stored certificate that names every domain and is not past two thirds of its
//    life is published at once (the board's version moves: server processes load it);
//  * otherwise, and at two thirds of the life of the current one, it runs an acme::Order with the
//    blocking client (acme/http_client.h), publishing the challenge answers on the board while
//    the CA validates, then writes the key and the chain and publishes them;
//  * a failed order is retried after a backoff (first_retry, doubling, capped at max_retry); the
//    certificate in use, if any, stays in use meanwhile.
//
// Every step is one log line (acme_* events) on its own Logger (same fd and format as the
// supervisor's: a Logger is not shared across threads). Counters are kept for the status line.
// Lifetime: made and start()ed by the supervisor after its first fork (a thread never crosses a
// fork); stop() (or the destructor) wakes the thread and joins it, at most one socket timeout
// later.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "tls/acme_board.h"

namespace corral::acme {

struct RenewerOptions {
  std::string directory_url;
  std::string email;
  std::vector<std::string> domains;
  std::string ca_file;  // trust for the directory's TLS ("": the system's)
  std::vector<std::string> challenge_types{"http-01", "tls-alpn-01"};
  int first_retry_seconds = 30;
  int max_retry_seconds = 6 * 3600;
  int log_fd = 2;
  core::LogLevel log_level = core::LogLevel::kInfo;
  core::LogFormat log_format = core::LogFormat::kText;
};

class Renewer {
 public:
  Renewer(RenewerOptions options, std::shared_ptr<tls::AcmeBoard> board);
  ~Renewer();
  Renewer(const Renewer&) = delete;
  Renewer& operator=(const Renewer&) = delete;

  void start();
  void stop();

  uint64_t orders_succeeded() const { return succeeded_.load(); }
  uint64_t orders_failed() const { return failed_.load(); }

 private:
  void run();
  bool obtain();              // one order; true when a certificate was stored and published
  long renew_in_seconds();    // <= 0: renew now; publishes a usable stored certificate
  bool wait_seconds(long s);  // false: stopping
  core::Result<void> store(const std::string& key_pem, const std::string& chain_pem);

  RenewerOptions options_;
  std::shared_ptr<tls::AcmeBoard> board_;
  core::Logger log_;
  std::string account_key_pem_;
  bool published_ = false;
  std::atomic<uint64_t> succeeded_{0}, failed_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace corral::acme
