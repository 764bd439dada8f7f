// The worker manager's test fixture (manager_test.cc, manager_rollout_test.cc): a Manager on a
// real loop whose children are tests/workers/fake_worker.py (Python standard library), which
// speaks docs/worker-protocol.md and misbehaves as its start data says. The loop runs with
// run_once, bounded by a deadline per wait; no sleeps. Test-only; single-threaded.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "core/socket.h"
#include "workers/manager.h"

namespace corral::workers::manager_testing {

// Counts forks (and records their addresses, in order); the real launcher does the work.
class CountingLauncher final : public ProcessLauncher {
 public:
  CountingLauncher(int& count, std::vector<std::string>& order) : count_(count), order_(order) {}
  core::Result<Launched> launch(const LaunchSpec& spec) override {
    ++count_;
    order_.push_back(spec.address);
    return ProcessLauncher::launch(spec);
  }

 private:
  int& count_;
  std::vector<std::string>& order_;
};

inline size_t open_fds() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the DIR's own fd
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral-workers-XXXXXX";
    state_ = mkdtemp(tmpl);
    log_fd_.reset(::open((state_ + "/supervisor.log").c_str(),
                         O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    log_ = std::make_unique<core::Logger>(log_fd_.get(), core::LogLevel::kDebug);
    kind_.name = "doc";
    kind_.command = {CORRAL_PYTHON, "-S", CORRAL_FAKE_WORKER};
    kind_.routes = {"/doc/{id}/*"};
    kind_.start_timeout_ms = 10'000;
    kind_.stop_grace_ms = 2'000;
    kind_.start_hook = [this](std::string_view address) {
      if (throw_in_hook_) throw std::runtime_error("hook exploded: SECRET-HOOK");
      auto it = data_.find(std::string(address));
      nlohmann::json d = it == data_.end() ? nlohmann::json::object() : it->second;
      d["events"] = state_ + "/events.txt";
      return d;
    };
  }
  void TearDown() override {
    manager_.reset();
    std::filesystem::remove_all(state_);
  }

  Manager& make(uint32_t idle_check_ms = 1'000, std::string state_dir = {}) {
    ManagerOptions o = options_;
    o.state_dir = state_dir.empty() ? state_ : state_dir;
    o.kinds.insert(o.kinds.begin(), kind_);
    o.idle_check_ms = idle_check_ms;
    auto m = Manager::create(loop_, *log_, std::move(o),
                             std::make_unique<CountingLauncher>(forks_, launched_));
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().reason);
    manager_ = std::move(m.value());
    manager_->on_change = [this](const std::string& a, const nlohmann::json& e) {
      changes_.push_back({a, e});
    };
    return *manager_;
  }

  bool run_until(const std::function<bool()>& done, int timeout_ms = 10'000) {
    uint64_t deadline = core::monotonic_ms() + static_cast<uint64_t>(timeout_ms);
    while (!done()) {
      if (core::monotonic_ms() > deadline) return false;
      loop_.run_once(20);
    }
    return true;
  }
  void run_for(int ms) {
    uint64_t deadline = core::monotonic_ms() + static_cast<uint64_t>(ms);
    while (core::monotonic_ms() < deadline) loop_.run_once(20);
  }

  // resolve() and wait for its answer.
  Resolution resolve(Manager& m, const std::string& address, int timeout_ms = 10'000) {
    std::optional<Resolution> r;
    m.resolve(address, [&r](const Resolution& res) { r = res; });
    EXPECT_TRUE(run_until([&] { return r.has_value(); }, timeout_ms)) << address;
    return r.value_or(Resolution{});
  }
  std::string status(Manager& m, const std::string& address) {
    auto e = m.entry(address);
    return e.is_null() ? "" : e["status"].get<std::string>();
  }
  bool gone(Manager& m, const std::string& address) {
    return run_until([&] { return m.entry(address).is_null() && m.live_workers() == 0; });
  }
  std::string supervisor_log() { return read_file(state_ + "/supervisor.log"); }
  // "<monotonic> <pid> <event>" lines the fake workers wrote.
  std::vector<std::tuple<double, int, std::string>> events() {
    std::vector<std::tuple<double, int, std::string>> out;
    std::istringstream in(read_file(state_ + "/events.txt"));
    double t;
    int pid;
    std::string ev;
    while (in >> t >> pid >> ev) out.emplace_back(t, pid, ev);
    return out;
  }
  double event_time(int pid, const std::string& name) {
    for (auto& [t, p, e] : events())
      if (p == pid && e == name) return t;
    return -1;
  }

  core::EventLoop loop_;
  std::string state_;
  core::UniqueFd log_fd_;
  std::unique_ptr<core::Logger> log_;
  KindConfig kind_;
  std::map<std::string, nlohmann::json> data_;
  bool throw_in_hook_ = false;
  int forks_ = 0;
  std::vector<std::string> launched_;  // the addresses forked, in order
  ManagerOptions options_;             // the bounds (and more kinds) for make()
  std::unique_ptr<Manager> manager_;
  std::vector<std::pair<std::string, nlohmann::json>> changes_;
};

}  // namespace corral::workers::manager_testing
