#include "control/worker_routes.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>

#include "core/escape.h"
#include "workers/kind_log.h"

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

// `corral ctl logs -f`: an address's last lines of its kind's log, then each new one as the
// manager writes it; unsubscribes on abort, end or destruction.
class LogFollow final : public http::StreamProducer {
 public:
  LogFollow(workers::Manager& manager, std::string tail, std::string address_field)
      : manager_(manager), tail_(std::move(tail)), field_(std::move(address_field)) {}
  ~LogFollow() override { unsubscribe(); }

  void on_start(http::StreamWriter& w) override {
    writer_ = &w;
    if (!tail_.empty()) w.write(std::exchange(tail_, {}));
    id_ = manager_.watch_output([this](std::string_view, std::string_view lines) {
      if (!writer_) return;
      std::string mine;
      while (!lines.empty()) {
        size_t nl = lines.find('\n');
        size_t end = nl == std::string_view::npos ? lines.size() : nl + 1;
        if (workers::kind_log_line_of(lines.substr(0, end), field_)) mine += lines.substr(0, end);
        lines.remove_prefix(end);
      }
      if (!mine.empty()) writer_->write(mine);
      if (writer_->buffered() > kMaxWatchBacklog) {  // a follower that does not read
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
    if (id_) manager_.unwatch_output(std::exchange(id_, 0));
  }
  workers::Manager& manager_;
  std::string tail_, field_;
  http::StreamWriter* writer_ = nullptr;
  uint64_t id_ = 0;
};

// The value of `name` in a query string ("lines=50&follow=1"); empty when absent.
std::string_view query_value(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    if (pair.size() > name.size() && pair.starts_with(name) && pair[name.size()] == '=')
      return pair.substr(name.size() + 1);
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return {};
}

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
  // The tail of an address's output in its kind's log (workers/kind_log.h): ?lines=N (default
  // 100, at most 10000; the files are read backwards, at most 8 MiB per request), and with
  // follow=1 every new line after it, streamed until the client goes.
  site.route("GET /workers/{address}/log", [&manager](http::Request& req) {
    auto decoded = address_param(req);
    if (!decoded) return bad_address();
    auto file = manager.log_file(*decoded);
    if (!file)
      return http::Response::json(
          {{"error",
            {{"message", "No worker kind serves this address."}, {"code", "unknown_kind"}}}},
          404);
    size_t lines = 100;
    if (std::string_view n = query_value(req.query, "lines"); !n.empty()) {
      size_t v = 0;
      auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), v);
      if (ec != std::errc() || end != n.data() + n.size())
        return http::Response::json(
            {{"error", {{"message", "lines: a number (at most 10000)"}, {"code", "bad_lines"}}}},
            400);
      lines = std::min<size_t>(v, 10'000);
    }
    std::string field = workers::kind_log_address(*decoded);
    auto tail = workers::tail_kind_log(file->path, file->keep, field, lines);
    if (!tail)
      return http::Response::json(
          {{"error", {{"message", tail.error().reason}, {"code", "log_unreadable"}}}}, 500);
    if (query_value(req.query, "follow") == "1")
      return http::Response::stream(
          std::make_unique<LogFollow>(manager, std::move(tail.value()), std::move(field)),
          "text/plain; charset=utf-8");
    return http::Response::text(std::move(tail.value()));
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
