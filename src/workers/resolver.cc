#include "workers/resolver.h"

#include "workers/link_codec.h"
#include "workers/link_guard.h"

namespace corral::workers {

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

void LinkResolver::on_message(std::string_view text) {
  auto decoded = link::decode(text);
  if (!decoded) return;  // not a message: dropped (the supervisor only sends messages)
  link::Message& message = decoded.value();
  if (auto* forget = std::get_if<link::Forget>(&message)) {
    cache_.erase(forget->address);  // the address's worker stopped, failed or is suspended
    return;
  }
  auto* resolved = std::get_if<link::Resolved>(&message);
  auto* refused = std::get_if<link::Refused>(&message);
  if (!resolved && !refused) return;
  auto it = pending_.find(resolved ? resolved->id : refused->id);
  if (it == pending_.end()) return;
  auto [address, answer] = std::move(it->second);
  pending_.erase(it);
  if (resolved) {
    if (cache_.size() >= kCacheMax) cache_.clear();  // bounded: entries are cheap to get back
    cache_[address] = {resolved->socket, loop_.now() + kCacheMs, resolved->pid};
    answer(std::move(resolved->socket), std::nullopt, {resolved->pid, resolved->cold});
  } else {
    answer({}, error_response(refused->status, refused->error, refused->retry_after_s));
  }
}

void LinkResolver::resolve(const std::string& address, Answer answer, bool fresh) {
  auto c = cache_.find(address);
  if (c != cache_.end()) {
    if (!fresh && c->second.until_ms > loop_.now())
      return answer(c->second.path, std::nullopt, {c->second.pid, false});
    cache_.erase(c);
  }
  if (!link_.open()) {
    answer({}, error_response(503, {{"message", "the supervisor is gone"}}));
    return;
  }
  uint64_t id = next_id_++;
  pending_.emplace(id, std::make_pair(address, std::move(answer)));
  ++sent_;
  link_.send(link::encode(link::Resolve{id, address}));
}

}  // namespace corral::workers
