// What `corral ctl` prints, from the control API's JSON: tables, action lines, refusals.
#include "cli/ctl_format.h"

#include <gtest/gtest.h>

namespace corral::cli {
namespace {

const std::string kV1(64, 'a');
const std::string kV2 = std::string(12, 'b') + std::string(52, 'c');

TEST(CtlFormat, ARolloutIsATableAndASummaryLine) {
  nlohmann::json report = {
      {"kind", "doc"},
      {"version", kV2},
      {"previous", kV1},
      {"workers",
       {{{"address", "doc:1"}, {"report", {{"hello", "v2"}}}},
        {{"address", "doc:22"}, {"report", nlohmann::json::object()}},
        {{"address", "doc:3"}, {"report", {{"restarted", true}}}},
        {{"address", "doc:4"}, {"stopped", true}},
        {{"address", "doc:5"},
         {"error", {{"message", "The reload failed."}, {"code", "reload_failed"}}}},
        {{"address", "doc:6"}, {"error", {{"code", "reload_timeout"}}}}}},
      {"cleared", {"doc:9"}},
      {"failed", 2},
      {"took_ms", 35}};
  EXPECT_EQ(format_rollout(report),
            "ADDRESS  RESULT     DETAIL\n"
            "doc:1    reloaded   {\"hello\":\"v2\"}\n"
            "doc:22   reloaded\n"
            "doc:3    restarted\n"
            "doc:4    stopped\n"
            "doc:5    error      reload_failed: The reload failed.\n"
            "doc:6    error      reload_timeout\n"
            "doc: bbbbbbbbbbbb (was aaaaaaaaaaaa): 6 workers: 2 reloaded, 1 restarted, 1 stopped, "
            "2 failed; 1 cleared; 35 ms\n");
}

TEST(CtlFormat, ARolloutWithNoWorkerIsTheSummaryAlone) {
  nlohmann::json report = {{"kind", "doc"},
                           {"version", kV1},
                           {"previous", ""},
                           {"workers", nlohmann::json::array()},
                           {"cleared", nlohmann::json::array()},
                           {"failed", 0},
                           {"took_ms", 0}};
  EXPECT_EQ(format_rollout(report),
            "doc: aaaaaaaaaaaa (was none): no live worker was on another version; 0 cleared; "
            "0 ms\n");
}

TEST(CtlFormat, ARolloutToTheCurrentVersionSaysSo) {
  nlohmann::json report = {{"kind", "doc"},
                           {"version", kV1},
                           {"previous", kV1},
                           {"workers", nlohmann::json::array()},
                           {"cleared", nlohmann::json::array()},
                           {"failed", 0},
                           {"took_ms", 2}};
  EXPECT_EQ(format_rollout(report),
            "doc: aaaaaaaaaaaa (already current): no live worker was on another version; "
            "0 cleared; 2 ms\n");
}

TEST(CtlFormat, KindsShowVersionFlagsAndKeptVersions) {
  nlohmann::json kinds = {
      {"doc",
       {{"version", kV2},
        {"dirty", true},
        {"rolling", false},
        {"workers", 4},
        {"stale", 1},
        {"versions",
         {{{"version", kV2}, {"current", true}}, {{"version", kV1}, {"current", false}}}}}},
      {"plain",
       {{"version", nullptr},
        {"dirty", false},
        {"rolling", false},
        {"workers", 0},
        {"stale", 0},
        {"versions", nlohmann::json::array()}}}};
  EXPECT_EQ(format_kinds(kinds),
            "KIND   VERSION       DIRTY  ROLLING  WORKERS  STALE  KEPT\n"
            "doc    bbbbbbbbbbbb  yes    no       4        1      bbbbbbbbbbbb* aaaaaaaaaaaa\n"
            "plain  -             no     no       0        0      -\n");
}

TEST(CtlFormat, WorkersShowWhatHoldsThemAndTheIdleStop) {
  nlohmann::json state = {
      {"doc:1",
       {{"status", "running"},
        {"pid", 4242},
        {"version", kV1},
        {"holds", {{"requests", 2}, {"upgraded", 1}, {"busy", 0}}},
        {"idle_since", nullptr},
        {"idle_stop_at", nullptr}}},
      {"doc:2",
       {{"status", "running"},
        {"pid", 4243},
        {"holds", {{"requests", 0}, {"upgraded", 0}, {"busy", 0}}},
        {"idle_since", "2026-12-03T16:00:00Z"},
        {"idle_stop_at", "2026-12-03T16:05:00Z"},
        {"idle_stop_delayed", "a connection waits in the worker's accept queue"}}},
      {"doc:3",
       {{"status", "failed"},
        {"error", {{"message", "The worker stopped answering."}, {"code", "unresponsive"}}},
        {"at", "2026-12-03T16:01:00Z"}}},
      {"doc:4", {{"status", "queued"}, {"queuedAt", "2026-12-03T16:02:00Z"}}},
      {"doc:5",
       {{"status", "running"},
        {"pid", 7},
        {"idle_since", "2026-12-03T16:00:00Z"},
        {"idle_stop_at", "2026-12-03T16:05:00Z"}}}};
  EXPECT_EQ(format_workers(state),
            "ADDRESS  STATUS   PID   HOLDS                         IDLE STOP                       "
            "DETAIL\n"
            "doc:1    running  4242  requests=2 upgraded=1 busy=0  -                               "
            "version aaaaaaaaaaaa\n"
            "doc:2    running  4243  requests=0 upgraded=0 busy=0  2026-12-03T16:05:00Z (delayed)\n"
            "doc:3    failed   -     -                             -                               "
            "unresponsive: The worker stopped answering. (see: corral ctl logs doc:3)\n"
            "doc:4    queued   -     -                             -                               "
            "queued at 2026-12-03T16:02:00Z\n"
            "doc:5    running  7     -                             2026-12-03T16:05:00Z\n");
  EXPECT_EQ(format_workers(nlohmann::json::object()),
            "ADDRESS  STATUS  PID  HOLDS  IDLE STOP  DETAIL\n");
}

TEST(CtlFormat, ProcessesAreAlignedWithTheirUptimeAndTheDrainingOnes) {
  nlohmann::json processes = {{"generation", 3},
                              {"terminating", false},
                              {"processes",
                               {{{"index", 0},
                                 {"pid", 4242},
                                 {"cpu", 0},
                                 {"generation", 3},
                                 {"started_at", 1000},
                                 {"restarts", 0},
                                 {"last_exit", ""},
                                 {"backoff_ms", 0},
                                 {"status", "running"},
                                 {"quic", {{"connections", 2}}}},
                                {{"index", 1},
                                 {"pid", 0},
                                 {"cpu", -1},
                                 {"generation", 3},
                                 {"started_at", 0},
                                 {"restarts", 12},
                                 {"last_exit", "signal 9"},
                                 {"backoff_ms", 800},
                                 {"status", "backoff"}}}},
                              {"draining",
                               {{{"index", 0},
                                 {"pid", 4100},
                                 {"generation", 2},
                                 {"since", 4712},
                                 {"status", "draining"}}}}};
  EXPECT_EQ(format_processes(processes, 4724),
            "generation 3\n"
            "SLOT  PID   CPU  GEN  STATUS   UPTIME  RESTARTS  LAST EXIT  BACKOFF\n"
            "0     4242  0    3    running  1h02m   0         -          -\n"
            "1     -     -    3    backoff  -       12        signal 9   800 ms\n"
            "\n"
            "DRAINING  PID   GEN  STATUS    SINCE\n"
            "0         4100  2    draining  12s\n");
  processes["terminating"] = true;
  processes["draining"] = nlohmann::json::array();
  EXPECT_EQ(format_processes(processes, 1000).substr(0, 27), "generation 3 (terminating)\n");
  EXPECT_EQ(format_processes(processes, 1000).find("DRAINING"), std::string::npos);
}

TEST(CtlFormat, Durations) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59), "59s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(7380), "2h03m");
  EXPECT_EQ(format_duration(4 * 86400 + 7300), "4d02h");
}

TEST(CtlFormat, EveryVerbSaysWhatHappenedInOneLine) {
  EXPECT_EQ(format_action("retry", {{"address", "doc:7"}, {"entry", nullptr}}),
            "doc:7: failure cleared; the next request starts its worker\n");
  EXPECT_EQ(format_action("retry",
                          {{"address", "doc:7"}, {"entry", {{"status", "starting"}, {"pid", 42}}}}),
            "doc:7: retried; starting (pid 42)\n");
  EXPECT_EQ(format_action("stop",
                          {{"address", "doc:7"}, {"entry", {{"status", "stopping"}, {"pid", 42}}}}),
            "doc:7: stopping (pid 42)\n");
  EXPECT_EQ(format_action("stop", {{"address", "doc:7"}, {"entry", nullptr}}), "doc:7: stopped\n");
  EXPECT_EQ(format_action("suspend", {{"address", "doc:7"},
                                      {"entry", {{"status", "suspended"}, {"suspended", true}}}}),
            "doc:7: suspended: its requests get 503 until corral ctl resume doc:7\n");
  EXPECT_EQ(format_action("resume", {{"address", "doc:7"}, {"entry", nullptr}}),
            "doc:7: resumed; the next request starts its worker\n");
  nlohmann::json failed = {
      {"status", "failed"},
      {"error", {{"message", "The worker exited."}, {"code", "worker_exited"}}},
      {"log", "/s/logs/doc.log"}};
  EXPECT_EQ(format_action("stop", {{"address", "doc:7"}, {"entry", failed}}),
            "doc:7: stop: failed: worker_exited: The worker exited.; see: corral ctl logs doc:7\n");
}

TEST(CtlFormat, ARefusalIsOneLineWithWhatToDo) {
  EXPECT_EQ(format_refusal("ctl retry doc:7", 404,
                           R"({"error":{"message":"The address is neither failed nor suspended.",)"
                           R"("code":"not_found"}})"),
            "corral: ctl retry doc:7: The address is neither failed nor suspended. (not_found, "
            "404); see: corral ctl workers");
  EXPECT_EQ(format_refusal("ctl rollout nokind", 404,
                           R"({"error":{"message":"No such kind.","code":"unknown_kind"}})"),
            "corral: ctl rollout nokind: No such kind. (unknown_kind, 404); see: corral ctl kinds");
  EXPECT_EQ(format_refusal("ctl workers", 404, "Not Found\n"),
            "corral: ctl workers: Not Found (404); this corral has no worker kinds");
  EXPECT_EQ(
      format_refusal("ctl stop x", 400, R"({"error":{"message":"Bad.","code":"bad_address"}})"),
      "corral: ctl stop x: Bad. (bad_address, 400)");
}

}  // namespace
}  // namespace corral::cli
