#include "acme/order.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

namespace corral::acme {

namespace {

constexpr char kBadNonce[] = "urn:ietf:params:acme:error:badNonce";

// The JSON object of an answer's body, or null when it is not one.
nlohmann::json parse_object(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json();
}

std::string string_member(const nlohmann::json& j, const char* name) {
  if (!j.is_object()) return {};
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool success(int status) {
  return status >= 200 && status < 300;
}

// JSON text that never throws: bytes that are not UTF-8 (a server's) are replaced.
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

Order::Order(OrderOptions options, const AccountKey& key, std::string csr_der)
    : options_(std::move(options)),
      key_(key),
      csr_der_(std::move(csr_der)),
      account_url_(options_.account_url) {}

std::string Order::problem(const Response& r) {
  auto j = parse_object(r.body);
  std::string type = string_member(j, "type");
  std::string detail = string_member(j, "detail");
  std::string out = fmt::format("HTTP {}", r.status);
  if (!type.empty()) out += " " + type;
  if (!detail.empty()) out += ": " + detail;
  if (j.is_object() && j.contains("subproblems") && j["subproblems"].is_array())
    for (const auto& sub : j["subproblems"]) {
      std::string id = sub.is_object() && sub.contains("identifier")
                           ? string_member(sub["identifier"], "value")
                           : std::string();
      out += fmt::format(" [{}{}{}]", id, id.empty() ? "" : ": ", string_member(sub, "detail"));
    }
  return out;
}

void Order::fail(std::string why) {
  state_ = State::kFailed;
  error_ = std::move(why);
}

int Order::retry_after(const Response& r) const {
  if (r.retry_after.empty()) return 1;
  char* end = nullptr;
  long v = std::strtol(r.retry_after.c_str(), &end, 10);
  if (end == r.retry_after.c_str() || v < 0) return 1;  // an HTTP-date: soon
  return static_cast<int>(std::min<long>(std::max<long>(v, 1), kMaxRetryAfter));
}

Step Order::send(std::string what, const std::string& url,
                 const std::optional<nlohmann::json>& payload) {
  Step s;
  s.kind = Step::kSend;
  s.what = std::move(what);
  s.request.method = "POST";
  s.request.url = url;
  bool with_jwk = state_ == State::kAccount;
  auto body = sign_request(key_, with_jwk ? std::string_view() : account_url_, nonce_, url,
                           payload ? dump(*payload) : std::string());
  if (!body) {
    fail("signing " + s.what + ": " + body.error().reason);
    return next();
  }
  nonce_.clear();  // each nonce is good for one request
  s.request.body = std::move(body.value());
  return s;
}

Step Order::next() {
  switch (state_) {
    case State::kDirectory: {
      Step s;
      s.what = "directory";
      s.request = {"GET", options_.directory_url, {}};
      return s;
    }
    case State::kNonce: {
      Step s;
      s.what = "newNonce";
      s.request = {"HEAD", new_nonce_url_, {}};
      return s;
    }
    case State::kAccount: {
      nlohmann::json payload = {{"termsOfServiceAgreed", true}};
      if (!options_.email.empty())
        payload["contact"] = nlohmann::json::array({"mailto:" + options_.email});
      return send("newAccount", new_account_url_, payload);
    }
    case State::kNewOrder: {
      nlohmann::json ids = nlohmann::json::array();
      for (const auto& d : options_.domains) ids.push_back({{"type", "dns"}, {"value", d}});
      return send("newOrder", new_order_url_, nlohmann::json{{"identifiers", ids}});
    }
    case State::kAuthorization:
    case State::kPollAuthorization:
      return send("authorization", authorizations_[authz_], std::nullopt);
    case State::kPublish: {
      published_.push_back(answer_);
      Step s;
      s.kind = Step::kPublish;
      s.what = answer_.type;
      s.answers = published_;
      state_ = State::kRespond;
      return s;
    }
    case State::kRespond:
      return send("challenge", challenge_url_, nlohmann::json::object());
    case State::kPollWait:
    case State::kOrderWait: {
      Step s;
      s.kind = Step::kWait;
      s.what = state_ == State::kPollWait ? "authorization" : "order";
      s.wait_seconds = wait_;
      state_ = state_ == State::kPollWait ? State::kPollAuthorization : State::kPollOrder;
      return s;
    }
    case State::kFinalize:
      return send("finalize", finalize_url_, nlohmann::json{{"csr", base64url(csr_der_)}});
    case State::kPollOrder:
      return send("order", order_url_, std::nullopt);
    case State::kCertificate:
      return send("certificate", certificate_url_, std::nullopt);
    case State::kDone: {
      Step s;
      s.kind = Step::kDone;
      s.what = "certificate";
      s.certificate_pem = certificate_;
      return s;
    }
    case State::kFailed:
      break;
  }
  Step s;
  s.kind = Step::kFailed;
  s.error = error_;
  return s;
}

void Order::on_transport_error(const std::string& why) {
  fail(why);
}

void Order::take_order(const nlohmann::json& order) {
  std::string status = string_member(order, "status");
  if (order.contains("authorizations") && order["authorizations"].is_array()) {
    authorizations_.clear();
    for (const auto& a : order["authorizations"])
      if (a.is_string()) authorizations_.push_back(a.get<std::string>());
  }
  if (auto f = string_member(order, "finalize"); !f.empty()) finalize_url_ = f;
  if (auto c = string_member(order, "certificate"); !c.empty()) certificate_url_ = c;
  if (status == "valid" && !certificate_url_.empty()) {
    state_ = State::kCertificate;
  } else if (status == "invalid") {
    fail("order invalid: " + (order.contains("error") ? dump(order["error"]) : "no reason"));
  } else if (status == "pending") {
    if (authorizations_.empty()) return fail("order pending without authorizations");
    authz_ = 0;
    state_ = State::kAuthorization;
  } else if (status == "ready") {
    if (finalize_url_.empty()) return fail("order ready without a finalize URL");
    state_ = State::kFinalize;
  } else if (status == "processing") {
    state_ = State::kOrderWait;
  } else {
    fail("order with status \"" + status + "\"");
  }
}

void Order::after_authorization(const nlohmann::json& authz) {
  std::string status = string_member(authz, "status");
  std::string domain =
      authz.contains("identifier") ? string_member(authz["identifier"], "value") : std::string();
  if (status == "valid") {
    if (++authz_ < authorizations_.size()) {
      state_ = State::kAuthorization;
    } else {
      state_ = State::kFinalize;
      polls_ = 0;
      if (finalize_url_.empty()) fail("no finalize URL");
    }
    return;
  }
  const nlohmann::json* challenges = authz.contains("challenges") && authz["challenges"].is_array()
                                         ? &authz["challenges"]
                                         : nullptr;
  if (status == "invalid" || status == "deactivated" || status == "expired" ||
      status == "revoked") {
    std::string why;
    if (challenges)
      for (const auto& c : *challenges)
        if (c.is_object() && c.contains("error")) why += " " + dump(c["error"]);
    return fail(fmt::format("authorization for {} {}{}", domain, status, why));
  }
  if (status != "pending") return fail(fmt::format("authorization with status \"{}\"", status));
  if (state_ == State::kPollAuthorization) {  // still pending after we answered
    if (++polls_ > options_.max_polls) return fail("authorization for " + domain + " timed out");
    state_ = State::kPollWait;
    return;
  }
  if (!challenges) return fail("authorization for " + domain + " without challenges");
  for (const auto& type : options_.challenge_types)
    for (const auto& c : *challenges) {
      if (string_member(c, "type") != type) continue;
      std::string token = string_member(c, "token");
      std::string url = string_member(c, "url");
      // A token is base64url (RFC 8555 §8.1): anything else never reaches a path or a file.
      if (token.empty() || url.empty() || !base64url_decode(token)) continue;
      answer_ = {type, domain, token, key_authorization(token, key_)};
      challenge_url_ = url;
      polls_ = 0;
      state_ = State::kPublish;
      return;
    }
  fail("authorization for " + domain + ": no challenge of an accepted type");
}

void Order::on_response(const Response& r) {
  if (!r.replay_nonce.empty()) nonce_ = r.replay_nonce;
  if (state_ == State::kDone || state_ == State::kFailed) return;
  if (!success(r.status)) {
    auto j = parse_object(r.body);
    if (string_member(j, "type") == kBadNonce && !nonce_.empty() && ++bad_nonces_ <= kMaxBadNonce)
      return;  // the same state: next() signs the same request with the fresh nonce
    return fail(problem(r));
  }
  bad_nonces_ = 0;
  switch (state_) {
    case State::kDirectory: {
      auto j = parse_object(r.body);
      new_nonce_url_ = string_member(j, "newNonce");
      new_account_url_ = string_member(j, "newAccount");
      new_order_url_ = string_member(j, "newOrder");
      if (new_nonce_url_.empty() || new_account_url_.empty() || new_order_url_.empty())
        return fail("directory without newNonce, newAccount or newOrder");
      state_ = State::kNonce;
      return;
    }
    case State::kNonce:
      if (nonce_.empty()) return fail("newNonce without a Replay-Nonce");
      state_ = account_url_.empty() ? State::kAccount : State::kNewOrder;
      return;
    case State::kAccount:
      if (r.location.empty()) return fail("newAccount without a Location");
      account_url_ = r.location;
      state_ = State::kNewOrder;
      return;
    case State::kNewOrder:
      if (r.location.empty()) return fail("newOrder without a Location");
      order_url_ = r.location;
      return take_order(parse_object(r.body));
    case State::kAuthorization:
    case State::kPollAuthorization:
      return after_authorization(parse_object(r.body));
    case State::kRespond:
      wait_ = retry_after(r);
      state_ = State::kPollWait;
      return;
    case State::kFinalize:
    case State::kPollOrder: {
      auto j = parse_object(r.body);
      std::string status = string_member(j, "status");
      if (status == "processing" || status == "ready" || status == "pending") {
        if (++polls_ > options_.max_polls) return fail("order timed out");
        if (status == "ready" && state_ == State::kPollOrder) {
          state_ = State::kFinalize;
          return;
        }
        wait_ = retry_after(r);
        state_ = State::kOrderWait;
        return;
      }
      return take_order(j);
    }
    case State::kCertificate:
      if (r.body.find("-----BEGIN CERTIFICATE-----") == std::string::npos)
        return fail("certificate download is not PEM");
      certificate_ = r.body;
      state_ = State::kDone;
      return;
    default:
      return;
  }
}

}  // namespace corral::acme
