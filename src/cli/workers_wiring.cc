#include "cli/workers_wiring.h"

#include <nlohmann/json.hpp>

#include "http/proxy.h"
#include "ws/handshake.h"

namespace corral::cli {

http::Response error_response(int status, const nlohmann::json& error) {
  nlohmann::json e = error.is_object() ? error : nlohmann::json{{"message", "unavailable"}};
  return http::Response::json({{"error", e}}, status);
}

LinkResolver::LinkResolver(core::EventLoop& loop, core::UniqueFd fd)
    : loop_(loop), link_(loop, std::move(fd)) {
  link_.on_message = [this](std::string_view message) {
    auto m = nlohmann::json::parse(message, nullptr, false);
    if (!m.is_object() || !m.contains("id")) return;
    auto it = pending_.find(m.value("id", uint64_t{0}));
    if (it == pending_.end()) return;
    auto answer = std::move(it->second);
    pending_.erase(it);
    if (m.value("type", "") == "resolved") {
      std::string path = m.value("socket", "");
      if (m.contains("address")) cache_[m.value("address", "")] = {path, loop_.now() + kCacheMs};
      answer(std::move(path), std::nullopt);
    } else {
      answer({}, error_response(m.value("status", 503), m.value("error", nlohmann::json())));
    }
  };
  link_.on_closed = [this] {
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& [id, answer] : pending)
      answer({}, error_response(503, {{"message", "the supervisor is gone"}}));
  };
}

void LinkResolver::resolve(const std::string& address, Answer answer, bool fresh) {
  auto c = cache_.find(address);
  if (c != cache_.end()) {
    if (!fresh && c->second.until_ms > loop_.now()) return answer(c->second.path, std::nullopt);
    cache_.erase(c);
  }
  if (cache_.size() > 4096) cache_.clear();  // bounded: entries are cheap to get back
  if (!link_.open()) {
    answer({}, error_response(503, {{"message", "the supervisor is gone"}}));
    return;
  }
  uint64_t id = next_id_++;
  pending_[id] = std::move(answer);
  link_.send(nlohmann::json{{"type", "resolve"}, {"id", id}, {"address", address}}.dump());
}

void add_worker_proxy_routes(http::SiteBuilder& site, const std::vector<WorkerKind>& kinds,
                             std::shared_ptr<ResolverSlot> slot) {
  for (const auto& kind : kinds) {
    for (const auto& pattern : kind.routes) {
      site.route(pattern, [slot, name = kind.name](http::Request& req) -> http::Response {
        std::string address = name;
        for (const auto& p : req.params) address.append(":").append(p.value);
        if (!slot->resolver) return error_response(503, {{"message", "workers are not available"}});
        // A WebSocket upgrade passes the ws component's checks (Origin above all) before it is
        // relayed to the worker, which answers the handshake itself.
        if (req.header("upgrade")) {
          auto h = ws::check_handshake(req, {});
          if (h.status) return ws::refusal(h);
        }
        http::ProxyOptions options;
        options.pool = slot->pool;
        options.target = "/" + req.wildcard;
        if (!req.query.empty()) options.target.append("?").append(req.query);
        options.add_headers = {{"Corral-Remote-Address", req.remote_address},
                               {"Corral-Address", address}};
        if (req.principal) options.add_headers.emplace_back("Corral-Principal", req.principal->id);
        // The worker sees the part of the path the route's '*' matched ("/doc/42/edit" with
        // "/doc/{id}/*" -> "/edit"), with the query: its routes are relative to its address.
        LinkResolver* resolver = slot->resolver;
        return http::proxy_found(
            req,
            [resolver, address](http::UpstreamAnswer answer) {
              resolver->resolve(address,
                                [answer](std::string path, std::optional<http::Response> instead) {
                                  answer(std::move(path), std::move(instead));
                                });
            },
            std::move(options));
      });
    }
  }
}

std::vector<workers::KindConfig> kind_configs(const std::vector<WorkerKind>& kinds) {
  std::vector<workers::KindConfig> out;
  for (const auto& k : kinds) {
    workers::KindConfig c;
    c.name = k.name;
    c.command = k.command;
    c.env = k.env;
    c.routes = k.routes;
    c.idle_ms = k.idle_ms;
    c.start_timeout_ms = k.start_timeout_ms;
    c.stop_grace_ms = k.stop_grace_ms;
    out.push_back(std::move(c));
  }
  return out;
}

void serve_link(core::MessageLink& link, workers::Manager** manager, int slot,
                std::shared_ptr<ProcessReports> reports) {
  // The link dies with its server process; answers that come later are dropped, and so is what
  // it reported.
  auto alive = std::make_shared<core::MessageLink*>(&link);
  link.on_closed = [alive, slot, reports] {
    *alive = nullptr;
    if (reports) reports->by_slot.erase(slot);
  };
  link.on_message = [alive, manager, slot, reports](std::string_view message) {
    auto m = nlohmann::json::parse(message, nullptr, false);
    if (!m.is_object()) return;
    if (m.value("type", "") == "report") {
      if (reports) {
        m.erase("type");
        reports->by_slot[slot] = std::move(m);
      }
      return;
    }
    if (m.value("type", "") != "resolve") return;
    uint64_t id = m.value("id", uint64_t{0});
    std::string address = m.value("address", "");
    auto reply = [alive, id, address](const workers::Resolution& r) {
      if (!*alive) return;
      if (r.ok()) {
        (*alive)->send(
            nlohmann::json{{"type", "resolved"}, {"id", id}, {"socket", r.socket_path}}.dump());
      } else {
        (*alive)->send(nlohmann::json{
            {"type", "refused"}, {"id", id}, {"status", r.status}, {"error", r.error}}
                           .dump());
      }
    };
    if (!*manager) {
      reply({{}, 503, {{"message", "workers are not available"}}});
      return;
    }
    (*manager)->resolve(address, reply);
  };
}

}  // namespace corral::cli
