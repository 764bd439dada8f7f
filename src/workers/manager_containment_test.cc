// The manager's containment hooks (containment.h, kind_log.h) with real children
// (tests/workers/contained_worker.py): the cgroup way against a stand-in cgroup directory (an OOM
// kill the test writes into the worker's memory.events, then a SIGKILL as the kernel's would be),
// the rlimit way with a worker that really allocates past RLIMIT_AS, and a kind's log rotating
// under a flood. The loop runs with run_once, bounded by a deadline per wait; no sleeps.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "core/socket.h"
#include "workers/containment.h"
#include "workers/manager.h"

namespace corral::workers {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void put(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string contained_worker() {
  return (fs::path(CORRAL_FAKE_WORKER).parent_path() / "contained_worker.py").string();
}

class ManagerContainmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral-mcont-XXXXXX";
    root_ = mkdtemp(tmpl);
    state_ = root_ + "/state";
    log_fd_.reset(::open((root_ + "/supervisor.log").c_str(),
                         O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    log_ = std::make_unique<core::Logger>(log_fd_.get(), core::LogLevel::kDebug);
    kind_.name = "doc";
    kind_.command = {CORRAL_PYTHON, "-S", contained_worker()};
    kind_.routes = {"/doc/{id}/*"};
    kind_.start_timeout_ms = 10'000;
    kind_.stop_grace_ms = 2'000;
  }
  void TearDown() override {
    manager_.reset();
    fs::remove_all(root_);
  }

  Manager& make(std::unique_ptr<Launcher> launcher) {
    ManagerOptions o;
    o.state_dir = state_;
    o.kinds = {kind_};
    auto m = Manager::create(loop_, *log_, std::move(o), std::move(launcher));
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().reason);
    manager_ = std::move(m.value());
    return *manager_;
  }
  // A stand-in for a delegated cgroup v2 group (its interface files as ordinary files).
  std::unique_ptr<Launcher> cgroup_launcher() {
    group_ = root_ + "/cgroup";
    fs::create_directories(group_);
    put(group_ + "/cgroup.controllers", "cpu memory pids\n");
    put(group_ + "/cgroup.subtree_control", "");
    Containment::Options o;
    o.group_dir = group_;
    o.remove_group = [](const std::string& dir) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      return ec ? -1 : 0;
    };
    auto c = Containment::create(*log_, std::move(o), true);
    EXPECT_EQ(c->mode(), Containment::Mode::cgroup) << c->summary();
    return std::make_unique<ProcessLauncher>(std::move(c));
  }

  bool run_until(const std::function<bool()>& done, int timeout_ms = 20'000) {
    uint64_t deadline = core::monotonic_ms() + static_cast<uint64_t>(timeout_ms);
    while (!done()) {
      if (core::monotonic_ms() > deadline) return false;
      loop_.run_once(20);
    }
    return true;
  }
  Resolution resolve(Manager& m, const std::string& address) {
    std::optional<Resolution> r;
    m.resolve(address, [&r](const Resolution& res) { r = res; });
    EXPECT_TRUE(run_until([&] { return r.has_value(); })) << address;
    return r.value_or(Resolution{});
  }
  std::string status(Manager& m, const std::string& address) {
    auto e = m.entry(address);
    return e.is_null() ? "" : e["status"].get<std::string>();
  }
  // One request to the worker (its answer is not needed).
  core::UniqueFd request(const Resolution& r) {
    auto fd = core::connect_unix(r.socket_path);
    EXPECT_TRUE(fd.ok());
    if (!fd) return {};
    std::string req = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    EXPECT_EQ(::write(fd->get(), req.data(), req.size()), static_cast<ssize_t>(req.size()));
    return std::move(fd.value());
  }

  core::EventLoop loop_;
  std::string root_, state_, group_;
  core::UniqueFd log_fd_;
  std::unique_ptr<core::Logger> log_;
  KindConfig kind_;
  std::unique_ptr<Manager> manager_;
};

TEST_F(ManagerContainmentTest, AnOomKillInTheWorkersGroupFailsItWithTheMemoryLimit) {
  kind_.limits = {64 << 20, 16, 0};
  Manager& m = make(cgroup_launcher());
  auto r = resolve(m, "doc:1");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  int pid = m.entry("doc:1")["pid"].get<int>();
  std::string dir = group_ + "/corral-workers/doc%3A1";
  EXPECT_EQ(slurp(dir + "/cgroup.procs"), std::to_string(pid));
  EXPECT_EQ(slurp(dir + "/memory.max"), std::to_string(64 << 20));
  EXPECT_EQ(slurp(dir + "/pids.max"), "16");
  // What the kernel does at memory.max: counts the kill, then kills.
  put(dir + "/memory.events", "oom 1\noom_kill 1\n");
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(run_until([&] { return status(m, "doc:1") == "failed"; }));
  EXPECT_EQ(m.entry("doc:1")["error"], memory_limit_error());
  EXPECT_FALSE(fs::exists(dir));  // removed after the exit
  // Another crash in a fresh group (retry) is no memory limit: the count starts afresh.
  EXPECT_TRUE(m.retry("doc:1"));
  ASSERT_TRUE(resolve(m, "doc:1").ok());
  pid = m.entry("doc:1")["pid"].get<int>();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(run_until([&] { return status(m, "doc:1") == "failed"; }));
  EXPECT_EQ(m.entry("doc:1")["error"]["code"], "worker_exited");
}

TEST_F(ManagerContainmentTest, AnAskedStopIsNoFailureAndRemovesTheGroup) {
  Manager& m = make(cgroup_launcher());
  ASSERT_TRUE(resolve(m, "doc:2").ok());
  std::string dir = group_ + "/corral-workers/doc%3A2";
  EXPECT_TRUE(fs::exists(dir));
  EXPECT_EQ(slurp(dir + "/memory.max"), "max");
  EXPECT_TRUE(m.stop("doc:2"));
  ASSERT_TRUE(run_until([&] { return m.entry("doc:2").is_null() && m.live_workers() == 0; }));
  EXPECT_FALSE(fs::exists(dir));
}

// Through rlimits: the worker allocates until RLIMIT_AS refuses, reports `fatal` with code
// memory_limit, and the address fails with the reason at once.
TEST_F(ManagerContainmentTest, UnderRlimitsTheWorkersOwnReportIsTheMemoryLimit) {
  kind_.limits = {64 << 20, 0, 0};
  kind_.env = {{"CONTAINED_MODE", "hog"}};
  Manager& m = make(std::make_unique<ProcessLauncher>());
  auto r = resolve(m, "doc:hog");
  ASSERT_TRUE(r.ok()) << r.error.dump();
  auto conn = request(r);
  ASSERT_TRUE(run_until([&] { return status(m, "doc:hog") == "failed"; }));
  EXPECT_EQ(m.entry("doc:hog")["error"], memory_limit_error());
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
  EXPECT_NE(slurp(state_ + "/logs/doc.log").find("MemoryError after"), std::string::npos);
  // Without a memory limit of ours the same report is the worker's error as it sent it.
  EXPECT_FALSE(ended_by_memory_limit({}, m.entry("doc:hog")["error"], {}));
}

TEST_F(ManagerContainmentTest, AFloodRotatesTheKindsLog) {
  kind_.env = {
      {"CONTAINED_MODE", "flood"}, {"CONTAINED_FLOOD_MB", "1"}, {"CONTAINED_LONG_KB", "64"}};
  kind_.log_rotation = {64 * 1024, 2};
  Manager& m = make(std::make_unique<ProcessLauncher>());
  ASSERT_TRUE(resolve(m, "doc:f").ok());
  std::string log = state_ + "/logs/doc.log";
  ASSERT_TRUE(run_until([&] { return slurp(log).find("flood done") != std::string::npos; }));
  EXPECT_TRUE(fs::exists(log + ".1"));
  EXPECT_TRUE(fs::exists(log + ".2"));
  EXPECT_FALSE(fs::exists(log + ".3"));
  for (const auto& f : {log, log + ".1", log + ".2"}) EXPECT_LE(fs::file_size(f), 64u * 1024);
  EXPECT_TRUE(m.stop("doc:f"));
  ASSERT_TRUE(run_until([&] { return m.live_workers() == 0; }));
}

}  // namespace
}  // namespace corral::workers
