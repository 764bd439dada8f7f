#include "acme/renewer.h"

#include <fcntl.h>
#include <gnutls/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>

#include "acme/http_client.h"
#include "acme/order.h"

namespace corral::acme {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Through a temporary file and a rename, 0600: a reader never sees half of it.
core::Result<void> write_private(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return core::errno_error(("create " + tmp).c_str());
  ::fchmod(fd, 0600);
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      auto e = core::errno_error(("write " + tmp).c_str());
      ::close(fd);
      return e;
    }
    off += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return core::errno_error(("rename " + path).c_str());
  return {};
}

std::string iso(time_t t) {
  char buf[32];
  return std::string(buf, core::format_iso8601(t, buf));
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

}  // namespace

Renewer::Renewer(RenewerOptions options, std::shared_ptr<tls::AcmeBoard> board)
    : options_(std::move(options)),
      board_(std::move(board)),
      log_(options_.log_fd, options_.log_level) {
  log_.set_format(options_.log_format);
}

Renewer::~Renewer() {
  stop();
}

void Renewer::start() {
  thread_ = std::thread([this] { run(); });
}

void Renewer::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Renewer::wait_seconds(long s) {
  std::unique_lock<std::mutex> lock(mutex_);
  return !wake_.wait_for(lock, std::chrono::seconds(s), [this] { return stopping_; });
}

long Renewer::renew_in_seconds() {
  std::string pem = read_file(board_->cert_path());
  if (pem.empty()) return 0;
  gnutls_x509_crt_t crt = nullptr;
  gnutls_datum_t d{reinterpret_cast<unsigned char*>(pem.data()), static_cast<unsigned>(pem.size())};
  if (gnutls_x509_crt_init(&crt) != 0) return 0;
  long in = 0;
  if (gnutls_x509_crt_import(crt, &d, GNUTLS_X509_FMT_PEM) == 0) {
    bool names_all = true;
    for (const auto& domain : options_.domains)
      names_all = names_all && gnutls_x509_crt_check_hostname(crt, domain.c_str()) != 0;
    time_t from = gnutls_x509_crt_get_activation_time(crt);
    time_t until = gnutls_x509_crt_get_expiration_time(crt);
    time_t renew_at = from + (until - from) * 2 / 3;
    time_t now = std::time(nullptr);
    if (!names_all) {
      log_.info("acme_certificate_stale", "reason=\"does not name every domain\" domains={}",
                joined(options_.domains));
    } else if (now < until) {
      if (!published_) {  // good enough to serve while a renewal runs
        board_->publish_certificate();
        published_ = true;
        log_.info("acme_certificate_loaded", "path={} not_after={} renew_at={}",
                  board_->cert_path(), iso(until), iso(renew_at));
      } else if (renew_at > now) {
        log_.info("acme_renewal_scheduled", "not_after={} renew_at={}", iso(until), iso(renew_at));
      }
      in = renew_at - now;
    }
  }
  gnutls_x509_crt_deinit(crt);
  return in;
}

core::Result<void> Renewer::store(const std::string& key_pem, const std::string& chain_pem) {
  // The key first: the certificate on disk always has its key next to it (a server process reads
  // both only after the version moves, which is after both renames).
  if (auto r = write_private(board_->key_path(), key_pem); !r) return r;
  return write_private(board_->cert_path(), chain_pem);
}

bool Renewer::obtain() {
  auto key = AccountKey::from_pem(account_key_pem_);
  if (!key) {
    log_.error("acme_order_failed", "error=\"{}\"", key.error().reason);
    return false;
  }
  auto request = make_certificate_request(options_.domains);
  if (!request) {
    log_.error("acme_order_failed", "error=\"{}\"", request.error().reason);
    return false;
  }
  OrderOptions oo;
  oo.directory_url = options_.directory_url;
  oo.email = options_.email;
  oo.domains = options_.domains;
  oo.challenge_types = options_.challenge_types;
  Order order(oo, key.value(), request->csr_der);
  HttpClientOptions client;
  client.ca_file = options_.ca_file;
  log_.info("acme_order_start", "directory={} domains={} challenges={}", options_.directory_url,
            joined(options_.domains), joined(options_.challenge_types));
  for (;;) {
    Step step = order.next();
    switch (step.kind) {
      case Step::kSend: {
        log_.debug("acme_request", "what={} method={} url={}", step.what, step.request.method,
                   step.request.url);
        auto response = http_request(step.request, client);
        if (!response) {
          order.on_transport_error(step.what + ": " + response.error().reason);
        } else {
          if (response->status >= 400)
            log_.info("acme_response", "what={} status={} type=\"{}\"", step.what, response->status,
                      response->content_type);
          order.on_response(response.value());
        }
        break;
      }
      case Step::kPublish: {
        std::vector<tls::AcmeBoard::Answer> answers;
        for (const auto& a : step.answers)
          answers.push_back({a.type, a.domain, a.token, a.key_authorization});
        board_->publish_answers(answers);
        const auto& a = step.answers.back();
        log_.info("acme_challenge", "type={} domain={} token={}", a.type, a.domain, a.token);
        break;
      }
      case Step::kWait:
        if (!wait_seconds(step.wait_seconds)) {
          board_->publish_answers({});
          return false;
        }
        break;
      case Step::kDone: {
        board_->publish_answers({});
        if (auto r = store(request->key_pem, step.certificate_pem); !r) {
          log_.error("acme_order_failed", "error=\"store: {}\"", r.error().reason);
          return false;
        }
        board_->publish_certificate();
        published_ = true;
        log_.info("acme_certificate_issued", "domains={} path={} account={}",
                  joined(options_.domains), board_->cert_path(), order.account_url());
        return true;
      }
      case Step::kFailed:
        board_->publish_answers({});
        log_.error("acme_order_failed", "domains={} error=\"{}\"", joined(options_.domains),
                   step.error);
        return false;
    }
  }
}

void Renewer::run() {
  std::string key_path = board_->dir() + "/account-key.pem";
  account_key_pem_ = read_file(key_path);
  if (account_key_pem_.empty() || !AccountKey::from_pem(account_key_pem_)) {
    auto key = AccountKey::generate();
    auto pem = key ? key->pem() : core::Result<std::string>(key.error());
    if (!pem || !write_private(key_path, pem.value())) {
      log_.error("acme_account_key_failed", "path={}", key_path);
      return;
    }
    account_key_pem_ = pem.value();
    log_.info("acme_account_key", "path={} created=true", key_path);
  }
  long backoff = options_.first_retry_seconds;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    long in = renew_in_seconds();
    if (in > 0) {
      if (!wait_seconds(in)) return;
      continue;
    }
    if (obtain()) {
      ++succeeded_;
      backoff = options_.first_retry_seconds;
      continue;
    }
    ++failed_;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    log_.info("acme_retry", "in_seconds={}", backoff);
    if (!wait_seconds(backoff)) return;
    backoff = std::min<long>(backoff * 2, options_.max_retry_seconds);
  }
}

}  // namespace corral::acme
