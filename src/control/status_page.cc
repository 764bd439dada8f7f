#include "control/status_page.h"

#include <unistd.h>

#include <algorithm>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "control/status_assets.h"  // generated from src/control/status/ (embed_assets.cmake)
#include "core/escape.h"
#include "core/timer_wheel.h"

namespace corral::control {

namespace {

constexpr size_t kMaxBacklog = 1 << 20;    // a client queued this much is not reading: cut off
constexpr uint64_t kPollMs = 1'000;        // the server processes' state is read this often
constexpr uint64_t kKeepaliveMs = 15'000;  // a comment line keeps idle proxies from closing
constexpr size_t kTailBytes = 8 * 1024;
constexpr size_t kDefaultPer = 50, kMaxPer = 200;

// Never throws (U+FFFD for a string that is not UTF-8; addresses are in their wire form).
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// application/x-www-form-urlencoded, as a browser writes a query: '+' is a space, %XX a byte (a
// malformed escape is kept as it is).
std::string form_decode(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < in.size() && hex_digit(in[i + 1]) >= 0 &&
               hex_digit(in[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_digit(in[i + 1]) * 16 + hex_digit(in[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The value of `name` in a query string ("" when absent).
std::string query_value(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    size_t eq = pair.find('=');
    if (form_decode(pair.substr(0, eq)) == name)
      return eq == std::string_view::npos ? std::string() : form_decode(pair.substr(eq + 1));
  }
  return {};
}

size_t number_or(const std::string& s, size_t fallback) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    return fallback;
  return std::stoul(s);
}

// Which addresses a client looks at: those whose wire form contains `q`, of `kind`, in `status`
// (each empty: any), page `page` of `per`.
struct Filter {
  std::string q, kind, status;
  size_t page = 0, per = kDefaultPer;

  static Filter of(std::string_view query) {
    Filter f;
    f.q = query_value(query, "q");
    f.kind = query_value(query, "kind");
    f.status = query_value(query, "status");
    f.page = number_or(query_value(query, "page"), 0);
    f.per = std::clamp<size_t>(number_or(query_value(query, "per"), kDefaultPer), 1, kMaxPer);
    return f;
  }
};

uint32_t percentile(std::vector<uint32_t> v, double p) {
  if (v.empty()) return 0;
  size_t k = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return v[k];
}

class StatusHub;

// One EventSource: its filter, the page of addresses last made for it and the view last sent.
class EventsStream final : public http::StreamProducer {
 public:
  EventsStream(std::shared_ptr<StatusHub> hub, Filter filter)
      : hub_(std::move(hub)), filter_(std::move(filter)) {}
  ~EventsStream() override;

  void on_start(http::StreamWriter& w) override;
  void on_writable(http::StreamWriter& w) override;
  void on_abort() override;

  const Filter& filter() const { return filter_; }
  // The page of addresses was made again (or must be: empty).
  std::string page;
  // Sends the view of `common` and this client's page unless it is the one last sent, or keeps
  // it for on_writable while the client's queue is above the high-water mark.
  void offer(const std::string& common);
  void keepalive();

 private:
  void detach();
  void send();
  std::shared_ptr<StatusHub> hub_;
  Filter filter_;
  http::StreamWriter* writer_ = nullptr;
  std::string next_, sent_;
  bool blocked_ = false;
};

// What every client of the page shares (status_page.h).
class StatusHub {
 public:
  StatusHub(core::EventLoop& loop, StatusSources sources)
      : loop_(loop),
        sources_(std::move(sources)),
        started_at_(loop.wall_seconds()),
        push_timer_(loop.timers(), [this] { push(); }),
        poll_timer_(loop.timers(), [this] { poll(); }) {}
  ~StatusHub() { unwatch(); }
  StatusHub(const StatusHub&) = delete;
  StatusHub& operator=(const StatusHub&) = delete;

  void attach(EventsStream* c) {
    clients_.push_back(c);
    if (sources_.manager && !watch_id_)
      watch_id_ = sources_.manager->watch([this](const std::string&, const nlohmann::json&) {
        addresses_changed_ = true;
        schedule();
      });
    if (!poll_timer_.armed()) poll_timer_.arm_after(kPollMs);
    // The first view at once: the common part as it is now, this client's page made for it.
    common_ = make_common();
    c->page = make_page(c->filter());
    c->offer(common_);
  }
  void detach(EventsStream* c) {
    clients_.remove(c);
    if (clients_.empty()) {
      unwatch();
      push_timer_.cancel();
      poll_timer_.cancel();
    }
  }

  std::string tail(std::string_view wire_address) const {
    std::string address;
    if (!sources_.manager || !core::wire_decode(wire_address, address)) return {};
    std::string t = sources_.manager->stderr_tail(address);
    return t.size() > kTailBytes ? t.substr(t.size() - kTailBytes) : t;
  }

 private:
  void unwatch() {
    if (watch_id_) sources_.manager->unwatch(std::exchange(watch_id_, 0));
  }
  // A push soon: now if the last was kMinPushMs ago, else then (changes meanwhile coalesce).
  void schedule() {
    if (push_timer_.armed()) return;
    push_timer_.arm_at(std::max(loop_.now(), last_push_ + kMinPushMs));
  }
  void poll() {
    poll_timer_.arm_after(kPollMs);
    if ((keepalive_ticks_ += kPollMs) >= kKeepaliveMs) {
      keepalive_ticks_ = 0;
      for (EventsStream* c : std::vector<EventsStream*>(clients_.begin(), clients_.end()))
        c->keepalive();
    }
    schedule();  // the server processes' state (a view is sent only if it changed)
  }
  void push() {
    last_push_ = loop_.now();
    common_ = make_common();
    bool remake = std::exchange(addresses_changed_, false);
    // A client may go (cut off) while offered its view: walk a copy.
    for (EventsStream* c : std::vector<EventsStream*>(clients_.begin(), clients_.end())) {
      if (remake || c->page.empty()) c->page = make_page(c->filter());
      c->offer(common_);
    }
  }

  // "supervisor":..., "processes":..., "kinds":[...]: the members every client's view shares.
  std::string make_common() const {
    nlohmann::json sup = {{"version", CORRAL_VERSION},
                          {"pid", ::getpid()},
                          {"started_at", started_at_},
                          {"workers", nullptr}};
    nlohmann::json processes;
    if (sources_.supervisor) {
      processes = processes_json(*sources_.supervisor, sources_.reported);
      sup["generation"] = sources_.supervisor->generation();
      sup["reloads"] = sources_.supervisor->generation() - 1;
      sup["terminating"] = sources_.supervisor->terminating();
    }
    nlohmann::json kinds = nlohmann::json::array();
    if (const workers::Manager* m = sources_.manager) {
      sup["workers"] = {{"live", m->live_workers()},       {"starting", m->starting_workers()},
                        {"queued", m->queued_starts()},    {"spares", m->spare_count()},
                        {"max_workers", m->max_workers()}, {"max_starting", m->max_starting()},
                        {"closing", m->closing()}};
      for (auto& k : m->kind_summaries()) {
        kinds.push_back(
            {{"name", k.name},
             {"live", k.live},
             {"starting", k.starting},
             {"running", k.running},
             {"stopping", k.stopping},
             {"queued", k.queued},
             {"failed", k.failed},
             {"suspended", k.suspended},
             {"spares", k.spares},
             {"stale", k.stale},
             {"version", k.version.empty() ? nlohmann::json() : nlohmann::json(k.version)},
             {"rolling", k.rolling},
             {"start_ms",
              {{"p50", percentile(k.start_ms, 0.50)},
               {"p99", percentile(k.start_ms, 0.99)},
               {"samples", k.start_ms.size()}}}});
      }
    }
    return "\"supervisor\":" + dump(sup) + ",\"processes\":" + dump(processes) +
           ",\"kinds\":" + dump(kinds);
  }

  // {total (matching the filter), all, page, per, items: [{address, kind, entry}]}: one pass over
  // the addresses' statuses, entries made only for the page's.
  std::string make_page(const Filter& f) const {
    nlohmann::json items = nlohmann::json::array();
    size_t all = 0, total = 0;
    if (const workers::Manager* m = sources_.manager) {
      const size_t first = f.page * f.per;
      std::vector<std::string> wanted;
      m->visit_addresses(
          [&](const std::string& address, std::string_view kind, std::string_view status) {
            ++all;
            if (!f.kind.empty() && kind != f.kind) return;
            if (!f.status.empty() && status != f.status) return;
            if (!f.q.empty() && address.find(f.q) == std::string::npos &&
                core::wire_encode(address).find(f.q) == std::string::npos)
              return;
            if (total >= first && total < first + f.per) wanted.push_back(address);
            ++total;
          });
      for (const auto& address : wanted) {
        auto colon = address.find(':');
        items.push_back({{"address", core::wire_encode(address)},
                         {"kind", address.substr(0, colon)},
                         {"entry", m->entry(address)}});
      }
    }
    return dump({{"total", total},
                 {"all", all},
                 {"page", f.page},
                 {"per", f.per},
                 {"items", std::move(items)}});
  }

  core::EventLoop& loop_;
  StatusSources sources_;
  time_t started_at_;
  std::list<EventsStream*> clients_;
  uint64_t watch_id_ = 0;
  bool addresses_changed_ = false;
  uint64_t last_push_ = 0;
  uint64_t keepalive_ticks_ = 0;
  std::string common_;
  core::Timer push_timer_, poll_timer_;
};

EventsStream::~EventsStream() {
  detach();
}

void EventsStream::detach() {
  if (writer_) {
    writer_ = nullptr;
    hub_->detach(this);
  }
}

void EventsStream::on_start(http::StreamWriter& w) {
  writer_ = &w;
  // The EventSource's reconnection delay after a cut connection (a reload, a restart).
  w.write("retry: 2000\n\n");
  hub_->attach(this);
}

void EventsStream::on_writable(http::StreamWriter&) {
  blocked_ = false;
  if (next_ != sent_) send();
}

void EventsStream::on_abort() {
  detach();
}

void EventsStream::offer(const std::string& common) {
  next_ = "{" + common + ",\"addresses\":" + page + "}";
  if (!blocked_ && next_ != sent_) send();
}

void EventsStream::send() {
  if (!writer_) return;
  sent_ = next_;
  std::string event = "event: view\ndata: " + sent_ + "\n\n";
  blocked_ = !writer_->write(event);
  if (writer_->buffered() > kMaxBacklog) {  // not reading
    http::StreamWriter* w = writer_;
    detach();
    w->end();
  }
}

void EventsStream::keepalive() {
  if (writer_ && !blocked_) writer_->write(":\n\n");
}

// The page's HTML with its CSS and script inlined, cut at each "{nonce}".
std::vector<std::string> page_parts() {
  std::string html(status_assets::kIndexHtml, status_assets::kIndexHtmlSize);
  auto put = [&html](std::string_view mark, std::string_view text) {
    size_t at = html.find(mark);
    if (at != std::string::npos) html.replace(at, mark.size(), text);
  };
  put("{version}", CORRAL_VERSION);
  put("{style}", std::string_view(status_assets::kStatusCss, status_assets::kStatusCssSize));
  put("{script}", std::string_view(status_assets::kStatusJs, status_assets::kStatusJsSize));
  std::vector<std::string> parts;
  constexpr std::string_view kNonce = "{nonce}";
  size_t from = 0;
  for (size_t at; (at = html.find(kNonce, from)) != std::string::npos; from = at + kNonce.size())
    parts.push_back(html.substr(from, at - from));
  parts.push_back(html.substr(from));
  return parts;
}

}  // namespace

void add_status_routes(http::SiteBuilder& site, core::EventLoop& loop, StatusSources sources) {
  // shared: the site's routes and every open event stream hold it; the last of them frees it.
  auto hub = std::make_shared<StatusHub>(loop, std::move(sources));
  site.route("GET /", [parts = page_parts()](http::Request& req) {
    std::string body;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) body.append(req.csp_nonce());
      body.append(parts[i]);
    }
    auto r = http::Response::html(std::move(body));
    r.header("cache-control", "no-store");
    return r;
  });
  site.route("GET /events", [hub](http::Request& req) {
    auto r = http::Response::stream(std::make_unique<EventsStream>(hub, Filter::of(req.query)),
                                    "text/event-stream");
    r.header("cache-control", "no-store");
    return r;
  });
  site.route("GET /status/tail", [hub](http::Request& req) {
    auto r = http::Response::text(hub->tail(query_value(req.query, "address")));
    r.header("cache-control", "no-store");
    return r;
  });
}

}  // namespace corral::control
