#include "control/worker_routes.h"

#include <nlohmann/json.hpp>

#include "core/escape.h"

namespace corral::control {

namespace {

constexpr size_t kMaxWatchBacklog = 1 << 20;

// Never throws (U+FFFD for a string that is not UTF-8; addresses are in their lossless wire form).
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One watcher of the manager's state: subscribes on start, unsubscribes on abort, end or
// destruction, whichever comes first.
class WatchStream final : public http::StreamProducer {
 public:
  explicit WatchStream(workers::Manager& manager) : manager_(manager) {}
  ~WatchStream() override { unsubscribe(); }

  void on_start(http::StreamWriter& w) override {
    writer_ = &w;
    w.write(dump(nlohmann::json({{"state", manager_.state()}})) + "\n");
    id_ = manager_.watch([this](const std::string& address, const nlohmann::json& entry) {
      if (!writer_) return;
      writer_->write(
          dump(nlohmann::json({{"address", core::wire_encode(address)}, {"entry", entry}})) + "\n");
      if (writer_->buffered() > kMaxWatchBacklog) {  // a watcher that does not read
        auto* w = std::exchange(writer_, nullptr);
        unsubscribe();
        w->end();
      }
    });
  }
  void on_abort() override {
    writer_ = nullptr;
    unsubscribe();
  }

 private:
  void unsubscribe() {
    if (id_) manager_.unwatch(std::exchange(id_, 0));
  }
  workers::Manager& manager_;
  http::StreamWriter* writer_ = nullptr;
  uint64_t id_ = 0;
};

http::Response accepted(workers::Manager& m, const std::string& address) {
  return http::Response::json(
      {{"address", core::wire_encode(address)}, {"entry", m.entry(address)}}, 202);
}

// The {address} of a control path is the address's wire form (as GET /workers shows it), itself
// percent-encoded as one path segment: "doc:%FF" is POST /workers/doc%3A%25FF/retry.
std::optional<std::string> address_param(http::Request& req) {
  std::string address;
  if (!core::wire_decode(req.param("address"), address)) return std::nullopt;
  return address;
}

http::Response bad_address() {
  return http::Response::json(
      {{"error",
        {{"message",
          "Not an address in its wire form: write '%' as %25 (docs/worker-protocol.md)."},
         {"code", "bad_address"}}}},
      400);
}

http::Response not_found(std::string_view message) {
  return http::Response::json({{"error", {{"message", message}, {"code", "not_found"}}}}, 404);
}

}  // namespace

void add_worker_routes(http::SiteBuilder& site, workers::Manager& manager) {
  // The addresses' entries, and the warm spares' beside them under keys that are never an
  // address ("spare/<kind>/<n>": no ':').
  site.route("GET /workers", [&manager](http::Request&) {
    nlohmann::json state = manager.state();
    state.update(manager.spares_state());
    return http::Response::json(state);
  });
  site.route("GET /workers/watch", [&manager](http::Request&) {
    return http::Response::stream(std::make_unique<WatchStream>(manager), "application/x-ndjson");
  });
  site.route("POST /workers/{address}/retry", [&manager](http::Request& req) {
    auto decoded = address_param(req);
    if (!decoded) return bad_address();
    const std::string& address = *decoded;
    if (!manager.retry(address)) return not_found("The address is neither failed nor suspended.");
    // ?start=1 (the status page's Retry): start its worker now rather than at the next request.
    if (req.query == "start=1") manager.resolve(address, [](const workers::Resolution&) {});
    return accepted(manager, address);
  });
  site.route("POST /workers/{address}/stop", [&manager](http::Request& req) {
    auto decoded = address_param(req);
    if (!decoded) return bad_address();
    const std::string& address = *decoded;
    if (!manager.stop(address)) return not_found("No worker runs for this address.");
    return accepted(manager, address);
  });
  site.route("POST /workers/{address}/suspend", [&manager](http::Request& req) {
    auto decoded = address_param(req);
    if (!decoded) return bad_address();
    const std::string& address = *decoded;
    if (!manager.suspend(address)) return not_found("No such worker kind.");
    return accepted(manager, address);
  });
  site.route("POST /workers/{address}/resume", [&manager](http::Request& req) {
    auto decoded = address_param(req);
    if (!decoded) return bad_address();
    const std::string& address = *decoded;
    if (!manager.resume(address)) return not_found("The address is not suspended.");
    return accepted(manager, address);
  });
}

}  // namespace corral::control
