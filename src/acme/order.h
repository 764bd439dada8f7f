// acme::Order: one certificate order against an ACME server (RFC 8555 §7), sans-IO. It is told the
// server's answers and says what to do next: send this request, publish these challenge answers,
// wait this long, or stop with a certificate or a problem. The caller (acme::Renewer) owns the
// sockets and the clock; tests and the fuzzer drive it with canned answers.
//
// The flow: GET the directory; HEAD newNonce; newAccount (JWS with the JWK; the Location is the
// account's kid, kept for the later requests); newOrder for the domains; per authorization: fetch
// it, pick the first challenge type the caller accepts (http-01, tls-alpn-01), publish its key
// authorization, tell the server to validate, poll the authorization; finalize with a CSR; poll
// the order; download the certificate chain (PEM).
//
// Every answer's Replay-Nonce is kept for the next JWS. A badNonce problem repeats the same request
// with the fresh nonce (up to kMaxBadNonce times in a row); Retry-After on a poll is honoured
// (bounded); any other error status ends the order with the server's problem document (type,
// detail, subproblems) in Step::error. Lifetime: one order; one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "acme/jws.h"

namespace corral::acme {

struct Request {
  std::string method;  // GET, HEAD, POST
  std::string url;
  std::string body;  // the JWS (POST), application/jose+json
};

struct Response {
  int status = 0;
  std::string location;
  std::string replay_nonce;
  std::string retry_after;  // seconds (an HTTP-date is taken as "soon")
  std::string content_type;
  std::string body;
};

// A challenge answer the server processes must give while the order validates it.
struct ChallengeAnswer {
  std::string type;  // "http-01" or "tls-alpn-01"
  std::string domain;
  std::string token;
  std::string key_authorization;
};

struct OrderOptions {
  std::string directory_url;
  std::string email;  // "" : no contact
  std::vector<std::string> domains;
  // The challenge types to answer, by preference.
  std::vector<std::string> challenge_types{"http-01", "tls-alpn-01"};
  std::string account_url;  // known from an earlier run: newAccount is skipped
  int max_polls = 60;       // per authorization and for the order
};

struct Step {
  enum Kind { kSend, kPublish, kWait, kDone, kFailed } kind = kSend;
  Request request;                       // kSend
  std::vector<ChallengeAnswer> answers;  // kPublish: what to serve (replaces what was served)
  int wait_seconds = 0;                  // kWait: then call next() again
  std::string certificate_pem;           // kDone: the chain, leaf first
  std::string error;                     // kFailed: one line for the log
  std::string what;                      // what this step is, for the log ("newOrder")
};

class Order {
 public:
  static constexpr int kMaxBadNonce = 5;
  static constexpr int kMaxRetryAfter = 60;  // seconds: a longer Retry-After is cut to this

  // `key` outlives the order; `csr_der` is the request to finalize with.
  Order(OrderOptions options, const AccountKey& key, std::string csr_der);

  // What to do now. After kSend, call on_response() with the answer (or on_transport_error());
  // after kPublish and kWait, call next() again. kDone and kFailed are final.
  Step next();
  void on_response(const Response& response);
  void on_transport_error(const std::string& why);

  const std::string& account_url() const { return account_url_; }  // known after newAccount

 private:
  enum class State {
    kDirectory,
    kNonce,
    kAccount,
    kNewOrder,
    kAuthorization,  // fetching authorizations_[authz_]
    kPublish,        // the answer of authz_ to publish
    kRespond,        // POST {} to the challenge
    kPollWait,       // wait, then poll authz_ again
    kPollAuthorization,
    kFinalize,
    kOrderWait,
    kPollOrder,
    kCertificate,
    kDone,
    kFailed
  };
  Step send(std::string what, const std::string& url, const std::optional<nlohmann::json>& payload);
  void fail(std::string why);
  // The problem document of an error answer, as one line: "type: detail (subproblems)".
  static std::string problem(const Response& r);
  void take_order(const nlohmann::json& order);
  void after_authorization(const nlohmann::json& authz);
  int retry_after(const Response& r) const;

  OrderOptions options_;
  const AccountKey& key_;
  std::string csr_der_;
  State state_ = State::kDirectory;
  std::string nonce_;
  std::string new_nonce_url_, new_account_url_, new_order_url_;
  std::string account_url_;
  std::string order_url_, finalize_url_, certificate_url_;
  std::vector<std::string> authorizations_;
  size_t authz_ = 0;
  ChallengeAnswer answer_;
  std::string challenge_url_;
  std::vector<ChallengeAnswer> published_;
  int polls_ = 0;
  int wait_ = 0;
  int bad_nonces_ = 0;
  std::string certificate_;
  std::string error_;
};

}  // namespace corral::acme
