#include "workers/link_server.h"

#include <set>

#include "workers/link_codec.h"
#include "workers/link_guard.h"

namespace corral::workers {

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
      st->link->send(link::encode(link::Forget{a}));
    });
  };
  link.on_message = [st, manager, slot, reports, remember](std::string_view text) {
    guarded("supervisor", [&] {
      auto decoded = link::decode(text);
      if (!decoded) return;  // not a message: dropped
      link::Message& message = decoded.value();
      if (auto* report = std::get_if<link::Report>(&message)) {
        if (reports) {
          auto& last = reports->by_slot[slot];
          if (!last.is_object()) last = nlohmann::json::object();
          last.update(report->fields);  // "quic" and "proxy" come in separate reports
        }
        return;
      }
      auto* resolve = std::get_if<link::Resolve>(&message);
      if (!resolve) return;
      uint64_t id = resolve->id;
      std::string address = resolve->address.value_or(std::string());
      auto reply = [st, id, address, remember](const Resolution& r) {
        if (!st->link) return;
        // Answered from the manager's deferred callbacks, outside any guard: encode cannot throw.
        if (r.ok()) {
          remember(address);
          st->link->send(link::encode(link::Resolved{id, r.socket_path, r.pid, r.cold}));
        } else {
          st->link->send(link::encode(link::Refused{id, r.status, r.error, r.retry_after_s}));
        }
      };
      if (!resolve->address) {
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
