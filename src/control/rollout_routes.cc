#include "control/rollout_routes.h"

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace corral::control {

namespace {

// Response::json never throws (U+FFFD for a string that is not UTF-8; addresses are in their
// wire form, which is lossless).
http::Response json_response(const nlohmann::json& j, int status) {
  return http::Response::json(j, status);
}

http::Response error_response(int status, std::string message, const char* code) {
  return json_response({{"error", {{"message", std::move(message)}, {"code", code}}}}, status);
}

// The deferred answer to one POST: answered when the rollout is done, unless the client went
// away first (then the rollout goes on and its report is dropped).
class RolloutCall final : public http::DeferredProducer {
 public:
  RolloutCall(workers::Rollouts& rollouts, std::string kind, std::optional<std::string> to)
      : rollouts_(rollouts), kind_(std::move(kind)), to_(std::move(to)) {}
  ~RolloutCall() override { waiter_->responder = nullptr; }

  void start(http::Responder& r) override {
    waiter_->responder = &r;
    rollouts_.rollout(kind_, std::move(to_),
                      [w = waiter_](const workers::RolloutReport* report,
                                    const workers::RolloutRefusal* refusal) {
                        if (!w->responder) return;
                        auto* r = std::exchange(w->responder, nullptr);
                        if (report)
                          r->respond(json_response(report->to_json(), 200));
                        else
                          r->respond(json_response({{"error", refusal->error}}, refusal->status));
                      });
  }
  void on_abort() override { waiter_->responder = nullptr; }

 private:
  // What the rollout's callback, which may come after this call is gone, finds of it. shared:
  // Rollouts holds the callback until the rollout is done, however long the call lives.
  struct Waiter {
    http::Responder* responder = nullptr;
  };
  workers::Rollouts& rollouts_;
  std::string kind_;
  std::optional<std::string> to_;
  std::shared_ptr<Waiter> waiter_ = std::make_shared<Waiter>();
};

// The body: empty (or blank), or {"to": "VERSION"}; nullopt in `error` for anything else.
bool parse_target(std::string_view body, std::optional<std::string>& to, std::string& error) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return true;
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    error = "The body is empty or a JSON object {\"to\": \"VERSION\"}.";
    return false;
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "to") {
      error = "Unknown member '" + key + "': the body is {\"to\": \"VERSION\"}.";
      return false;
    }
    if (value.is_null()) continue;
    if (!value.is_string()) {
      error = "\"to\" is a version (a string).";
      return false;
    }
    to = value.get<std::string>();
  }
  return true;
}

}  // namespace

void add_rollout_routes(http::SiteBuilder& site, workers::Rollouts& rollouts) {
  site.route("GET /workers/kinds",
             [&rollouts](http::Request&) { return json_response(rollouts.state(), 200); });
  site.route("POST /workers/kinds/{kind}/rollout", [&rollouts](http::Request& req) {
    std::optional<std::string> to;
    std::string error;
    if (!parse_target(req.body, to, error)) return error_response(400, error, "bad_request");
    return http::Response::deferred(
        std::make_unique<RolloutCall>(rollouts, std::string(req.param("kind")), std::move(to)));
  });
}

}  // namespace corral::control
