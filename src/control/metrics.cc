#include "control/metrics.h"

#include <sys/mman.h>

#include <iterator>
#include <map>

#include <fmt/format.h>

#include "workers/manager.h"

#ifndef CORRAL_VERSION
#define CORRAL_VERSION "dev"
#endif

namespace corral::control {

namespace {

using http::ProcessMetrics;

constexpr std::string_view kProtoNames[ProcessMetrics::kProtos] = {"1.1", "3"};
constexpr std::string_view kProxyErrorNames[ProcessMetrics::kProxyErrors] = {
    "unreachable", "timeout", "busy", "broken", "cut"};
constexpr std::string_view kForwardNames[ProcessMetrics::kForwards] = {"slot", "generation"};

// "0.005", "1.0", "2.5", "60.0": a bucket bound in seconds as OpenMetrics spells a float (and
// the Prometheus format accepts).
std::string seconds_text(uint64_t us) {
  std::string s = fmt::format("{}", static_cast<double>(us) / 1e6);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// The bounds' texts, made once per bucket set (a scrape writes each many times).
const std::string* bound_texts(const uint64_t* bounds_us, size_t n) {
  static const std::vector<std::string> latency = [] {
    std::vector<std::string> v;
    for (uint64_t b : http::kLatencyBoundsUs) v.push_back(seconds_text(b));
    return v;
  }();
  static const std::vector<std::string> start = [] {
    std::vector<std::string> v;
    for (uint64_t b : http::kStartBoundsUs) v.push_back(seconds_text(b));
    return v;
  }();
  if (bounds_us == http::kLatencyBoundsUs && n == latency.size()) return latency.data();
  if (bounds_us == http::kStartBoundsUs && n == start.size()) return start.data();
  return nullptr;
}

}  // namespace

// --- the region -------------------------------------------------------------------------------

core::Result<std::unique_ptr<MetricsRegion>> MetricsRegion::map(int slots) {
  std::unique_ptr<MetricsRegion> r(new MetricsRegion());
  r->slots_ = slots;
  r->count_ = static_cast<size_t>(slots) * fanout::kGenerations;
  r->bytes_ = r->count_ * sizeof(ProcessMetrics);
  void* p = mmap(nullptr, r->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return core::Error{errno, "mmap of the metrics region failed"};
  r->blocks_ = static_cast<ProcessMetrics*>(p);  // zero-filled: every word's initial state
  return r;
}

MetricsRegion::~MetricsRegion() {
  if (blocks_) munmap(blocks_, bytes_);
}

http::ProcessMetrics* MetricsRegion::block(int slot, uint64_t generation) const {
  if (slot < 0 || slot >= slots_) return nullptr;
  return blocks_ + static_cast<size_t>(slot) * fanout::kGenerations +
         fanout::generation_index(generation);
}

int MetricsRegion::add_kind(std::string_view name) {
  for (size_t i = 0; i < kinds_.size(); ++i)
    if (kinds_[i] == name) return static_cast<int>(i);
  if (kinds_.size() >= http::kMetricsKinds) return -1;
  kinds_.emplace_back(name);
  return static_cast<int>(kinds_.size() - 1);
}

std::unique_ptr<http::ProcessMetrics> sum_blocks(
    const MetricsRegion& region, const std::vector<fanout::Supervisor::LiveProcess>& live) {
  auto sum = std::make_unique<ProcessMetrics>();  // value-initialized: zeros
  for (size_t b = 0; b < region.blocks(); ++b) {
    const ProcessMetrics& m = *region.block_at(b);
    for (size_t p = 0; p < ProcessMetrics::kProtos; ++p) {
      auto& to = sum->proto[p];
      const auto& from = m.proto[p];
      for (size_t i = 0; i <= ProcessMetrics::kCodes; ++i)
        to.requests[i] += http::load(from.requests[i]);
      to.duration.add_from(from.duration);
      to.ttfb.add_from(from.ttfb);
      to.request_bytes += http::load(from.request_bytes);
      to.response_bytes += http::load(from.response_bytes);
      to.connections += http::load(from.connections);
    }
    sum->connections_refused += http::load(m.connections_refused);
    sum->websockets += http::load(m.websockets);
    for (size_t i = 0; i < ProcessMetrics::kProxyErrors; ++i)
      sum->proxy_errors[i] += http::load(m.proxy_errors[i]);
    for (size_t i = 0; i < ProcessMetrics::kForwards; ++i)
      sum->quic_forwarded[i] += http::load(m.quic_forwarded[i]);
    for (size_t k = 0; k < http::kMetricsKinds; ++k)
      sum->first_response[k].add_from(m.first_response[k]);
  }
  for (const auto& p : live) {
    const ProcessMetrics* m = region.block(p.slot, p.generation);
    if (!m) continue;
    for (size_t i = 0; i < ProcessMetrics::kProtos; ++i)
      sum->gauges.connections_open[i] += http::load(m->gauges.connections_open[i]);
    sum->gauges.websockets_open += http::load(m->gauges.websockets_open);
  }
  return sum;
}

// --- the text ---------------------------------------------------------------------------------

MetricsText::MetricsText(bool openmetrics) : openmetrics_(openmetrics) {
  out_.reserve(32 * 1024);
}

std::string MetricsText::escape(std::string_view value) {
  std::string out;
  append_escaped(out, value);
  return out;
}

void MetricsText::append_escaped(std::string& out, std::string_view value) {
  if (value.find_first_of("\\\"\n") == std::string_view::npos) {
    out += value;  // the usual case: nothing to escape
    return;
  }
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

void MetricsText::head(std::string_view name, std::string_view type, std::string_view help) {
  name_.assign(name);
  counter_ = type == "counter";
  // Prometheus' format types the sample name (name_total); OpenMetrics the family's.
  std::string shown = name_;
  if (counter_ && !openmetrics_) shown += "_total";
  // Help texts are this file's own: no backslash, quote or newline to escape.
  for (std::string_view part :
       {std::string_view("# HELP "), std::string_view(shown), std::string_view(" "), help,
        std::string_view("\n# TYPE "), std::string_view(shown), std::string_view(" "), type,
        std::string_view("\n")})
    out_ += part;
}

void MetricsText::counter(std::string_view name, std::string_view help) {
  head(name, "counter", help);
}
void MetricsText::gauge(std::string_view name, std::string_view help) {
  head(name, "gauge", help);
}
void MetricsText::histogram(std::string_view name, std::string_view help) {
  head(name, "histogram", help);
}

void MetricsText::name_and_labels(std::string_view suffix, Labels labels, std::string_view le) {
  out_ += name_;
  out_ += suffix;
  if (labels.size() == 0 && le.empty()) {
    out_ += ' ';
    return;
  }
  out_ += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out_ += ',';
    first = false;
    out_ += k;
    out_ += "=\"";
    append_escaped(out_, v);
    out_ += '"';
  }
  if (!le.empty()) {
    if (!first) out_ += ',';
    out_ += "le=\"";
    out_ += le;
    out_ += '"';
  }
  out_ += "} ";
}

void MetricsText::number(uint64_t v) {
  fmt::format_int text(v);
  out_.append(text.data(), text.size());
  out_ += '\n';
}

void MetricsText::value(Labels labels, uint64_t v) {
  name_and_labels(counter_ ? "_total" : "", labels);
  number(v);
}

void MetricsText::value(Labels labels, int64_t v) {
  name_and_labels(counter_ ? "_total" : "", labels);
  fmt::format_int text(v);
  out_.append(text.data(), text.size());
  out_ += '\n';
}

void MetricsText::series(Labels labels, const uint64_t* bounds_us, size_t n, const uint64_t* counts,
                         uint64_t sum_us) {
  const std::string* texts = bound_texts(bounds_us, n);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += counts[i];
    if (texts) {
      name_and_labels("_bucket", labels, texts[i]);
    } else {
      name_and_labels("_bucket", labels, seconds_text(bounds_us[i]));
    }
    number(cumulative);
  }
  cumulative += counts[n];
  name_and_labels("_bucket", labels, "+Inf");
  number(cumulative);
  name_and_labels("_count", labels);
  number(cumulative);
  name_and_labels("_sum", labels);
  if (sum_us == 0) {
    out_ += "0\n";
  } else {
    fmt::format_to(std::back_inserter(out_), "{}\n", static_cast<double>(sum_us) / 1e6);
  }
}

std::string MetricsText::finish() {
  if (openmetrics_) out_ += "# EOF\n";
  return std::move(out_);
}

// --- the families -----------------------------------------------------------------------------

namespace {

void write_process_families(MetricsText& t, const MetricsRegion& region,
                            const std::vector<fanout::Supervisor::LiveProcess>& live) {
  auto sum = sum_blocks(region, live);
  const ProcessMetrics& m = *sum;
  t.counter("corral_http_requests",
            "HTTP requests answered by the server processes, by protocol and status code, "
            "counted when the response ends.");
  for (size_t p = 0; p < ProcessMetrics::kProtos; ++p) {
    for (size_t i = 0; i <= ProcessMetrics::kCodes; ++i) {
      uint64_t n = m.proto[p].requests[i];
      if (!n) continue;
      auto code = fmt::format_int(ProcessMetrics::kMinCode + static_cast<int>(i));
      t.value({{"proto", kProtoNames[p]},
               {"code", i == ProcessMetrics::kCodes ? std::string_view("other")
                                                    : std::string_view(code.data(), code.size())}},
              n);
    }
  }
  t.histogram("corral_http_request_duration_seconds",
              "Time from a request's first byte to the end of its response.");
  for (size_t p = 0; p < ProcessMetrics::kProtos; ++p)
    t.observations({{"proto", kProtoNames[p]}}, http::kLatencyBoundsUs, m.proto[p].duration);
  t.histogram("corral_http_response_ttfb_seconds",
              "Time from a request's first byte to its response head (time to first byte).");
  for (size_t p = 0; p < ProcessMetrics::kProtos; ++p)
    t.observations({{"proto", kProtoNames[p]}}, http::kLatencyBoundsUs, m.proto[p].ttfb);
  t.counter("corral_http_request_bytes",
            "Bytes received from clients: HTTP/1.1 every byte read (heads and bodies, after TLS), "
            "HTTP/3 request bodies.");
  for (size_t p = 0; p < ProcessMetrics::kProtos; ++p)
    t.value({{"proto", kProtoNames[p]}}, m.proto[p].request_bytes);
  t.counter("corral_http_response_bytes",
            "Bytes sent to clients: HTTP/1.1 every byte written (heads and bodies, before TLS), "
            "HTTP/3 response bodies.");
  for (size_t p = 0; p < ProcessMetrics::kProtos; ++p)
    t.value({{"proto", kProtoNames[p]}}, m.proto[p].response_bytes);
  t.counter("corral_http_connections_accepted",
            "Client connections accepted (HTTP/3: QUIC handshakes completed).");
  for (size_t p = 0; p < ProcessMetrics::kProtos; ++p)
    t.value({{"proto", kProtoNames[p]}}, m.proto[p].connections);
  t.gauge("corral_http_connections_open",
          "Client connections open now (HTTP/1.1: not counting upgraded ones; HTTP/3: QUIC "
          "connections).");
  for (size_t p = 0; p < ProcessMetrics::kProtos; ++p)
    t.value({{"proto", kProtoNames[p]}}, m.gauges.connections_open[p]);
  t.counter("corral_http_connections_refused",
            "Connections refused at once because a process had max_connections open.");
  t.value({}, m.connections_refused);
  t.gauge("corral_websockets_open",
          "Upgraded connections open now: WebSockets served by corral or relayed to a worker.");
  t.value({}, m.gauges.websockets_open);
  t.counter("corral_websockets_opened", "Upgraded connections (WebSockets) opened.");
  t.value({}, m.websockets);
  t.counter(
      "corral_proxy_errors",
      "Proxied requests the proxy answered itself or cut, by reason: unreachable (502, "
      "nothing sent), timeout (504), busy (503, accept queue full), broken (502, a bad "
      "or cut response before its head went out), cut (the response was cut after its head).");
  for (size_t i = 0; i < ProcessMetrics::kProxyErrors; ++i)
    t.value({{"reason", kProxyErrorNames[i]}}, m.proxy_errors[i]);
  t.counter("corral_quic_datagrams_forwarded",
            "QUIC datagrams a process forwarded to the process that owns their connection: of "
            "another slot, or another generation of its own slot.");
  for (size_t i = 0; i < ProcessMetrics::kForwards; ++i)
    t.value({{"to", kForwardNames[i]}}, m.quic_forwarded[i]);
  t.histogram("corral_worker_first_response_seconds",
              "For a request that waited for its worker's start: time from its first byte to its "
              "response head, by worker kind.");
  const auto& kinds = region.kinds();
  for (size_t k = 0; k < kinds.size() && k < http::kMetricsKinds; ++k)
    t.observations({{"kind", kinds[k]}}, http::kStartBoundsUs, m.first_response[k]);
}

void write_supervisor_families(MetricsText& t, const fanout::Supervisor& sup) {
  t.gauge("corral_generation", "The current generation of server processes (1, then +1 a reload).");
  t.value({}, static_cast<int64_t>(sup.generation()));
  auto slots = sup.state();
  std::map<std::string, int64_t> by_status;
  for (const char* s : {"starting", "running", "backoff", "exited", "failed", "stopped"})
    by_status[s] = 0;
  for (const auto& s : slots) ++by_status[s.status];
  by_status["draining"] = static_cast<int64_t>(sup.draining().size());
  t.gauge("corral_processes",
          "Server processes by status: the current one of each slot, and older generations' "
          "still draining.");
  for (const auto& [status, n] : by_status) t.value({{"status", status}}, n);
  t.counter("corral_process_restarts",
            "Times a slot's server process was started again after it crashed.");
  for (const auto& s : slots) {
    auto slot = fmt::format_int(s.index);
    t.value({{"slot", std::string_view(slot.data(), slot.size())}},
            static_cast<uint64_t>(s.restarts));
  }
}

void write_worker_families(MetricsText& t, const workers::Manager& manager) {
  auto kinds = manager.kind_summaries();
  t.gauge("corral_workers",
          "Worker addresses by kind and status: starting, running, stopping (a process each), "
          "queued, failed, suspended (none), and warm spares.");
  for (const auto& k : kinds) {
    std::pair<std::string_view, size_t> statuses[] = {
        {"starting", k.starting}, {"running", k.running}, {"stopping", k.stopping},
        {"queued", k.queued},     {"failed", k.failed},   {"suspended", k.suspended},
        {"spare", k.spares}};
    for (const auto& [status, n] : statuses)
      t.value({{"kind", k.name}, {"status", status}}, static_cast<int64_t>(n));
  }
  using workers::KindCounters;
  t.counter("corral_worker_starts",
            "Worker starts by kind: cold (a fork) or spare (a warm spare bound to the address).");
  manager.visit_counters([&](std::string_view kind, const KindCounters& c) {
    for (size_t i = 0; i < std::size(KindCounters::kStartFrom); ++i)
      t.value({{"kind", kind}, {"from", KindCounters::kStartFrom[i]}}, c.starts[i]);
  });
  t.counter("corral_worker_failures",
            "Worker addresses failed, by kind and reason (the public error's code; fatal: the "
            "worker's own `fatal`).");
  manager.visit_counters([&](std::string_view kind, const KindCounters& c) {
    for (size_t i = 0; i < std::size(KindCounters::kFailureReasons); ++i)
      t.value({{"kind", kind}, {"reason", KindCounters::kFailureReasons[i]}}, c.failures[i]);
  });
  t.counter("corral_worker_stops", "Worker stops asked by the manager, by kind and reason.");
  manager.visit_counters([&](std::string_view kind, const KindCounters& c) {
    for (size_t i = 0; i < std::size(KindCounters::kStopReasons); ++i)
      t.value({{"kind", kind}, {"reason", KindCounters::kStopReasons[i]}}, c.stops[i]);
  });
  t.histogram("corral_worker_start_duration_seconds",
              "Time from a worker's fork (cold) or its bind (spare) to its `ready`, by kind.");
  manager.visit_counters([&](std::string_view kind, const KindCounters& c) {
    for (size_t i = 0; i < std::size(KindCounters::kStartFrom); ++i)
      t.observations({{"kind", kind}, {"from", KindCounters::kStartFrom[i]}}, http::kStartBoundsUs,
                     c.start_duration[i]);
  });
}

}  // namespace

std::string render_metrics(const MetricsSources& s, bool openmetrics) {
  MetricsText t(openmetrics);
  t.gauge("corral_build_info", "Always 1; the version of corral serving.");
  t.value({{"version", CORRAL_VERSION}}, int64_t{1});
  if (s.region) {
    std::vector<fanout::Supervisor::LiveProcess> live;
    if (s.supervisor) {
      live = s.supervisor->live();
    } else {  // no supervisor to ask (tests): every block is a live one
      for (int slot = 0; slot < s.region->slots(); ++slot)
        for (uint64_t g = 0; g < fanout::kGenerations; ++g) live.push_back({slot, g});
    }
    write_process_families(t, *s.region, live);
  }
  if (s.supervisor) write_supervisor_families(t, *s.supervisor);
  if (s.manager) write_worker_families(t, *s.manager);
  return t.finish();
}

bool wants_openmetrics(std::string_view accept) {
  return accept.find("application/openmetrics-text") != std::string_view::npos;
}

void add_metrics_routes(http::SiteBuilder& site, MetricsSources sources) {
  site.route("GET /metrics", [sources](http::Request& req) {
    bool om = wants_openmetrics(req.header("accept").value_or(""));
    auto r = http::Response::text(render_metrics(sources, om));
    r.set_content_type_static(om ? MetricsText::kOpenMetricsType : MetricsText::kPrometheusType);
    r.header("Cache-Control", "no-store");
    return r;
  });
}

}  // namespace corral::control
