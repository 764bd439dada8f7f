// GET /metrics: Prometheus' text format (0.0.4), or OpenMetrics 1.0 (ending `# EOF`) when the
// Accept header names application/openmetrics-text. Served by the supervisor on the control
// socket and on the admin listener (the same Site, the same guard: control/admin.h).
//
// Where the numbers come from, all read on the scrape:
//  * the server processes: MetricsRegion, the shared anonymous mapping the supervisor makes
//    before it forks, one http::ProcessMetrics block per slot and generation index (see
//    http/metrics.h for who writes what, and why nothing goes backwards when a process is
//    replaced). The scrape sums the counters of every block and the gauges of the live
//    processes' blocks (fanout::Supervisor::live);
//  * the supervisor: its slots (restarts, status) and generation;
//  * the worker manager (in the supervisor): workers by kind and status, and each kind's
//    KindCounters (workers/kind_counters.h).
//
// Names and labels follow what Caddy's metrics and the nginx exporter made familiar (_total
// counters, _seconds histograms, _bytes): the families, their labels and their meanings are listed
// in docs/operate.md ("Metrics"). No label takes an address or a path: proto, code, reason,
// status, kind (configured names) and slot (a process index) are all bounded.
//
// Cost: a scrape reads 10 KiB per block (processes x kGenerations blocks) and renders about 8 KiB
// (6 KiB more a worker kind) on the supervisor's loop; the server processes do nothing for it
// (docs/performance.md, "Scraping /metrics").
//
// Lifetime: the MetricsRegion is the Supervision's (app/supervision.h), mapped before the first
// fork and unmapped when the supervisor returns; the route borrows it and the supervisor and
// manager (all outlive the control Site).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "fanout/supervisor.h"
#include "http/metrics.h"
#include "http/site.h"

namespace corral::workers {
class Manager;
}

namespace corral::control {

class MetricsRegion {
 public:
  // Maps slots x fanout::kGenerations zeroed blocks, shared with every process forked later.
  static core::Result<std::unique_ptr<MetricsRegion>> map(int slots);
  ~MetricsRegion();
  MetricsRegion(const MetricsRegion&) = delete;
  MetricsRegion& operator=(const MetricsRegion&) = delete;

  int slots() const { return slots_; }
  size_t blocks() const { return count_; }
  // The block of the process of `slot` and `generation` (its generation index).
  http::ProcessMetrics* block(int slot, uint64_t generation) const;
  http::ProcessMetrics* block_at(size_t i) const { return blocks_ + i; }

  // The kind table (http::metrics_kind): `name`'s index, given once and kept for the supervisor's
  // life (a reload may add kinds, never renumber them); -1 past http::kMetricsKinds. Called by
  // the supervisor before it forks the processes that count for the kind: they inherit it.
  int add_kind(std::string_view name);
  const std::vector<std::string>& kinds() const { return kinds_; }

 private:
  MetricsRegion() = default;
  http::ProcessMetrics* blocks_ = nullptr;
  size_t count_ = 0;
  size_t bytes_ = 0;
  int slots_ = 0;
  std::vector<std::string> kinds_;
};

// The sum of the region's blocks: every block's counters and histograms, and the gauges of the
// blocks of `live` processes only.
std::unique_ptr<http::ProcessMetrics> sum_blocks(
    const MetricsRegion& region, const std::vector<fanout::Supervisor::LiveProcess>& live);

// The exposition text, family by family. A counter family is named without `_total`: the
// samples carry it, and so does the Prometheus format's # TYPE line (OpenMetrics' does not).
class MetricsText {
 public:
  using Label = std::pair<std::string_view, std::string_view>;
  using Labels = std::initializer_list<Label>;

  explicit MetricsText(bool openmetrics);
  void counter(std::string_view name, std::string_view help);
  void gauge(std::string_view name, std::string_view help);
  void histogram(std::string_view name, std::string_view help);
  // A sample of the current counter or gauge family.
  void value(Labels labels, uint64_t v);
  void value(Labels labels, int64_t v);
  // The current histogram family's series for `labels`: cumulative buckets (le in seconds, then
  // +Inf), _count (the buckets' sum) and _sum (seconds).
  template <size_t N>
  void observations(Labels labels, const uint64_t (&bounds_us)[N], const http::Histogram<N>& h) {
    series(labels, bounds_us, N, h.counts, h.sum_us);
  }
  // The text; OpenMetrics' ends with "# EOF".
  std::string finish();

  static constexpr std::string_view kPrometheusType = "text/plain; version=0.0.4; charset=utf-8";
  static constexpr std::string_view kOpenMetricsType =
      "application/openmetrics-text; version=1.0.0; charset=utf-8";
  // Backslash, double quote and newline escaped, as label values are quoted.
  static std::string escape(std::string_view value);
  static void append_escaped(std::string& out, std::string_view value);

 private:
  void head(std::string_view name, std::string_view type, std::string_view help);
  void number(uint64_t v);  // and a newline
  void name_and_labels(std::string_view suffix, Labels labels, std::string_view le = {});
  void series(Labels labels, const uint64_t* bounds_us, size_t n, const uint64_t* counts,
              uint64_t sum_us);
  bool openmetrics_;
  bool counter_ = false;  // the current family is a counter: samples are name_total
  std::string name_;
  std::string out_;
};

struct MetricsSources {
  const MetricsRegion* region = nullptr;  // null: no server-process families
  const fanout::Supervisor* supervisor = nullptr;
  const workers::Manager* manager = nullptr;  // null: no worker kinds
};

// The whole exposition.
std::string render_metrics(const MetricsSources& sources, bool openmetrics);
// Whether an Accept header asks for OpenMetrics.
bool wants_openmetrics(std::string_view accept);
// GET /metrics.
void add_metrics_routes(http::SiteBuilder& site, MetricsSources sources);

}  // namespace corral::control
