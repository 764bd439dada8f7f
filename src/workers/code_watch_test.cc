// CodeWatcher with real inotify on a fresh mkdtemp directory, driven by a real core::EventLoop:
// each test runs the loop until the callback came or a bound of a few seconds passed. "No more
// calls" is checked by running the loop for a few settle periods more (there is no event to wait
// for when nothing must happen). The burst test uses the loop's injectable clock, so that "20
// writes within the settle window" does not depend on how fast the machine runs.
#include "workers/code_watch.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace corral::workers {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kSettleMs = 100;
constexpr uint64_t kBoundMs = 5000;

class CodeWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TMPDIR");
    std::string base = std::string(tmp && *tmp ? tmp : "/tmp") + "/code_watch_test.XXXXXX";
    ASSERT_NE(mkdtemp(base.data()), nullptr);
    top_ = base;
    dir_ = top_ + "/code";
    fs::create_directories(dir_);
  }
  void TearDown() override {
    watcher_.reset();
    std::error_code ec;
    fs::remove_all(top_, ec);
  }

  // The loop outlives the watcher (members are destroyed in reverse order).
  core::EventLoop& make_loop(core::EventLoop::Clock clock = core::monotonic_ms) {
    loop_.emplace(std::move(clock));
    return *loop_;
  }
  void watch(core::EventLoop& loop, uint32_t settle_ms = kSettleMs) {
    auto w = CodeWatcher::create(loop, log_, dir_, settle_ms, [this] { ++calls_; });
    ASSERT_TRUE(w.ok()) << w.error().reason;
    watcher_ = std::move(*w);
  }
  static void write(const std::string& path, const std::string& content) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  }
  // Runs the loop until `calls_` reaches `n` or the bound passes; true if it did.
  bool run_until_calls(core::EventLoop& loop, int n) {
    uint64_t deadline = core::monotonic_ms() + kBoundMs;
    while (calls_ < n && core::monotonic_ms() < deadline) loop.run_once(20);
    return calls_ >= n;
  }
  void run_for(core::EventLoop& loop, uint64_t ms) {
    uint64_t deadline = core::monotonic_ms() + ms;
    while (core::monotonic_ms() < deadline) loop.run_once(10);
  }

  std::string top_, dir_;
  core::Logger log_{2, core::LogLevel::kWarn};
  std::optional<core::EventLoop> loop_;
  std::unique_ptr<CodeWatcher> watcher_;
  int calls_ = 0;
};

TEST_F(CodeWatchTest, AWriteIsOneChangeAfterTheSettle) {
  core::EventLoop& loop = make_loop();
  watch(loop);
  uint64_t t0 = core::monotonic_ms();
  write(dir_ + "/app.py", "v = 1\n");
  ASSERT_TRUE(run_until_calls(loop, 1));
  EXPECT_GE(core::monotonic_ms() - t0, kSettleMs);
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 1);
  // The next change is a call of its own.
  write(dir_ + "/app.py", "v = 2\n");
  ASSERT_TRUE(run_until_calls(loop, 2));
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 2);
}

TEST_F(CodeWatchTest, ABurstWithinTheSettleIsOneChange) {
  uint64_t now = 1'000'000;
  core::EventLoop& loop = make_loop([&] { return now; });
  watch(loop);
  for (int i = 0; i < 20; ++i) {
    write(dir_ + "/f" + std::to_string(i % 3), std::to_string(i));
    // The write's events are queued before write() returns: this pass reads them.
    loop.run_once(1000);
    now += kSettleMs / 4;  // 20 writes over 5 settle periods, never a quiet one
    loop.run_once(0);
    ASSERT_EQ(calls_, 0) << i;
  }
  now += kSettleMs;
  loop.run_once(0);
  EXPECT_EQ(calls_, 1);
  now += 10 * kSettleMs;
  loop.run_once(0);
  loop.run_once(0);
  EXPECT_EQ(calls_, 1);
}

TEST_F(CodeWatchTest, AFileInANewSubdirectoryIsSeen) {
  core::EventLoop& loop = make_loop();
  watch(loop);
  fs::create_directory(dir_ + "/lib");
  ASSERT_TRUE(run_until_calls(loop, 1));
  write(dir_ + "/lib/util.py", "x");
  ASSERT_TRUE(run_until_calls(loop, 2));
  // Several levels at once: the levels made before their parent's watch are found by listing.
  fs::create_directories(dir_ + "/a/b/c");
  ASSERT_TRUE(run_until_calls(loop, 3));
  write(dir_ + "/a/b/c/deep.py", "x");
  ASSERT_TRUE(run_until_calls(loop, 4));
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 4);
}

TEST_F(CodeWatchTest, ExistingSubdirectoriesAreWatched) {
  fs::create_directories(dir_ + "/x/y");
  core::EventLoop& loop = make_loop();
  watch(loop);
  write(dir_ + "/x/y/z.txt", "z");
  ASSERT_TRUE(run_until_calls(loop, 1));
}

TEST_F(CodeWatchTest, ARenameIntoTheDirectoryIsSeen) {
  write(top_ + "/staged.py", "new");  // outside the watched directory
  core::EventLoop& loop = make_loop();
  watch(loop);
  ASSERT_EQ(rename((top_ + "/staged.py").c_str(), (dir_ + "/app.py").c_str()), 0);
  ASSERT_TRUE(run_until_calls(loop, 1));
  // An editor's save: a dot-named temp file written, then renamed over the file.
  write(dir_ + "/.app.py.tmp", "newer");
  ASSERT_EQ(rename((dir_ + "/.app.py.tmp").c_str(), (dir_ + "/app.py").c_str()), 0);
  ASSERT_TRUE(run_until_calls(loop, 2));
}

TEST_F(CodeWatchTest, DeleteAndChmodAreSeen) {
  write(dir_ + "/app.py", "x");
  core::EventLoop& loop = make_loop();
  watch(loop);
  ASSERT_EQ(chmod((dir_ + "/app.py").c_str(), 0600), 0);
  ASSERT_TRUE(run_until_calls(loop, 1));
  fs::remove(dir_ + "/app.py");
  ASSERT_TRUE(run_until_calls(loop, 2));
}

TEST_F(CodeWatchTest, NoEventNoCall) {
  core::EventLoop& loop = make_loop();
  watch(loop);
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 0);
  // Names beginning with '.' are not in the current set: no rollout for them.
  write(dir_ + "/.app.py.swp", "swap");
  fs::create_directories(dir_ + "/.git");
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 0);
}

TEST_F(CodeWatchTest, DotDirectoriesAreNotWatched) {
  fs::create_directories(dir_ + "/.git/objects");
  core::EventLoop& loop = make_loop();
  watch(loop);
  write(dir_ + "/.git/index", "i");
  write(dir_ + "/.git/objects/ab", "o");
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 0);
}

TEST_F(CodeWatchTest, ADirectoryMovedOutIsNoLongerWatched) {
  fs::create_directories(dir_ + "/lib/sub");
  core::EventLoop& loop = make_loop();
  watch(loop);
  ASSERT_EQ(rename((dir_ + "/lib").c_str(), (top_ + "/lib").c_str()), 0);
  ASSERT_TRUE(run_until_calls(loop, 1));
  write(top_ + "/lib/sub/f.py", "x");
  write(top_ + "/lib/g.py", "x");
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 1);
  // Moved back in: watched again.
  ASSERT_EQ(rename((top_ + "/lib").c_str(), (dir_ + "/lib").c_str()), 0);
  ASSERT_TRUE(run_until_calls(loop, 2));
  write(dir_ + "/lib/sub/h.py", "x");
  ASSERT_TRUE(run_until_calls(loop, 3));
}

TEST(ParentEventTest, OnlyTheDirectorysNameMovesThePath) {
  EXPECT_EQ(parent_event(IN_CREATE | IN_ISDIR, "code", "code"), PathChange::kReplaced);
  EXPECT_EQ(parent_event(IN_MOVED_TO | IN_ISDIR, "code", "code"), PathChange::kReplaced);
  EXPECT_EQ(parent_event(IN_CREATE, "code", "code"), PathChange::kReplaced);  // a symlink
  EXPECT_EQ(parent_event(IN_DELETE | IN_ISDIR, "code", "code"), PathChange::kGone);
  EXPECT_EQ(parent_event(IN_MOVED_FROM | IN_ISDIR, "code", "code"), PathChange::kGone);
  EXPECT_EQ(parent_event(IN_CREATE | IN_ISDIR, "code.new", "code"), PathChange::kNone);
  EXPECT_EQ(parent_event(IN_MOVED_FROM | IN_ISDIR, "code.old", "code"), PathChange::kNone);
  EXPECT_EQ(parent_event(IN_CREATE, "", "code"), PathChange::kNone);
  EXPECT_EQ(parent_event(IN_ATTRIB | IN_ISDIR, "code", "code"), PathChange::kNone);
}

// What deploy tools do: the old directory moved aside, the new one moved to its name.
TEST_F(CodeWatchTest, ADirectoryReplacedByRenameIsFollowed) {
  write(dir_ + "/app.py", "v = 1\n");
  fs::create_directories(top_ + "/code.new/lib");
  write(top_ + "/code.new/app.py", "v = 2\n");
  core::EventLoop& loop = make_loop();
  watch(loop);
  ASSERT_EQ(rename(dir_.c_str(), (top_ + "/code.old").c_str()), 0);
  ASSERT_EQ(rename((top_ + "/code.new").c_str(), dir_.c_str()), 0);
  ASSERT_TRUE(run_until_calls(loop, 1));  // the replacement is a change
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 1);
  // Edits to the new directory (and its subdirectories) are seen...
  write(dir_ + "/app.py", "v = 3\n");
  ASSERT_TRUE(run_until_calls(loop, 2));
  write(dir_ + "/lib/util.py", "u\n");
  ASSERT_TRUE(run_until_calls(loop, 3));
  // ...and those to the old one are not.
  write(top_ + "/code.old/app.py", "old\n");
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 3);
}

TEST_F(CodeWatchTest, ADirectoryRemovedAndMadeAgainIsFollowed) {
  fs::create_directories(dir_ + "/lib");
  write(dir_ + "/lib/app.py", "v = 1\n");
  core::EventLoop& loop = make_loop();
  watch(loop);
  fs::remove_all(dir_);
  // Nothing at the path: no change to roll out, however long it stays so.
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 0);
  fs::create_directory(dir_);
  ASSERT_TRUE(run_until_calls(loop, 1));
  fs::create_directory(dir_ + "/lib");
  write(dir_ + "/lib/app.py", "v = 2\n");
  ASSERT_TRUE(run_until_calls(loop, 2));
}

TEST_F(CodeWatchTest, ASymlinkSwappedToAnotherDirectoryIsFollowed) {
  fs::create_directories(top_ + "/r1");
  fs::create_directories(top_ + "/r2");
  fs::create_directory_symlink(top_ + "/r1", top_ + "/current");
  core::EventLoop& loop = make_loop();
  auto w = CodeWatcher::create(loop, log_, top_ + "/current", kSettleMs, [this] { ++calls_; });
  ASSERT_TRUE(w.ok()) << w.error().reason;
  watcher_ = std::move(*w);
  // `ln -s r2 tmp; mv -T tmp current`: the path now leads to r2.
  fs::create_directory_symlink(top_ + "/r2", top_ + "/tmp-link");
  ASSERT_EQ(rename((top_ + "/tmp-link").c_str(), (top_ + "/current").c_str()), 0);
  ASSERT_TRUE(run_until_calls(loop, 1));
  write(top_ + "/r2/app.py", "x");
  ASSERT_TRUE(run_until_calls(loop, 2));
  write(top_ + "/r1/app.py", "x");
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 2);
}

TEST_F(CodeWatchTest, PythonBytecodeIsNotAChange) {
  write(dir_ + "/app.py", "x");
  core::EventLoop& loop = make_loop();
  watch(loop);
  // What `python3 app.py` importing from the directory writes beside it.
  fs::create_directories(dir_ + "/__pycache__");
  write(dir_ + "/__pycache__/app.cpython-311.pyc", "bytecode");
  write(dir_ + "/old.pyc", "bytecode");
  run_for(loop, 3 * kSettleMs);
  EXPECT_EQ(calls_, 0);
  write(dir_ + "/app.py", "y");
  ASSERT_TRUE(run_until_calls(loop, 1));
}

TEST_F(CodeWatchTest, AMissingDirectoryIsAnErrorNamingIt) {
  core::EventLoop& loop = make_loop();
  auto w = CodeWatcher::create(loop, log_, top_ + "/nope", kSettleMs, [] {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, ENOENT);
  EXPECT_NE(w.error().reason.find(top_ + "/nope"), std::string::npos) << w.error().reason;
  write(top_ + "/file", "x");
  w = CodeWatcher::create(loop, log_, top_ + "/file", kSettleMs, [] {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, ENOTDIR);
}

TEST_F(CodeWatchTest, ASymlinkedRootIsFollowed) {
  fs::create_directory_symlink(dir_, top_ + "/link");
  core::EventLoop& loop = make_loop();
  auto w = CodeWatcher::create(loop, log_, top_ + "/link", kSettleMs, [this] { ++calls_; });
  ASSERT_TRUE(w.ok()) << w.error().reason;
  watcher_ = std::move(*w);
  write(dir_ + "/app.py", "x");
  ASSERT_TRUE(run_until_calls(loop, 1));
}

}  // namespace
}  // namespace corral::workers
