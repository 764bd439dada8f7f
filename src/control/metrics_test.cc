// GET /metrics' text (control/metrics.h) and the counting it sums (http/metrics.h): the two
// formats' family heads, label escaping, cumulative buckets, the sum over blocks with gauges of
// live processes only, the kind table, and a block shared with a forked child.
#include "control/metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace corral::control {
namespace {

using http::ProcessMetrics;

bool contains(const std::string& text, std::string_view line) {
  return text.find(line) != std::string::npos;
}

TEST(MetricsText, PrometheusTypesTheSampleNameOfACounter) {
  MetricsText t(false);
  t.counter("corral_things", "Things.");
  t.value({{"kind", "a"}}, uint64_t{3});
  t.gauge("corral_open", "Open.");
  t.value({}, int64_t{-1});
  std::string s = t.finish();
  EXPECT_EQ(s,
            "# HELP corral_things_total Things.\n# TYPE corral_things_total counter\n"
            "corral_things_total{kind=\"a\"} 3\n"
            "# HELP corral_open Open.\n# TYPE corral_open gauge\ncorral_open -1\n");
}

TEST(MetricsText, OpenMetricsTypesTheFamilyAndEndsWithEof) {
  MetricsText t(true);
  t.counter("corral_things", "Things.");
  t.value({}, uint64_t{3});
  std::string s = t.finish();
  EXPECT_EQ(s,
            "# HELP corral_things Things.\n# TYPE corral_things counter\ncorral_things_total 3\n"
            "# EOF\n");
}

TEST(MetricsText, LabelValuesAreEscaped) {
  EXPECT_EQ(MetricsText::escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  MetricsText t(false);
  t.gauge("g", "G.");
  t.value({{"kind", "x\"y"}}, int64_t{1});
  EXPECT_TRUE(contains(t.finish(), "g{kind=\"x\\\"y\"} 1\n"));
}

TEST(MetricsText, HistogramBucketsAreCumulativeInSeconds) {
  http::LatencyHistogram h{};
  h.observe(http::kLatencyBoundsUs, 0);           // first bucket
  h.observe(http::kLatencyBoundsUs, 5'000);       // on the bound: still the first
  h.observe(http::kLatencyBoundsUs, 7'000);       // 0.01
  h.observe(http::kLatencyBoundsUs, 60'000'000);  // above every bound
  MetricsText t(false);
  t.histogram("d_seconds", "D.");
  t.observations({{"proto", "1.1"}}, http::kLatencyBoundsUs, h);
  std::string s = t.finish();
  EXPECT_TRUE(contains(s, "d_seconds_bucket{proto=\"1.1\",le=\"0.005\"} 2\n")) << s;
  EXPECT_TRUE(contains(s, "d_seconds_bucket{proto=\"1.1\",le=\"0.01\"} 3\n")) << s;
  EXPECT_TRUE(contains(s, "d_seconds_bucket{proto=\"1.1\",le=\"1.0\"} 3\n")) << s;
  EXPECT_TRUE(contains(s, "d_seconds_bucket{proto=\"1.1\",le=\"10.0\"} 3\n")) << s;
  EXPECT_TRUE(contains(s, "d_seconds_bucket{proto=\"1.1\",le=\"+Inf\"} 4\n")) << s;
  EXPECT_TRUE(contains(s, "d_seconds_count{proto=\"1.1\"} 4\n")) << s;
  EXPECT_TRUE(contains(s, "d_seconds_sum{proto=\"1.1\"} 60.012\n")) << s;
}

TEST(MetricsText, OpenMetricsIsAskedForByAccept) {
  EXPECT_TRUE(wants_openmetrics(
      "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"));
  EXPECT_FALSE(wants_openmetrics("text/plain"));
  EXPECT_FALSE(wants_openmetrics(""));
}

TEST(MetricsRegion, SumsCountersOfEveryBlockAndGaugesOfLiveOnes) {
  auto region = MetricsRegion::map(2);
  ASSERT_TRUE(region);
  auto& r = *region.value();
  ASSERT_EQ(r.blocks(), 2 * fanout::kGenerations);
  // Slot 0 generation 1, its respawn in the same block, and slot 1 of generation 2.
  ProcessMetrics* a = r.block(0, 1);
  ProcessMetrics* b = r.block(1, 2);
  ASSERT_NE(a, b);
  EXPECT_EQ(r.block(0, 1 + fanout::kGenerations), a);  // the same generation index
  a->request_done(ProcessMetrics::kHttp1, 200, 100);
  a->request_done(ProcessMetrics::kHttp1, 404, 100);
  b->request_done(ProcessMetrics::kHttp1, 200, 100);
  b->request_done(ProcessMetrics::kHttp3, 200, 100);
  b->request_done(ProcessMetrics::kHttp1, 999, 100);
  http::add(a->gauges.connections_open[ProcessMetrics::kHttp1], 5);  // a died with these
  http::add(b->gauges.connections_open[ProcessMetrics::kHttp1], 2);
  auto sum = sum_blocks(r, {{1, 2}});
  EXPECT_EQ(sum->proto[ProcessMetrics::kHttp1].requests[200 - 100], 2u);
  EXPECT_EQ(sum->proto[ProcessMetrics::kHttp1].requests[404 - 100], 1u);
  EXPECT_EQ(sum->proto[ProcessMetrics::kHttp1].requests[ProcessMetrics::kCodes], 1u);
  EXPECT_EQ(sum->proto[ProcessMetrics::kHttp3].requests[200 - 100], 1u);
  EXPECT_EQ(sum->gauges.connections_open[ProcessMetrics::kHttp1], 2);

  std::string s = render_metrics({region.value().get(), nullptr, nullptr}, false);
  EXPECT_TRUE(contains(s, "corral_http_requests_total{proto=\"1.1\",code=\"200\"} 2\n")) << s;
  EXPECT_TRUE(contains(s, "corral_http_requests_total{proto=\"1.1\",code=\"404\"} 1\n")) << s;
  EXPECT_TRUE(contains(s, "corral_http_requests_total{proto=\"3\",code=\"200\"} 1\n")) << s;
  EXPECT_TRUE(contains(s, "corral_http_requests_total{proto=\"1.1\",code=\"other\"} 1\n")) << s;
  EXPECT_FALSE(contains(s, "code=\"500\"")) << s;  // codes never seen have no series
  EXPECT_TRUE(contains(s, "corral_http_request_duration_seconds_count{proto=\"1.1\"} 4\n")) << s;
  std::string om = render_metrics({region.value().get(), nullptr, nullptr}, true);
  EXPECT_TRUE(contains(om, "# TYPE corral_http_requests counter\n")) << om;
  EXPECT_EQ(om.substr(om.size() - 6), "# EOF\n");
}

TEST(MetricsRegion, KindsKeepTheirIndex) {
  auto region = MetricsRegion::map(1);
  ASSERT_TRUE(region);
  auto& r = *region.value();
  EXPECT_EQ(r.add_kind("doc"), 0);
  EXPECT_EQ(r.add_kind("chat"), 1);
  EXPECT_EQ(r.add_kind("doc"), 0);
  for (size_t i = 2; i < http::kMetricsKinds; ++i) r.add_kind("k" + std::to_string(i));
  EXPECT_EQ(r.add_kind("one-too-many"), -1);
  r.block(0, 1)->first_response[1].observe(http::kStartBoundsUs, 30'000);
  std::string s = render_metrics({&r, nullptr, nullptr}, false);
  EXPECT_TRUE(contains(s, "corral_worker_first_response_seconds_count{kind=\"chat\"} 1\n")) << s;
  EXPECT_TRUE(contains(s, "corral_worker_first_response_seconds_count{kind=\"doc\"} 0\n")) << s;
}

TEST(MetricsRegion, AForkedProcessCountsInItsBlockAndMetricsKindFindsItsKind) {
  auto region = MetricsRegion::map(1);
  ASSERT_TRUE(region);
  auto& r = *region.value();
  r.add_kind("doc");
  r.add_kind("chat");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    http::adopt_metrics(r.block(0, 1), r.kinds());
    for (int i = 0; i < 1000; ++i) http::metrics().request_done(ProcessMetrics::kHttp1, 201, 0);
    int kind = http::metrics_kind("chat:room-1");
    bool ok = kind == 1 && http::metrics_kind("nope:x") == -1 && http::metrics_kind("doc") == 0;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto sum = sum_blocks(r, {});
  EXPECT_EQ(sum->proto[ProcessMetrics::kHttp1].requests[201 - 100], 1000u);
}

}  // namespace
}  // namespace corral::control
