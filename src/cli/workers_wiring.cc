#include "cli/workers_wiring.h"

#include <nlohmann/json.hpp>
#include <set>

#include "core/escape.h"
#include "proxy/proxy.h"
#include "ws/handshake.h"

namespace corral::cli {

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

// The last resort at a link boundary: a handler's exception is logged on stderr (escaped) and
// the message dropped, rather than reaching std::terminate and taking the process down.
template <typename F>
void guarded(std::string_view where, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    core::Logger log(2);
    log.error("link_message_failed", "where={} error=\"{}\"", where, e.what());
  } catch (...) {
    core::Logger log(2);
    log.error("link_message_failed", "where={} error=\"unknown exception\"", where);
  }
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
        proxy::ProxyOptions options;
        options.pool = slot->pool;
        options.target = "/" + req.wildcard;
        if (!req.query.empty()) options.target.append("?").append(req.query);
        options.extra_headers.reserve(96);
        options.add_header("Corral-Remote-Address", req.remote_address)
            .add_header("Corral-Address", core::wire_encode(address));
        if (req.principal) options.add_header("Corral-Principal", req.principal->id);
        // The worker sees the part of the path the route's '*' matched ("/doc/42/edit" with
        // "/doc/{id}/*" -> "/edit"), with the query: its routes are relative to its address.
        LinkResolver* resolver = slot->resolver;
        return proxy::proxy_found(
            req,
            [resolver, address](proxy::UpstreamAnswer answer, bool again) {
              // Again: the socket it gave last time did not answer (a stale cached path to a
              // stopped worker, or one that went away): ask the supervisor, not the cache.
              resolver->resolve(address, std::move(answer), again);
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
    c.max_workers = k.max_workers;
    out.push_back(std::move(c));
  }
  return out;
}

void serve_link(core::MessageLink& link, workers::Manager** manager, int slot,
                std::shared_ptr<ProcessReports> reports) {
  // The link dies with its server process; answers that come later are dropped, and so is what
  // it reported. The process caches the sockets it was given (LinkResolver::kCacheMs): when one
  // of those addresses stops being a running, unsuspended worker, it is told to forget it.
  struct LinkState {
    core::MessageLink* link;
    std::set<std::string> resolved;  // addresses whose socket this process may have cached
    uint64_t watch = 0;
  };
  auto st = std::make_shared<LinkState>();
  st->link = &link;
  link.on_closed = [st, manager, slot, reports] {
    st->link = nullptr;
    if (st->watch && *manager) (*manager)->unwatch(st->watch);
    st->watch = 0;
    if (reports) reports->by_slot.erase(slot);
  };
  auto remember = [st, manager](const std::string& address) {
    st->resolved.insert(address);
    if (st->watch || !*manager) return;
    st->watch = (*manager)->watch([st](const std::string& a, const nlohmann::json& e) {
      bool serving =
          e.is_object() && e.value("status", "") == "running" && !e.value("suspended", false);
      if (serving || !st->link || !st->resolved.erase(a)) return;
      st->link->send(nlohmann::json{{"type", "forget"}, {"address", core::wire_encode(a)}}.dump());
    });
  };
  link.on_message = [st, manager, slot, reports, remember](std::string_view message) {
    guarded("supervisor", [&] {
      auto m = nlohmann::json::parse(message, nullptr, false);
      if (!m.is_object()) return;
      std::string type = string_field(m, "type");
      if (type == "report") {
        if (reports) {
          m.erase("type");
          auto& last = reports->by_slot[slot];
          if (!last.is_object()) last = nlohmann::json::object();
          last.update(m);  // "quic" and "proxy" come in separate reports
        }
        return;
      }
      if (type != "resolve") return;
      uint64_t id = id_field(m);
      auto decoded = address_field(m);
      std::string address = decoded.value_or(std::string());
      auto reply = [st, id, address, remember](const workers::Resolution& r) {
        if (!st->link) return;
        // Answered from the manager's deferred callbacks, outside any guard: a dump that cannot
        // throw (a socket path or a public error that is not UTF-8 is written with U+FFFD).
        constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
        if (r.ok()) {
          remember(address);
          st->link->send(
              nlohmann::json{{"type", "resolved"}, {"id", id}, {"socket", r.socket_path}}.dump(
                  -1, ' ', false, kReplace));
        } else {
          nlohmann::json refused = {
              {"type", "refused"}, {"id", id}, {"status", r.status}, {"error", r.error}};
          if (r.retry_after_s > 0) refused["retryAfter"] = r.retry_after_s;
          st->link->send(refused.dump(-1, ' ', false, kReplace));
        }
      };
      if (!decoded) {
        reply({{}, 400, {{"message", "Not a worker address."}, {"code", "bad_address"}}});
        return;
      }
      if (!*manager) {
        reply({{}, 503, {{"message", "workers are not available"}}});
        return;
      }
      (*manager)->resolve(address, reply);
    });
  };
}

}  // namespace corral::cli
