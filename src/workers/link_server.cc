#include "workers/link_server.h"

#include <set>

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

void serve_link(core::MessageLink& link, Manager** manager, int slot,
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
      auto reply = [st, id, address, remember](const Resolution& r) {
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

}  // namespace corral::workers
