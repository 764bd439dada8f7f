// KindLog (kind_log.h): rotation by size at line boundaries, `keep` files, a line longer than
// the limit in a file of its own, a restart going on with the file it finds, failures reported
// once per spell.
#include "workers/kind_log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace corral::workers {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class KindLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral-kindlog-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/doc.log";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string line(int i, size_t width = 30) {
    std::string s = "doc%3A1 line " + std::to_string(i);
    s.resize(width - 1, '.');
    return s + "\n";
  }
  std::string dir_, path_;
};

TEST_F(KindLogTest, RotatesAtLineBoundariesAndKeepsN) {
  KindLog log(path_, {100, 2});
  std::string all;
  for (int i = 0; i < 20; ++i) {
    all += line(i);
    ASSERT_TRUE(log.write(line(i)).ok());
  }
  // 3 lines of 30 bytes fit in 100: the last 9 lines are in .log.2, .log.1, .log (newest).
  EXPECT_TRUE(fs::exists(path_ + ".1"));
  EXPECT_TRUE(fs::exists(path_ + ".2"));
  EXPECT_FALSE(fs::exists(path_ + ".3"));
  std::string kept = slurp(path_ + ".2") + slurp(path_ + ".1") + slurp(path_);
  for (const auto& p : {path_, path_ + ".1", path_ + ".2"}) EXPECT_LE(fs::file_size(p), 100u);
  EXPECT_EQ(slurp(path_ + ".2"), line(12) + line(13) + line(14));
  EXPECT_EQ(kept, all.substr(all.size() - kept.size()));
  EXPECT_EQ(slurp(path_), line(18) + line(19));
}

TEST_F(KindLogTest, ManyLinesInOneWriteAreSplitAcrossFiles) {
  KindLog log(path_, {100, 5});
  std::string lines;
  for (int i = 0; i < 10; ++i) lines += line(i);
  ASSERT_TRUE(log.write(lines).ok());
  EXPECT_EQ(slurp(path_ + ".3"), line(0) + line(1) + line(2));
  EXPECT_EQ(slurp(path_ + ".2"), line(3) + line(4) + line(5));
  EXPECT_EQ(slurp(path_ + ".1"), line(6) + line(7) + line(8));
  EXPECT_EQ(slurp(path_), line(9));
}

TEST_F(KindLogTest, ALineLongerThanTheLimitIsAFileOfItsOwn) {
  KindLog log(path_, {100, 3});
  ASSERT_TRUE(log.write(line(0)).ok());
  std::string big = line(1, 250);
  ASSERT_TRUE(log.write(big).ok());
  ASSERT_TRUE(log.write(line(2)).ok());
  EXPECT_EQ(slurp(path_ + ".2"), line(0));
  EXPECT_EQ(slurp(path_ + ".1"), big);
  EXPECT_EQ(slurp(path_), line(2));
}

TEST_F(KindLogTest, KeepZeroTruncates) {
  KindLog log(path_, {100, 0});
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(log.write(line(i)).ok());
  EXPECT_FALSE(fs::exists(path_ + ".1"));
  EXPECT_EQ(slurp(path_), line(6));
}

TEST_F(KindLogTest, ARestartGoesOnWithTheFileItFinds) {
  { std::ofstream(path_) << std::string(90, 'x') << "\n"; }
  KindLog log(path_, {100, 3});
  ASSERT_TRUE(log.write(line(0)).ok());  // 91 + 30 > 100: the old file is rotated first
  EXPECT_EQ(fs::file_size(path_ + ".1"), 91u);
  EXPECT_EQ(slurp(path_), line(0));
}

TEST_F(KindLogTest, AFailureIsReportedOncePerSpell) {
  KindLog log(dir_ + "/missing/doc.log", {100, 3});
  EXPECT_FALSE(log.write(line(0)).ok());
  EXPECT_TRUE(log.write(line(1)).ok());  // still failing, already reported
  fs::create_directory(dir_ + "/missing");
  EXPECT_TRUE(log.write(line(2)).ok());
  EXPECT_EQ(slurp(dir_ + "/missing/doc.log"), line(2));
}

TEST_F(KindLogTest, AReopenedLogFollowsItsPath) {
  KindLog log(path_, {1000, 3});
  ASSERT_TRUE(log.write(line(0)).ok());
  fs::rename(path_, path_ + ".moved");   // logrotate's move
  ASSERT_TRUE(log.write(line(1)).ok());  // still the moved file until reopen()
  log.reopen();
  ASSERT_TRUE(log.write(line(2)).ok());
  EXPECT_EQ(slurp(path_ + ".moved"), line(0) + line(1));
  EXPECT_EQ(slurp(path_), line(2));
}

TEST(KindLogLine, TimeAddressPidAndTheEscapedLine) {
  std::string out;
  // 2026-12-05T19:03:33.045Z
  append_kind_log_line(out, 1796497413045, kind_log_address("doc:a b"), 4242, "Trace\x1b[1m\"x\"");
  EXPECT_EQ(out, "2026-12-05T19:03:33.045Z doc:a%20b [4242] Trace\\x1b[1m\"x\"\n");
  EXPECT_TRUE(kind_log_line_of(out, "doc:a%20b"));
  EXPECT_FALSE(kind_log_line_of(out, "doc:a"));
  EXPECT_FALSE(kind_log_line_of(out, "doc:a%20"));
  EXPECT_EQ(kind_log_address("doc:%\xff"), "doc:%25%FF");
}

TEST_F(KindLogTest, TheTailOfOneAddressSpansRotatedFiles) {
  KindLog log(path_, {4096, 2});
  std::string all;
  for (int i = 0; i < 400; ++i) {
    std::string lines;
    append_kind_log_line(lines, 0, i % 2 ? "doc:1" : "doc:2", 7, "line " + std::to_string(i));
    ASSERT_TRUE(log.write(lines).ok());
  }
  ASSERT_TRUE(fs::exists(path_ + ".1"));
  auto tail = tail_kind_log(path_, 2, "doc:1", 100);
  ASSERT_TRUE(tail.ok());
  std::vector<std::string> got;
  std::istringstream in(tail.value());
  for (std::string l; std::getline(in, l);) got.push_back(l);
  ASSERT_EQ(got.size(), 100u) << tail.value();
  for (size_t k = 0; k < got.size(); ++k)  // oldest first, whole lines, only doc:1's
    EXPECT_EQ(got[k], "1970-01-01T00:00:00.000Z doc:1 [7] line " + std::to_string(201 + 2 * k));
  // Fewer than asked: what the files hold (the oldest were rotated away); none for a stranger.
  auto everything = tail_kind_log(path_, 2, "doc:1", 10'000);
  ASSERT_TRUE(everything.ok());
  EXPECT_LT(std::count(everything->begin(), everything->end(), '\n'), 200);
  EXPECT_GT(std::count(everything->begin(), everything->end(), '\n'), 100);
  EXPECT_EQ(tail_kind_log(path_, 2, "doc:3", 10).value(), "");
  // The bytes read are bounded: 1 KiB holds the last few lines only.
  auto bounded = tail_kind_log(path_, 2, "doc:1", 100, 1024);
  ASSERT_TRUE(bounded.ok());
  EXPECT_LT(std::count(bounded->begin(), bounded->end(), '\n'), 20);
  EXPECT_EQ(tail_kind_log(dir_ + "/none.log", 3, "doc:1", 10).value(), "");
}

TEST(KindLogs, OneLogPerKind) {
  char tmpl[] = "/tmp/corral-kindlogs-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  KindLogs logs;
  KindLog& a = logs.of("doc", dir, {});
  EXPECT_EQ(&a, &logs.of("doc", dir, {}));
  EXPECT_EQ(a.path(), dir + "/doc.log");
  EXPECT_NE(&a, &logs.of("room", dir, {}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace corral::workers
