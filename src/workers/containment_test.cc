// Containment (containment.h): the cgroup v2 way against a directory that stands in for the
// cgroup filesystem (these machines' cgroup v2 tree offers no controllers), interface files as
// ordinary files; the rlimits way through a real launch. Nothing here sleeps: a launched child is
// waited for on its pidfd.
#include "workers/containment.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "workers/launcher.h"

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

int count(const std::string& text, const std::string& word) {
  int n = 0;
  for (size_t i = text.find(word); i != std::string::npos; i = text.find(word, i + 1)) ++n;
  return n;
}

std::string read_all(int fd) {
  std::string out;
  char buf[512];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10'000) <= 0) break;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

int wait_exit(const Launched& l) {
  pollfd p{l.pidfd.get(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 10'000), 1);
  int status = 0;
  EXPECT_EQ(waitpid(l.pid, &status, 0), l.pid);
  return status;
}

TEST(ParseSize, UnitsAreBinary) {
  EXPECT_EQ(parse_size("4096").value(), 4096u);
  EXPECT_EQ(parse_size("256M").value(), 256u << 20);
  EXPECT_EQ(parse_size("2G").value(), 2ull << 30);
  EXPECT_EQ(parse_size("1T").value(), 1ull << 40);
  EXPECT_EQ(parse_size("8K").value(), 8192u);
  for (const char* bad : {"", "M", "0", "10MB", "1.5G", "-1", "12 M", "99999999999999999999"})
    EXPECT_FALSE(parse_size(bad).ok()) << bad;
}

// This machine's kind: systemd's hybrid layout, v1 controllers and an empty unified tree.
TEST(Cgroup2GroupDir, HybridLayoutFindsTheUnifiedMount) {
  std::string cgroup = "12:memory:/user.slice\n1:name=systemd:/user.slice\n0::/\n";
  std::string mounts =
      "30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs ro,mode=755\n"
      "31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
      "35 30 0:31 / /sys/fs/cgroup/memory rw shared:15 - cgroup cgroup rw,memory\n";
  EXPECT_EQ(cgroup2_group_dir(cgroup, mounts).value(), "/sys/fs/cgroup/unified");
}

TEST(Cgroup2GroupDir, UnifiedLayoutUnderSystemd) {
  std::string cgroup = "0::/system.slice/corral.service\n";
  std::string mounts = "28 22 0:25 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(cgroup2_group_dir(cgroup, mounts).value(),
            "/sys/fs/cgroup/system.slice/corral.service");
}

TEST(Cgroup2GroupDir, MountOfASubtreeAndEscapes) {
  std::string cgroup = "0::/a b/c\n";
  std::string mounts =
      "40 22 0:25 /other /mnt/x rw - cgroup2 cgroup2 rw\n"
      "41 22 0:25 /a\\040b /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(cgroup2_group_dir(cgroup, mounts).value(), "/mnt/cg two/c");
}

TEST(Cgroup2GroupDir, NoV2GroupOrNoMountIsAnError) {
  auto v1 = cgroup2_group_dir("4:memory:/x\n1:name=systemd:/x\n", "");
  ASSERT_FALSE(v1.ok());
  EXPECT_NE(v1.error().reason.find("cgroup v1 only"), std::string::npos);
  auto unmounted = cgroup2_group_dir("0::/x\n", "31 30 0:27 / /cg rw - cgroup cgroup rw,pids\n");
  ASSERT_FALSE(unmounted.ok());
  EXPECT_NE(unmounted.error().reason.find("no cgroup2"), std::string::npos);
}

TEST(EndedByMemoryLimit, TheGroupsOomKillOrTheWorkersOwnReport) {
  Limits limited{64 << 20, 0, 0}, unlimited{};
  nlohmann::json reported = {{"message", "out of memory"}, {"code", "memory_limit"}};
  nlohmann::json other = {{"message", "x"}, {"code", "E_TEST"}};
  EXPECT_TRUE(ended_by_memory_limit({true}, nullptr, unlimited));
  EXPECT_TRUE(ended_by_memory_limit({}, reported, limited));
  EXPECT_FALSE(ended_by_memory_limit({}, reported, unlimited));  // no limit of ours to blame
  EXPECT_FALSE(ended_by_memory_limit({}, other, limited));
  EXPECT_FALSE(ended_by_memory_limit({}, nullptr, limited));
  EXPECT_EQ(memory_limit_error()["reason"], "memory limit");
  EXPECT_EQ(memory_limit_error()["code"], "memory_limit");
}

// A delegated group holding the supervisor and its server processes (started before the manager)
// can only enable controllers for children once they move to a leaf: only corral's own move.
TEST(OwnProcesses, TheSupervisorAndItsChildrenAreOursTheRestForeign) {
  auto parent_of = [](pid_t p) -> pid_t { return p == 11 || p == 12 ? 10 : p == 13 ? 11 : 1; };
  std::vector<pid_t> foreign;
  EXPECT_EQ(own_processes("10\n11\n12\n", 10, parent_of, &foreign),
            (std::vector<pid_t>{10, 11, 12}));
  EXPECT_TRUE(foreign.empty());
  // 13 is a grandchild (a worker would be in its own group, not here), 99 someone else's.
  EXPECT_EQ(own_processes("10\n13\n99\n", 10, parent_of, &foreign), (std::vector<pid_t>{10}));
  EXPECT_EQ(foreign, (std::vector<pid_t>{13, 99}));
}

class ContainmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral-cgroup-XXXXXX";
    root_ = mkdtemp(tmpl);
    group_ = root_ + "/group";
    fs::create_directory(group_);
    put(group_ + "/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
    put(group_ + "/cgroup.subtree_control", "");
    put(group_ + "/cgroup.procs", "");
    log_fd_ = ::open((root_ + "/log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    log_ = std::make_unique<core::Logger>(log_fd_, core::LogLevel::kDebug);
  }
  void TearDown() override {
    log_.reset();
    ::close(log_fd_);
    fs::remove_all(root_);
  }
  std::unique_ptr<Containment> make(bool wanted = true) {
    Containment::Options o;
    o.group_dir = group_;
    o.remove_group = [](const std::string& dir) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      errno = ec ? ec.value() : 0;
      return ec ? -1 : 0;
    };
    auto c = Containment::create(*log_, std::move(o), wanted);
    log_->flush();
    return c;
  }
  std::string log_text() { return slurp(root_ + "/log"); }

  std::string root_, group_;
  int log_fd_ = -1;
  std::unique_ptr<core::Logger> log_;
};

TEST_F(ContainmentTest, DelegatedGroupGetsAWorkersGroupWithTheControllers) {
  auto c = make();
  ASSERT_EQ(c->mode(), Containment::Mode::cgroup) << c->summary();
  EXPECT_EQ(c->workers_dir(), group_ + "/corral-workers");
  EXPECT_EQ(slurp(group_ + "/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(slurp(group_ + "/corral-workers/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(count(log_text(), "workers_containment"), 1);
  EXPECT_NE(log_text().find("mode=cgroup"), std::string::npos);
}

TEST_F(ContainmentTest, ControllersAlreadyEnabledAreLeftAlone) {
  put(group_ + "/cgroup.subtree_control", "cpu memory pids\n");
  auto c = make();
  ASSERT_EQ(c->mode(), Containment::Mode::cgroup);
  EXPECT_EQ(slurp(group_ + "/cgroup.subtree_control"), "cpu memory pids\n");
}

TEST_F(ContainmentTest, WithoutCpuControllerTheWeightIsNotApplied) {
  put(group_ + "/cgroup.controllers", "memory pids\n");
  auto c = make();
  ASSERT_EQ(c->mode(), Containment::Mode::cgroup);
  EXPECT_EQ(slurp(group_ + "/corral-workers/cgroup.subtree_control"), "+memory +pids");
  EXPECT_NE(c->summary().find("cpu.weight not applied"), std::string::npos);
  auto conf = c->prepare("doc:1", {1 << 20, 5, 300});
  ASSERT_TRUE(conf.ok());
  EXPECT_FALSE(fs::exists(conf->group + "/cpu.weight"));
  c->adopt(std::move(conf.value()), 0);
}

TEST_F(ContainmentTest, AWorkersGroupHasItsLimitsItsPidAndGoesAfterItsExit) {
  auto c = make();
  ASSERT_EQ(c->mode(), Containment::Mode::cgroup);
  // The kernel's optional files, where it has them: written, never created.
  fs::create_directory(group_ + "/corral-workers/doc%3A42");
  put(group_ + "/corral-workers/doc%3A42/memory.oom.group", "0");
  ProcessLauncher launcher(std::move(c));
  LaunchSpec spec;
  spec.command = {"/bin/sh", "-c", "echo $$"};
  spec.address = "doc:42";
  spec.state_dir = root_;
  spec.limits = {64 << 20, 32, 50};
  core::UniqueFd listen(::open("/dev/null", O_RDONLY | O_CLOEXEC));  // any fd 4 will do here
  spec.listen_fd = listen.get();
  auto l = launcher.launch(spec);
  ASSERT_TRUE(l.ok()) << l.error().reason;
  std::string dir = group_ + "/corral-workers/doc%3A42";
  EXPECT_EQ(slurp(dir + "/memory.max"), std::to_string(64 << 20));
  EXPECT_EQ(slurp(dir + "/pids.max"), "32");
  EXPECT_EQ(slurp(dir + "/cpu.weight"), "50");
  EXPECT_EQ(slurp(dir + "/memory.oom.group"), "1");
  EXPECT_FALSE(fs::exists(dir + "/memory.swap.max"));  // not in this "kernel": not made
  std::string out = read_all(l->out.get());
  EXPECT_EQ(wait_exit(l.value()), 0);
  // The child wrote its own pid, before exec: the shell's $$ is the same process.
  EXPECT_EQ(slurp(dir + "/cgroup.procs"), std::to_string(l->pid));
  EXPECT_EQ(out, std::to_string(l->pid) + "\n");
  EXPECT_FALSE(launcher.reaped(l->pid).memory_limit);
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(ContainmentTest, AnOomKillDuringTheWorkersLifeIsItsMemoryLimit) {
  auto c = make();
  ASSERT_EQ(c->mode(), Containment::Mode::cgroup);
  // A group left by an earlier worker of the address, its counter already at 3: only a kill
  // after this start counts.
  std::string dir = group_ + "/corral-workers/doc%3A7";
  fs::create_directory(dir);
  put(dir + "/memory.events", "low 0\nhigh 0\nmax 9\noom 3\noom_kill 3\noom_group_kill 0\n");
  auto conf = c->prepare("doc:7", {1 << 20, 0, 0});
  ASSERT_TRUE(conf.ok()) << conf.error().reason;
  EXPECT_EQ(slurp(dir + "/pids.max"), "max");
  c->adopt(std::move(conf.value()), 4242);
  EXPECT_FALSE(c->reaped(1).memory_limit);  // not one of ours
  put(dir + "/memory.events", "low 0\nhigh 0\nmax 12\noom 4\noom_kill 4\noom_group_kill 1\n");
  EXPECT_TRUE(c->reaped(4242).memory_limit);
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_FALSE(c->reaped(4242).memory_limit);  // once
}

TEST_F(ContainmentTest, StaleGroupsOfAnEarlierSupervisorAreRemoved) {
  fs::create_directories(group_ + "/corral-workers/doc%3Aold");
  auto c = make();
  ASSERT_EQ(c->mode(), Containment::Mode::cgroup);
  EXPECT_FALSE(fs::exists(group_ + "/corral-workers/doc%3Aold"));
}

TEST_F(ContainmentTest, NoControllersFallsBackToRlimitsWithOneWarning) {
  put(group_ + "/cgroup.controllers", "\n");  // as on these machines' unified tree
  auto c = make();
  EXPECT_EQ(c->mode(), Containment::Mode::rlimits);
  std::string log = log_text();
  EXPECT_EQ(count(log, "workers_containment"), 1);
  EXPECT_NE(log.find(" warn workers_containment"), std::string::npos) << log;
  EXPECT_NE(c->summary().find("cgroup v2 not delegated here"), std::string::npos);
  EXPECT_NE(c->summary().find("offers no memory and pids controllers"), std::string::npos);
  EXPECT_NE(c->summary().find("memory_max as RLIMIT_AS"), std::string::npos);
  // pids_max is RLIMIT_NPROC only where that counts one worker's tasks
  // (tasks_rlimit_is_per_worker).
  const bool nproc = tasks_rlimit_is_per_worker();
  EXPECT_NE(c->summary().find(nproc ? "pids_max as RLIMIT_NPROC" : "pids_max not applied"),
            std::string::npos)
      << c->summary();
  EXPECT_NE(c->summary().find("cpu_weight not applied"), std::string::npos);
  EXPECT_FALSE(fs::exists(group_ + "/corral-workers"));
  EXPECT_EQ(slurp(group_ + "/cgroup.subtree_control"), "");
  auto conf = c->prepare("doc:1", {64 << 20, 32, 0});
  ASSERT_TRUE(conf.ok());
  EXPECT_TRUE(conf->limit_memory);
  EXPECT_EQ(conf->limit_tasks, nproc);
  if (nproc) {
    EXPECT_EQ(conf->tasks.rlim_cur, 32u);
  }
}

TEST_F(ContainmentTest, AGroupNotWritableFallsBack) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  ::chmod(group_.c_str(), 0500);
  auto c = make();
  ::chmod(group_.c_str(), 0700);
  EXPECT_EQ(c->mode(), Containment::Mode::rlimits);
  EXPECT_NE(c->summary().find("not writable"), std::string::npos);
}

TEST_F(ContainmentTest, NoKindWithLimitsTouchesNothing) {
  auto c = make(false);
  EXPECT_EQ(c->mode(), Containment::Mode::rlimits);
  EXPECT_FALSE(fs::exists(group_ + "/corral-workers"));
  EXPECT_EQ(log_text().find(" warn "), std::string::npos);
}

// The rlimits way end to end: the child's address-space limit is the kind's memory_max.
TEST(RlimitContainment, MemoryMaxIsTheChildsAddressSpaceLimit) {
  ProcessLauncher launcher;  // rlimits only
  EXPECT_EQ(launcher.containment().mode(), Containment::Mode::rlimits);
  char tmpl[] = "/tmp/corral-rlimit-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  LaunchSpec spec;
  spec.command = {"/bin/sh", "-c", "ulimit -v"};  // KiB
  spec.address = "doc:1";
  spec.state_dir = dir;
  spec.limits = {96 << 20, 10, 50};
  core::UniqueFd listen(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  spec.listen_fd = listen.get();
  auto l = launcher.launch(spec);
  ASSERT_TRUE(l.ok()) << l.error().reason;
  EXPECT_EQ(read_all(l->out.get()), std::to_string(96 << 10) + "\n");
  EXPECT_EQ(wait_exit(l.value()), 0);
  EXPECT_FALSE(launcher.reaped(l->pid).memory_limit);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace corral::workers
