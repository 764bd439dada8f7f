// Rollouts (issue 13) over a real CodeStore and a real Manager (with tests/workers/fake_worker.py
// for the tests that start a worker): prepare, refusals, serialisation and coalescing of calls,
// rollback by `to`, collection of old versions, state(), --watch. The loop runs with run_once,
// bounded by a deadline per wait; no sleeps.
#include "workers/rollouts.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace corral::workers {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& content) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::trunc) << content;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// What one rollout() call got.
struct Answer {
  bool done = false;
  std::optional<RolloutReport> report;
  std::optional<RolloutRefusal> refusal;
};

class RolloutsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral-rollouts-XXXXXX";
    root_ = mkdtemp(tmpl);
    state_ = root_ + "/state";
    code_ = root_ + "/apps/doc";
    fs::create_directories(state_);
    write_file(code_ + "/hello.txt", "v1\n");
    log_path_ = root_ + "/supervisor.log";
    log_fd_.reset(::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    log_ = std::make_unique<core::Logger>(log_fd_.get(), core::LogLevel::kDebug);
    KindConfig doc;
    doc.name = "doc";
    doc.command = {CORRAL_PYTHON, "-S", CORRAL_FAKE_WORKER};
    doc.routes = {"/doc/{id}/*"};
    doc.code_dir = code_;
    doc.start_timeout_ms = 10'000;
    doc.stop_grace_ms = 2'000;
    doc.reload_timeout_ms = 5'000;
    doc.start_hook = [](std::string_view) { return nlohmann::json::object(); };
    KindConfig plain = doc;
    plain.name = "plain";
    plain.routes = {"/plain/{id}/*"};
    plain.code_dir.clear();
    options_.state_dir = state_;
    options_.kinds = {doc, plain};
  }
  void TearDown() override {
    rollouts_.reset();
    if (manager_) {
      bool closed = false;
      manager_->close([&closed] { closed = true; });
      run_until([&] { return closed; });
    }
    manager_.reset();
    fs::remove_all(root_);
  }

  // prepare, Manager::create, Rollouts: what services.cc does.
  Rollouts& make() {
    auto p = Rollouts::prepare(state_, options_);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().reason);
    auto m = Manager::create(loop_, *log_, options_, nullptr);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().reason);
    manager_ = std::move(m.value());
    rollouts_ = std::make_unique<Rollouts>(loop_, *log_, *manager_, state_, options_.kinds);
    return *rollouts_;
  }

  bool run_until(const std::function<bool()>& done, int timeout_ms = 10'000) {
    uint64_t deadline = core::monotonic_ms() + static_cast<uint64_t>(timeout_ms);
    while (!done()) {
      if (core::monotonic_ms() > deadline) return false;
      loop_.run_once(20);
    }
    return true;
  }

  // Starts a rollout; the answer lands in the returned slot (stable: a list element).
  Answer& start(const std::string& kind, std::optional<std::string> to = std::nullopt) {
    Answer& a = answers_.emplace_back();
    rollouts_->rollout(kind, std::move(to),
                       [&a](const RolloutReport* report, const RolloutRefusal* refusal) {
                         EXPECT_FALSE(a.done) << "answered twice";
                         EXPECT_NE(report == nullptr, refusal == nullptr);
                         a.done = true;
                         if (report) a.report = *report;
                         if (refusal) a.refusal = *refusal;
                       });
    return a;
  }
  Answer& roll(const std::string& kind, std::optional<std::string> to = std::nullopt) {
    Answer& a = start(kind, std::move(to));
    EXPECT_TRUE(run_until([&a] { return a.done; })) << kind;
    return a;
  }
  std::string refusal_code(const Answer& a) {
    return a.refusal ? a.refusal->error.value("code", "") : std::string("(not refused)");
  }
  std::string current(const std::string& kind) {
    auto s = rollouts_->state();
    return s[kind]["version"].is_string() ? s[kind]["version"].get<std::string>() : "";
  }
  std::string log() { return read_file(log_path_); }

  core::EventLoop loop_;
  std::string root_, state_, code_, log_path_;
  core::UniqueFd log_fd_;
  std::unique_ptr<core::Logger> log_;
  ManagerOptions options_;
  std::unique_ptr<Manager> manager_;
  std::unique_ptr<Rollouts> rollouts_;
  std::list<Answer> answers_;
};

TEST_F(RolloutsTest, PrepareSnapshotsEveryKindWithCode) {
  ASSERT_TRUE(Rollouts::prepare(state_, options_).ok());
  ASSERT_TRUE(options_.kinds[0].code.has_value());
  const CodeSet& set = *options_.kinds[0].code;
  EXPECT_EQ(set.version.size(), 64u);
  ASSERT_EQ(set.files.size(), 1u);
  EXPECT_EQ(set.files[0].path, "hello.txt");
  EXPECT_EQ(read_file(set.dir + "/hello.txt"), "v1\n");
  EXPECT_FALSE(options_.kinds[1].code.has_value());  // no code_dir: nothing
}

TEST_F(RolloutsTest, PrepareNamesTheKindOfADirectoryThatCannotBeRead) {
  options_.kinds[0].code_dir = root_ + "/no-such-dir";
  auto r = Rollouts::prepare(state_, options_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find("workers.doc.code: "), std::string::npos) << r.error().reason;
  EXPECT_NE(r.error().reason.find("no-such-dir"), std::string::npos) << r.error().reason;
}

TEST_F(RolloutsTest, RefusalsAreAnsweredLaterWithTheirStatusAndCode) {
  make();
  Answer& unknown = start("nope");
  EXPECT_FALSE(unknown.done);  // never before rollout() returns
  ASSERT_TRUE(run_until([&] { return unknown.done; }));
  EXPECT_EQ(refusal_code(unknown), "unknown_kind");
  EXPECT_EQ(unknown.refusal->status, 404);

  Answer& no_code = roll("plain");
  EXPECT_EQ(refusal_code(no_code), "no_code");
  EXPECT_EQ(no_code.refusal->status, 409);

  for (std::string bad : {"abc", "not-hex-at-all", "0123456789abcdef0", "zzzzzzzzzz"}) {
    Answer& a = roll("doc", bad);
    EXPECT_EQ(refusal_code(a), "unknown_version") << bad;
    EXPECT_EQ(a.refusal ? a.refusal->status : 0, 404) << bad;
  }
  std::string v1 = current("doc");
  EXPECT_EQ(refusal_code(roll("doc", v1.substr(0, 7))), "unknown_version");  // too short

  fs::remove_all(code_);
  Answer& gone = roll("doc");
  EXPECT_EQ(refusal_code(gone), "snapshot_failed");
  EXPECT_EQ(gone.refusal->status, 500);
  EXPECT_NE(gone.refusal->error.value("message", "").find(code_), std::string::npos)
      << gone.refusal->error;
  EXPECT_EQ(current("doc"), v1);  // nothing changed
}

TEST_F(RolloutsTest, ARolloutMakesTheDirectorysSetCurrentAndRollsBackByPrefix) {
  make();
  std::string v1 = current("doc");
  ASSERT_EQ(v1.size(), 64u);
  write_file(code_ + "/hello.txt", "v2\n");
  Answer& a = roll("doc");
  ASSERT_TRUE(a.report) << refusal_code(a);
  std::string v2 = a.report->version;
  EXPECT_NE(v2, v1);
  EXPECT_EQ(a.report->previous, v1);
  EXPECT_EQ(a.report->kind, "doc");
  EXPECT_EQ(current("doc"), v2);

  auto s = rollouts_->state();
  ASSERT_EQ(s["doc"]["versions"].size(), 2u) << s;
  EXPECT_EQ(s["doc"]["versions"][0], (nlohmann::json{{"version", v2}, {"current", true}}));
  EXPECT_EQ(s["doc"]["versions"][1], (nlohmann::json{{"version", v1}, {"current", false}}));
  EXPECT_EQ(s["doc"]["code"], code_);
  EXPECT_EQ(s["doc"]["reload"], "auto");
  // stop_grace + 2 x start_timeout + reload_timeout: one replacement's worst case
  EXPECT_EQ(s["doc"]["rollout_timeout_ms"], 27'000);
  EXPECT_TRUE(s["plain"]["version"].is_null());
  EXPECT_TRUE(s["plain"]["code"].is_null());
  EXPECT_EQ(s["plain"]["versions"], nlohmann::json::array());

  Answer& back = roll("doc", v1.substr(0, 8));  // a unique prefix
  ASSERT_TRUE(back.report) << refusal_code(back);
  EXPECT_EQ(back.report->version, v1);
  EXPECT_EQ(back.report->previous, v2);
  EXPECT_EQ(current("doc"), v1);
  s = rollouts_->state();
  EXPECT_EQ(s["doc"]["versions"][0]["version"], v1);  // the rollback is the newest
  EXPECT_EQ(s["doc"]["versions"][0]["current"], true);

  std::string upper = v2.substr(0, 10);
  for (char& c : upper) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  Answer& forward = roll("doc", upper);
  ASSERT_TRUE(forward.report) << refusal_code(forward);
  EXPECT_EQ(forward.report->version, v2);
}

TEST_F(RolloutsTest, CallsOfOneKindRunOneAtATimeAndABurstSharesOneRun) {
  make();
  std::string v1 = current("doc");
  write_file(code_ + "/hello.txt", "v2\n");
  size_t before = count(log(), "rollout_started kind=doc");
  // A burst in one loop round (as --watch's saves or impatient clicks): one run, one report.
  Answer& a = start("doc");
  Answer& b = start("doc");
  Answer& c = start("doc");
  ASSERT_TRUE(run_until([&] { return a.done && b.done && c.done; }));
  ASSERT_TRUE(a.report && b.report && c.report);
  EXPECT_EQ(a.report->version, b.report->version);
  EXPECT_EQ(b.report->version, c.report->version);
  EXPECT_EQ(count(log(), "rollout_started kind=doc"), before + 1) << log();
  std::string v2 = a.report->version;

  // Different targets run in the order asked, each after the one before: a later call never
  // joins an earlier run it would overtake.
  write_file(code_ + "/hello.txt", "v3\n");
  Answer& to_v3 = start("doc");
  Answer& to_v1 = start("doc", v1);
  Answer& again = start("doc");
  ASSERT_TRUE(run_until([&] { return to_v3.done && to_v1.done && again.done; }));
  ASSERT_TRUE(to_v3.report && to_v1.report && again.report);
  EXPECT_NE(to_v3.report->version, v2);
  EXPECT_EQ(to_v1.report->version, v1);
  EXPECT_EQ(to_v1.report->previous, to_v3.report->version);
  EXPECT_EQ(again.report->version, to_v3.report->version);  // the directory again
  EXPECT_EQ(again.report->previous, v1);
  EXPECT_EQ(current("doc"), to_v3.report->version);
  EXPECT_EQ(count(log(), "rollout_started kind=doc"), before + 4) << log();
}

TEST_F(RolloutsTest, OldVersionsAreCollectedAfterARollout) {
  make();
  std::vector<std::string> versions{current("doc")};
  for (size_t i = 2; i <= kKeepVersions + 3; ++i) {
    write_file(code_ + "/hello.txt", "v" + std::to_string(i) + "\n");
    Answer& a = roll("doc");
    ASSERT_TRUE(a.report) << refusal_code(a);
    versions.push_back(a.report->version);
  }
  auto kept = rollouts_->state()["doc"]["versions"];
  ASSERT_EQ(kept.size(), kKeepVersions) << kept;
  for (size_t i = 0; i < kKeepVersions; ++i)
    EXPECT_EQ(kept[i]["version"], versions[versions.size() - 1 - i]);
  std::string versions_dir = state_ + "/code/versions/doc/";
  EXPECT_FALSE(fs::exists(versions_dir + versions[0])) << "collected";
  EXPECT_FALSE(fs::exists(versions_dir + versions[2]));
  EXPECT_TRUE(fs::exists(versions_dir + versions.back()));
  EXPECT_EQ(refusal_code(roll("doc", versions[0])), "unknown_version");
}

TEST_F(RolloutsTest, DestroyedWhileARolloutWaitsNeverCallsBack) {
  make();
  bool called = false;
  rollouts_->rollout("doc", std::nullopt,
                     [&called](const RolloutReport*, const RolloutRefusal*) { called = true; });
  rollouts_->rollout("nope", std::nullopt,
                     [&called](const RolloutReport*, const RolloutRefusal*) { called = true; });
  rollouts_.reset();
  for (int i = 0; i < 20; ++i) loop_.run_once(5);
  EXPECT_FALSE(called);
}

// Needs the merge (r-manager's Manager::rollout): a live worker is brought to the new set and
// the state shows it.
TEST_F(RolloutsTest, ALiveWorkerEndsOnTheNewVersion) {
  make();
  std::optional<Resolution> r;
  manager_->resolve("doc:1", [&r](const Resolution& res) { r = res; });
  ASSERT_TRUE(run_until([&] { return r.has_value(); }));
  ASSERT_TRUE(r->ok()) << r->error;
  std::string v1 = current("doc");
  EXPECT_EQ(manager_->entry("doc:1").value("version", ""), v1);
  write_file(code_ + "/hello.txt", "v2\n");
  Answer& a = roll("doc");
  ASSERT_TRUE(a.report) << refusal_code(a);
  ASSERT_EQ(a.report->workers.size(), 1u) << a.report->to_json();
  EXPECT_EQ(a.report->workers[0]["address"], "doc:1");
  EXPECT_EQ(a.report->failed, 0u);
  auto s = rollouts_->state();
  EXPECT_EQ(s["doc"]["dirty"], false) << s;
  EXPECT_EQ(s["doc"]["stale"], 0) << s;
  // The old version is still kept (among the newest); the running one is in use.
  EXPECT_EQ(manager_->versions_in_use("doc"), std::set<std::string>{a.report->version});
}

// Needs the merge (r-store's CodeWatcher): a saved file is a rollout, logged.
TEST_F(RolloutsTest, WatchRollsOutASavedChange) {
  make();
  std::string v1 = current("doc");
  auto w = rollouts_->watch(20);
  ASSERT_TRUE(w.ok()) << w.error().reason;
  write_file(code_ + "/hello.txt", "v2\n");
  ASSERT_TRUE(run_until([&] { return current("doc") != v1; })) << log();
  EXPECT_NE(log().find("watch_rollout kind=doc trigger=change"), std::string::npos) << log();
}

}  // namespace
}  // namespace corral::workers
