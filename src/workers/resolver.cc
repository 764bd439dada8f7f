#include "workers/resolver.h"

#include "core/escape.h"
#include "workers/link_guard.h"

namespace corral::workers {

namespace {

// Typed fields of a link message, never throwing on a wrong type (nlohmann's value() does).
std::string string_field(const nlohmann::json& m, const char* key) {
  auto it = m.find(key);
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}
uint64_t id_field(const nlohmann::json& m) {
  auto it = m.find("id");
  return it != m.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}
// An address's wire form back to its bytes; nullopt for a malformed one.
std::optional<std::string> address_field(const nlohmann::json& m) {
  std::string address;
  if (!core::wire_decode(string_field(m, "address"), address)) return std::nullopt;
  return address;
}

}  // namespace

http::Response error_response(int status, const nlohmann::json& error, uint32_t retry_after_s) {
  nlohmann::json e = error.is_object() ? error : nlohmann::json{{"message", "unavailable"}};
  auto r = http::Response::json({{"error", e}}, status);
  if (retry_after_s > 0) r.header("Retry-After", std::to_string(retry_after_s));
  return r;
}

LinkResolver::LinkResolver(core::EventLoop& loop, core::UniqueFd fd)
    : loop_(loop), link_(loop, std::move(fd)) {
  link_.on_message = [this](std::string_view message) {
    guarded("server", [&] { on_message(message); });
  };
  link_.on_closed = [this] {
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& [id, entry] : pending)
      entry.second({}, error_response(503, {{"message", "the supervisor is gone"}}));
  };
}

void LinkResolver::on_message(std::string_view message) {
  auto m = nlohmann::json::parse(message, nullptr, false);
  if (!m.is_object()) return;
  std::string type = string_field(m, "type");
  if (type == "forget") {  // the address's worker stopped, failed or is suspended
    if (auto address = address_field(m)) cache_.erase(*address);
    return;
  }
  auto it = pending_.find(id_field(m));
  if (it == pending_.end()) return;
  auto [address, answer] = std::move(it->second);
  pending_.erase(it);
  if (type == "resolved") {
    std::string path = string_field(m, "socket");
    if (cache_.size() >= kCacheMax) cache_.clear();  // bounded: entries are cheap to get back
    cache_[address] = {path, loop_.now() + kCacheMs};
    answer(std::move(path), std::nullopt);
  } else {
    auto status = m.find("status");
    auto error = m.find("error");
    auto retry_after = m.find("retryAfter");
    answer({}, error_response(
                   status != m.end() && status->is_number_integer() ? status->get<int>() : 503,
                   error != m.end() ? *error : nlohmann::json(),
                   retry_after != m.end() && retry_after->is_number_unsigned()
                       ? retry_after->get<uint32_t>()
                       : 0));
  }
}

void LinkResolver::resolve(const std::string& address, Answer answer, bool fresh) {
  auto c = cache_.find(address);
  if (c != cache_.end()) {
    if (!fresh && c->second.until_ms > loop_.now()) return answer(c->second.path, std::nullopt);
    cache_.erase(c);
  }
  if (!link_.open()) {
    answer({}, error_response(503, {{"message", "the supervisor is gone"}}));
    return;
  }
  uint64_t id = next_id_++;
  pending_.emplace(id, std::make_pair(address, std::move(answer)));
  ++sent_;
  link_.send(
      nlohmann::json{{"type", "resolve"}, {"id", id}, {"address", core::wire_encode(address)}}
          .dump());
}

}  // namespace corral::workers
