// worker_main in a forked child, driven from the test as the manager would drive it. What the
// example workers cannot show lives here: the forced exit, a throwing setup, a bad environment,
// what a reload hook sees of the context.
// (tests/worker/test_worker_protocol.py covers the protocol end to end with both examples.)
#include "worker/worker.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>
#include <thread>

#include <gtest/gtest.h>

#include "core/socket.h"

namespace corral::worker {
namespace {

namespace fs = std::filesystem;

// A `ready` or `idle` message: `fields` and the counts of what holds the worker (issue 14).
nlohmann::json msg(nlohmann::json fields, uint64_t requests = 0, uint64_t upgraded = 0,
                   uint64_t busy = 0) {
  fields["requests"] = requests;
  fields["upgraded"] = upgraded;
  fields["busy"] = busy;
  return fields;
}

class WorkerProcess {
 public:
  // Forks a child that runs worker_main(setup, options) on fds 3 and 4.
  // `spare`: no CORRAL_ADDRESS, as a warm spare is launched (docs/worker-protocol.md).
  WorkerProcess(SetupFunction setup, WorkerOptions options, bool spare = false) {
    dir_ = fs::temp_directory_path() /
           ("corral-worker-test-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(dir_);
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    auto listener = core::listen_unix((dir_ / "w.sock").string());
    EXPECT_TRUE(listener);
    pid_ = fork();
    if (pid_ == 0) {
      int a = dup(sv[1]), b = dup(listener->get());
      dup2(a, 3);
      dup2(b, 4);
      setenv("CORRAL_CONTROL_FD", "3", 1);
      setenv("CORRAL_LISTEN_FD", "4", 1);
      if (spare)
        unsetenv("CORRAL_ADDRESS");
      else
        setenv("CORRAL_ADDRESS", "test:1", 1);
      setenv("CORRAL_STATE_DIR", dir_.c_str(), 1);
      _exit(worker_main(std::move(setup), std::move(options)));
    }
    close(sv[1]);
    control_.reset(sv[0]);
  }
  ~WorkerProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void send(const std::string& packet) {
    ASSERT_EQ(::send(control_.get(), packet.data(), packet.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(packet.size()));
  }
  // `extra` is merged into the message (e.g. `scripts` and `code`).
  void send_start(const nlohmann::json& extra = nlohmann::json::object()) {
    nlohmann::json m = {
        {"type", "start"}, {"address", "test:1"}, {"start", {{"k", "v"}}}, {"lock", lock_path()}};
    m.update(extra);
    send(m.dump());
  }
  void send_reload(uint64_t id, const std::string& version) {
    send(nlohmann::json{{"type", "reload"},
                        {"id", id},
                        {"scripts", {{{"path", version + ".py"}, {"digest", "00"}}}},
                        {"code", {{"version", version}, {"dir", "/code/" + version}}}}
             .dump());
  }
  std::string lock_path() const { return (dir_ / "test.lock").string(); }
  // The next message that is not an `idle` flip (they come and go with the busy count).
  nlohmann::json recv_skipping_idle(int timeout_ms = 5000) {
    for (;;) {
      nlohmann::json m = recv(timeout_ms);
      if (m.is_null() || m["type"] != "idle") return m;
    }
  }
  // The next message; null on EOF or after timeout_ms.
  nlohmann::json recv(int timeout_ms = 5000) {
    pollfd p{control_.get(), POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return nullptr;
    char buf[65536];
    ssize_t n = ::recv(control_.get(), buf, sizeof buf, 0);
    if (n <= 0) return nullptr;
    return nlohmann::json::parse(std::string_view(buf, static_cast<size_t>(n)));
  }
  // The wait status, or -1 if the child is still running after timeout_ms.
  int wait(int timeout_ms = 5000) {
    core::UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, pid_, 0)));
    pollfd p{pidfd.get(), POLLIN, 0};
    if (!pidfd || poll(&p, 1, timeout_ms) != 1) return -1;
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    reaped_ = true;
    return status;
  }
  const fs::path& dir() const { return dir_; }

 private:
  static inline int counter_ = 0;
  fs::path dir_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  core::UniqueFd control_;
};

TEST(WorkerMain, ForcesItsExitWhenAStopHangs) {
  WorkerOptions options;
  options.force_exit_ms = 300;
  WorkerProcess w(
      [](WorkerContext& ctx, http::SiteBuilder& site) {
        ctx.on_close([] { std::this_thread::sleep_for(std::chrono::seconds(60)); });
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      options);
  w.send_start();
  EXPECT_EQ(w.recv()["type"], "started");
  EXPECT_EQ(w.recv()["type"], "ready");
  auto began = std::chrono::steady_clock::now();
  w.send(R"({"type":"shutdown"})");
  int status = w.wait(3000);
  auto took = std::chrono::steady_clock::now() - began;
  ASSERT_NE(status, -1) << "not exited";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_GE(took, std::chrono::milliseconds(250));
}

TEST(WorkerMain, ThrowingSetupIsAFatalWithTheRedactedErrorAndClosersRun) {
  WorkerOptions options;
  options.redact = [](const std::exception&) {
    return PublicError{"setup failed", "setup_failed", "database"};
  };
  WorkerProcess w(
      [](WorkerContext& ctx, http::SiteBuilder&) {
        // The parent checks what the child saw (a failed EXPECT in the child would go unseen).
        std::string marker = std::string(ctx.state_dir()) + "/closed";
        std::string seen = std::string(ctx.address()) + " " + ctx.start_data().dump();
        ctx.on_close([marker, seen] { std::ofstream(marker) << seen; });
        throw std::runtime_error("password secret-123");
      },
      options);
  w.send_start();
  EXPECT_EQ(w.recv()["type"], "started");
  auto fatal = w.recv();
  EXPECT_EQ(
      fatal,
      (nlohmann::json{
          {"type", "fatal"},
          {"error",
           {{"message", "setup failed"}, {"code", "setup_failed"}, {"reason", "database"}}}}));
  int status = w.wait();
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitFatal);
  std::ifstream closed(w.dir() / "closed");
  std::string seen;
  std::getline(closed, seen);
  EXPECT_EQ(seen, R"(test:1 {"k":"v"})");
}

// A refused allocation (the kind's memory_max as RLIMIT_AS) is reported with the code the
// manager turns into the `memory limit` failure, unless the application's redact gave one.
TEST(WorkerMain, AFailedAllocationIsAFatalWithTheMemoryLimitCode) {
  WorkerProcess w([](WorkerContext&, http::SiteBuilder&) { throw std::bad_alloc(); }, {});
  w.send_start();
  EXPECT_EQ(w.recv()["type"], "started");
  auto fatal = w.recv();
  EXPECT_EQ(fatal["type"], "fatal");
  EXPECT_EQ(fatal["error"]["code"], "memory_limit") << fatal.dump();
  EXPECT_EQ(fatal["error"]["message"], "internal error");
  EXPECT_NE(w.wait(), -1);
}

TEST(WorkerMain, ASpareRunsPrepareSaysStandbyAndTakesItsAddressFromStart) {
  WorkerOptions options;
  options.prepare = [](WorkerContext& ctx) {
    // Before `start`: no address; what it leaves is what setup finds.
    std::string marker = std::string(ctx.state_dir()) + "/prepared";
    std::ofstream(marker) << "[" << ctx.address() << "]";
    ctx.on_close([marker] { std::ofstream(marker, std::ios::app) << " closed"; });
  };
  WorkerProcess w(
      [](WorkerContext& ctx, http::SiteBuilder& site) {
        std::ifstream in(std::string(ctx.state_dir()) + "/prepared");
        std::string prepared;
        std::getline(in, prepared);
        std::ofstream(std::string(ctx.state_dir()) + "/setup") << prepared << " " << ctx.address();
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      options, /*spare=*/true);
  EXPECT_EQ(w.recv()["type"], "standby");
  w.send_start();
  EXPECT_EQ(w.recv()["type"], "started");
  EXPECT_EQ(w.recv()["type"], "ready");
  w.send(R"({"type":"shutdown"})");
  int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitOk);
  std::ifstream setup(w.dir() / "setup"), prepared(w.dir() / "prepared");
  std::string seen, after;
  std::getline(setup, seen);
  std::getline(prepared, after);
  EXPECT_EQ(seen, "[] test:1");
  EXPECT_EQ(after, "[] closed");  // a closer registered in prepare ran at the stop
}

TEST(WorkerMain, AThrowingPrepareIsAFatal) {
  WorkerOptions options;
  options.redact = [](const std::exception&) { return PublicError{"prepare failed", "", ""}; };
  options.prepare = [](WorkerContext&) { throw std::runtime_error("no model"); };
  WorkerProcess w([](WorkerContext&, http::SiteBuilder&) {}, options, /*spare=*/true);
  EXPECT_EQ(w.recv(),
            (nlohmann::json{{"type", "fatal"}, {"error", {{"message", "prepare failed"}}}}));
  int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitFatal);
}

TEST(WorkerMain, RoutesThatDoNotBuildAreFatal) {
  WorkerProcess w(
      [](WorkerContext&, http::SiteBuilder& site) {
        site.route("GET /a", [](http::Request&) { return http::Response::text("a"); });
        site.route("GET /a", [](http::Request&) { return http::Response::text("b"); });
      },
      {});
  w.send_start();
  EXPECT_EQ(w.recv()["type"], "started");
  auto fatal = w.recv();
  EXPECT_EQ(fatal["type"], "fatal");
  EXPECT_EQ(fatal["error"], (nlohmann::json{{"message", "internal error"}}));
  int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitFatal);
}

TEST(WorkerMain, BusyCountHoldsIdleAcrossReady) {
  WorkerProcess w(
      [](WorkerContext& ctx, http::SiteBuilder& site) {
        ctx.busy_add(1);  // e.g. a load started in setup
        auto* t = new core::Timer(ctx.loop().timers(), [&ctx] { ctx.busy_add(-1); });
        ctx.on_close([t] { delete t; });
        t->arm_after(100);
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      {});
  w.send_start();
  EXPECT_EQ(w.recv()["type"], "started");
  EXPECT_EQ(w.recv(), msg({{"type", "ready"}, {"idle", false}, {"ping", true}}, 0, 0, 1));
  EXPECT_EQ(w.recv(), msg({{"type", "idle"}, {"idle", true}}));
  w.send(R"({"type":"shutdown"})");
  int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The hook sees the new set; the context shows it only once the hook returned.
TEST(WorkerMain, ReloadRunsTheHookAndThenTheContextHasTheNewSet) {
  WorkerProcess w(
      [](WorkerContext& ctx, http::SiteBuilder& site) {
        ctx.on_reload([&ctx](const CodeUpdate& u) {
          return nlohmann::json{{"before", ctx.code_version()},
                                {"before_dir", ctx.code_dir()},
                                {"before_scripts", ctx.scripts()},
                                {"new", u.version},
                                {"dir", u.dir},
                                {"scripts", u.scripts}};
        });
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      {});
  nlohmann::json v1_scripts = {{{"path", "app.py"}, {"digest", "11"}}};
  w.send_start({{"scripts", v1_scripts}, {"code", {{"version", "v1"}, {"dir", "/code/v1"}}}});
  EXPECT_EQ(w.recv()["type"], "started");
  EXPECT_EQ(w.recv(), msg({{"type", "ready"}, {"idle", true}, {"reload", true}, {"ping", true}}));
  w.send_reload(1, "v2");
  // Busy while the hook runs: `idle:false` before the reply.
  EXPECT_EQ(w.recv(), msg({{"type", "idle"}, {"idle", false}}, 0, 0, 1));
  auto r1 = w.recv();
  EXPECT_EQ(r1["type"], "reloaded");
  EXPECT_EQ(r1["id"], 1);
  EXPECT_EQ(r1["version"], "v2");
  EXPECT_EQ(r1["report"]["before"], "v1");
  EXPECT_EQ(r1["report"]["before_dir"], "/code/v1");
  EXPECT_EQ(r1["report"]["before_scripts"], v1_scripts);
  EXPECT_EQ(r1["report"]["new"], "v2");
  EXPECT_EQ(r1["report"]["dir"], "/code/v2");
  EXPECT_EQ(r1["report"]["scripts"], (nlohmann::json{{{"path", "v2.py"}, {"digest", "00"}}}));
  EXPECT_EQ(w.recv(), msg({{"type", "idle"}, {"idle", true}}));
  w.send_reload(2, "v3");
  auto r2 = w.recv_skipping_idle();
  EXPECT_EQ(r2["id"], 2);
  EXPECT_EQ(r2["report"]["before"], "v2");
  EXPECT_EQ(r2["report"]["before_dir"], "/code/v2");
  EXPECT_EQ(r2["report"]["before_scripts"],
            (nlohmann::json{{{"path", "v2.py"}, {"digest", "00"}}}));
  w.send(R"({"type":"shutdown"})");
  int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A set sent by reference (code.manifest, what the manager sends): the library reads the
// manifest, so scripts() and the hook's update have the files; one that cannot be read fails the
// start (`fatal`) or the reload (its error), never the worker's old set.
TEST(WorkerMain, TheFilesOfASetSentByReferenceAreReadFromItsManifest) {
  WorkerProcess w(
      [](WorkerContext& ctx, http::SiteBuilder& site) {
        ctx.on_reload([&ctx](const CodeUpdate& u) {
          // Counts and the last path: 3,000 entries would not fit this test's receive buffer.
          return nlohmann::json{{"before", ctx.scripts().size()},
                                {"files", u.scripts.size()},
                                {"last", u.scripts.empty() ? "" : u.scripts.back()["path"]}};
        });
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      {});
  auto manifest = [&](const std::string& version, size_t files) {
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < files; ++i)
      list.push_back({{"path", "f" + std::to_string(i) + ".py"}, {"digest", "00"}});
    std::string path = (w.dir() / (version + ".json")).string();
    std::ofstream(path) << nlohmann::json{{"version", version}, {"files", list}};
    return path;
  };
  w.send_start(
      {{"code", {{"version", "v1"}, {"dir", "/code/v1"}, {"manifest", manifest("v1", 3)}}}});
  EXPECT_EQ(w.recv()["type"], "started");
  EXPECT_EQ(w.recv()["type"], "ready");
  // 3,000 files: more than a control packet could carry inline.
  w.send(nlohmann::json{
      {"type", "reload"},
      {"id", 1},
      {"code", {{"version", "v2"}, {"dir", "/code/v2"}, {"manifest", manifest("v2", 3000)}}}}
             .dump());
  auto r1 = w.recv_skipping_idle();
  ASSERT_EQ(r1["type"], "reloaded") << r1.dump();
  EXPECT_EQ(r1["report"]["before"], 3u);
  EXPECT_EQ(r1["report"]["files"], 3000u);
  EXPECT_EQ(r1["report"]["last"], "f2999.py");
  // A manifest that is not the set's: the reload fails, the worker stays on v2.
  w.send(nlohmann::json{
      {"type", "reload"},
      {"id", 2},
      {"code", {{"version", "v3"}, {"dir", "/code/v3"}, {"manifest", manifest("v2", 1)}}}}
             .dump());
  auto r2 = w.recv_skipping_idle();
  EXPECT_EQ(r2["id"], 2);
  EXPECT_EQ(r2["version"], "v3");
  EXPECT_EQ(r2["error"]["code"], "code_manifest_failed") << r2.dump();
  w.send(R"({"type":"shutdown"})");
  int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(WorkerMain, AStartWhoseManifestCannotBeReadIsFatal) {
  WorkerProcess w(
      [](WorkerContext&, http::SiteBuilder& site) {
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      {});
  w.send_start(
      {{"code", {{"version", "v1"}, {"dir", "/code/v1"}, {"manifest", "/nonexistent/v1.json"}}}});
  auto m = w.recv();
  EXPECT_EQ(m["type"], "fatal") << m.dump();
  EXPECT_EQ(m["error"]["code"], "code_manifest_failed");
  int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
}

TEST(WorkerMain, ThrowingReloadIsRedactedAndTheOldSetStays) {
  WorkerOptions options;
  options.redact = [](const std::exception&) {
    return PublicError{"the set is refused", "bad_set", "syntax"};
  };
  WorkerProcess w(
      [](WorkerContext& ctx, http::SiteBuilder& site) {
        ctx.on_reload([&ctx](const CodeUpdate& u) -> nlohmann::json {
          if (u.version == "bad") throw std::runtime_error("password secret-123");
          if (u.version == "worse") throw 42;
          return {{"before", ctx.code_version()}};
        });
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      options);
  w.send_start({{"code", {{"version", "v1"}, {"dir", "/code/v1"}}}});
  EXPECT_EQ(w.recv()["type"], "started");
  EXPECT_EQ(w.recv()["type"], "ready");
  w.send_reload(1, "bad");
  w.send_reload(2, "worse");
  w.send_reload(3, "v2");
  nlohmann::json error = {
      {"message", "the set is refused"}, {"code", "bad_set"}, {"reason", "syntax"}};
  EXPECT_EQ(
      w.recv_skipping_idle(),
      (nlohmann::json{{"type", "reloaded"}, {"id", 1}, {"version", "bad"}, {"error", error}}));
  EXPECT_EQ(
      w.recv_skipping_idle(),
      (nlohmann::json{{"type", "reloaded"}, {"id", 2}, {"version", "worse"}, {"error", error}}));
  auto ok = w.recv_skipping_idle();
  EXPECT_EQ(ok["id"], 3);
  EXPECT_EQ(ok["report"], (nlohmann::json{{"before", "v1"}}));  // the failed sets never ran
  w.send(R"({"type":"shutdown"})");
  ASSERT_NE(w.wait(), -1);
}

// Reloads that arrive while the worker waits for its lock (before `ready`) are applied in order
// once `ready` was sent; without a hook each is answered `no_reload`.
TEST(WorkerMain, ReloadsBeforeReadyWaitAndNoHookIsNoReload) {
  WorkerProcess w(
      [](WorkerContext&, http::SiteBuilder& site) {
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      {});
  core::UniqueFd held(::open(w.lock_path().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(held);
  ASSERT_EQ(::flock(held.get(), LOCK_EX), 0);  // the worker waits for it after `start`
  w.send_start();
  w.send_reload(1, "v2");
  w.send_reload(2, "v3");
  EXPECT_TRUE(w.recv(200).is_null());  // nothing before the lock
  held.reset();
  EXPECT_EQ(w.recv()["type"], "started");
  EXPECT_EQ(w.recv(), msg({{"type", "ready"}, {"idle", true}, {"ping", true}}));  // no "reload"
  nlohmann::json no_reload = {{"message", "This worker cannot reload in place."},
                              {"code", "no_reload"}};
  EXPECT_EQ(
      w.recv(),
      (nlohmann::json{{"type", "reloaded"}, {"id", 1}, {"version", "v2"}, {"error", no_reload}}));
  EXPECT_EQ(
      w.recv(),
      (nlohmann::json{{"type", "reloaded"}, {"id", 2}, {"version", "v3"}, {"error", no_reload}}));
  w.send(R"({"type":"shutdown"})");
  ASSERT_NE(w.wait(), -1);
}

TEST(WorkerMain, ReloadDuringAStopIsIgnored) {
  bool ran = false;
  WorkerProcess w(
      [&ran](WorkerContext& ctx, http::SiteBuilder& site) {
        ctx.on_reload([&ran](const CodeUpdate&) {
          ran = true;
          return nlohmann::json();
        });
        // The parent sees whether the hook ran: the closer exits 3 if it did.
        ctx.on_close([&ran] {
          if (ran) _exit(3);
        });
        site.route("GET /", [](http::Request&) { return http::Response::text("ok"); });
      },
      {});
  w.send_start();
  EXPECT_EQ(w.recv()["type"], "started");
  EXPECT_EQ(w.recv()["type"], "ready");
  w.send(R"({"type":"shutdown"})");
  w.send_reload(1, "v2");
  EXPECT_TRUE(w.recv_skipping_idle().is_null());  // EOF: no `reloaded`
  int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(WorkerMain, RefusesToRunWithoutAManager) {
  pid_t pid = fork();
  if (pid == 0) {
    unsetenv("CORRAL_CONTROL_FD");
    unsetenv("CORRAL_LISTEN_FD");
    _exit(worker_main([](WorkerContext&, http::SiteBuilder&) {}));
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitBadEnvironment);
}

}  // namespace
}  // namespace corral::worker
