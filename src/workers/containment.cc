#include "workers/containment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "core/escape.h"

namespace corral::workers {

namespace {

constexpr const char* kWorkersGroup = "corral-workers";
constexpr const char* kSupervisorGroup = "corral-supervisor";
// A worker's group name: its address as a bounded file name (core/escape.h), well under
// NAME_MAX (255), the limit of a cgroup's name.
constexpr size_t kMaxGroupName = 200;

std::optional<std::string> read_text(const std::string& path) {
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20)) return out;  // /proc and cgroup files are small
  }
}

// Writes a cgroup interface file. On cgroupfs the file exists (mkdir makes a group's files);
// O_CREAT only serves the stand-in directory of the tests, where they are ordinary files.
core::Result<void> write_control(const std::string& path, std::string_view text,
                                 bool create = true) {
  int flags = O_WRONLY | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  core::UniqueFd fd(::open(path.c_str(), flags, 0644));
  if (!fd) return core::errno_error(path.c_str());
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return core::errno_error(path.c_str());
  return {};
}

bool has_word(std::string_view text, std::string_view word) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (text.substr(i, j - i) == word) return true;
    i = j;
  }
  return false;
}

// "key value" lines (memory.events): the value of `key`, 0 when absent.
uint64_t keyed_value(std::string_view text, std::string_view key) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ')
      return std::strtoull(std::string(line.substr(key.size() + 1)).c_str(), nullptr, 10);
    pos = end + 1;
  }
  return 0;
}

uint64_t oom_kills(const std::string& group) {
  auto events = read_text(group + "/memory.events");
  return events ? keyed_value(*events, "oom_kill") : 0;
}

// mountinfo escapes ' ', '\t', '\n' and '\\' as \ooo.
std::string unescape_mount(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool ok = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = s[i + k];
        ok = ok && c >= '0' && c <= '7';
        v = v * 8 + (c - '0');
      }
      if (ok) {
        out += static_cast<char>(v);
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string controllers_wanted(bool cpu) {
  return cpu ? "+memory +pids +cpu" : "+memory +pids";
}

bool has_controllers(std::string_view subtree_control, bool cpu) {
  return has_word(subtree_control, "memory") && has_word(subtree_control, "pids") &&
         (!cpu || has_word(subtree_control, "cpu"));
}

// The parent of `pid` (/proc/PID/stat), 0 when it is gone.
pid_t parent_pid(pid_t pid) {
  auto stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return 0;
  size_t paren = stat->rfind(')');  // comm may hold spaces and ')'
  if (paren == std::string::npos) return 0;
  char state = 0;
  int ppid = 0;
  if (sscanf(stat->c_str() + paren + 1, " %c %d", &state, &ppid) != 2) return 0;
  return ppid;
}

}  // namespace

std::vector<pid_t> own_processes(std::string_view procs, pid_t self,
                                 const std::function<pid_t(pid_t)>& parent_of,
                                 std::vector<pid_t>* foreign) {
  std::vector<pid_t> ours;
  for (size_t pos = 0; pos < procs.size();) {
    size_t end = procs.find('\n', pos);
    if (end == std::string_view::npos) end = procs.size();
    std::string line(procs.substr(pos, end - pos));
    pos = end + 1;
    if (line.empty()) continue;
    pid_t pid = static_cast<pid_t>(std::strtol(line.c_str(), nullptr, 10));
    if (pid <= 0) continue;
    if (pid == self || parent_of(pid) == self)
      ours.push_back(pid);
    else if (foreign)
      foreign->push_back(pid);
  }
  return ours;
}

core::Result<uint64_t> parse_size(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 15)
    return core::Error{EINVAL, "'" + std::string(text) + "' is not a size (e.g. \"256M\")"};
  uint64_t v = std::stoull(std::string(text.substr(0, digits)));
  std::string_view unit = text.substr(digits);
  int shift = unit.empty()  ? 0
              : unit == "K" ? 10
              : unit == "M" ? 20
              : unit == "G" ? 30
              : unit == "T" ? 40
                            : -1;
  if (shift < 0)
    return core::Error{EINVAL, "'" + std::string(text) + "': the unit is K, M, G or T (1024^n)"};
  if (shift && v > (UINT64_MAX >> shift))
    return core::Error{EINVAL, "'" + std::string(text) + "' is too large"};
  v <<= shift;
  if (v == 0) return core::Error{EINVAL, "a size is at least 1 byte"};
  return v;
}

core::Result<std::string> cgroup2_group_dir(std::string_view proc_cgroup,
                                            std::string_view mountinfo) {
  std::optional<std::string> path;
  for (size_t pos = 0; pos < proc_cgroup.size();) {
    size_t end = proc_cgroup.find('\n', pos);
    if (end == std::string_view::npos) end = proc_cgroup.size();
    std::string_view line = proc_cgroup.substr(pos, end - pos);
    if (line.substr(0, 3) == "0::") path = std::string(line.substr(3));
    pos = end + 1;
  }
  if (!path || path->empty() || (*path)[0] != '/')
    return core::Error{ENOENT, "no cgroup v2 group in /proc/self/cgroup (cgroup v1 only)"};
  for (size_t pos = 0; pos < mountinfo.size();) {
    size_t end = mountinfo.find('\n', pos);
    if (end == std::string_view::npos) end = mountinfo.size();
    std::string_view line = mountinfo.substr(pos, end - pos);
    pos = end + 1;
    // id parent major:minor root mountpoint options [optional fields...] - fstype source opts
    size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    auto after = fields(line.substr(dash + 3));
    if (after.empty() || after[0] != "cgroup2") continue;
    auto before = fields(line.substr(0, dash));
    if (before.size() < 5) continue;
    std::string root = unescape_mount(before[3]), mount = unescape_mount(before[4]);
    // The group's path is relative to the cgroup namespace's root; the mount shows `root` of it.
    std::string rel = *path;
    if (root != "/") {
      if (rel.compare(0, root.size(), root) != 0 ||
          (rel.size() > root.size() && rel[root.size()] != '/'))
        continue;  // this cgroup2 mount does not show our group
      rel = rel.substr(root.size());
    }
    if (rel == "/") rel.clear();
    return mount + rel;
  }
  return core::Error{ENOENT, "no cgroup2 filesystem mounted (/proc/self/mountinfo)"};
}

nlohmann::json memory_limit_error() {
  return {{"message", "The worker exceeded its memory limit."},
          {"code", "memory_limit"},
          {"reason", "memory limit"}};
}

bool ended_by_memory_limit(const ExitCause& cause, const nlohmann::json& failed,
                           const Limits& limits) {
  if (cause.memory_limit) return true;
  if (!limits.memory_max || !failed.is_object()) return false;
  auto code = failed.find("code");
  return code != failed.end() && code->is_string() && code->get<std::string>() == "memory_limit";
}

bool tasks_rlimit_is_per_worker() {
  if (getuid() != 0) return false;
  auto map = read_text("/proc/self/uid_map");
  if (!map) return false;
  std::string first = map->substr(0, map->find('\n'));
  auto f = fields(first);
  return map->find('\n') + 1 == map->size() && f.size() == 3 && f[0] == "0" && f[1] == "0" &&
         f[2] == "4294967295";
}

namespace {

// What rlimits mode does with pids_max, in words (the warning's and the docs').
std::string tasks_summary(bool tasks_rlimit) {
  return tasks_rlimit ? "pids_max as RLIMIT_NPROC (it binds a worker that switches to a uid of "
                        "its own and counts every task of that uid; a worker that stays root is "
                        "not bound)"
                      : "pids_max not applied (RLIMIT_NPROC would count every task of corral's "
                        "uid: the supervisor's and all workers' together)";
}

}  // namespace

std::unique_ptr<Containment> Containment::rlimits_only() {
  std::unique_ptr<Containment> c(new Containment());
  c->remove_group_ = [](const std::string& dir) { return ::rmdir(dir.c_str()); };
  c->tasks_rlimit_ = tasks_rlimit_is_per_worker();
  c->summary_ = "rlimits: memory_max as RLIMIT_AS, " + tasks_summary(c->tasks_rlimit_) +
                ", cpu_weight not "
                "applied";
  return c;
}

std::unique_ptr<Containment> Containment::create(core::Logger& log, Options options, bool wanted) {
  std::unique_ptr<Containment> c(new Containment());
  c->remove_group_ = options.remove_group
                         ? std::move(options.remove_group)
                         : [](const std::string& dir) { return ::rmdir(dir.c_str()); };
  if (!wanted) {
    c->summary_ = "no kind sets a limit";
    log.info("workers_containment", "mode=none reason=\"{}\"", c->summary_);
    return c;
  }
  auto r = c->set_up_cgroup(options);
  if (r) {
    c->mode_ = Mode::cgroup;
    c->summary_ = "cgroup v2 groups in " + c->workers_dir_ + ": memory.max, pids.max" +
                  (c->cpu_ ? ", cpu.weight" : " (cpu.weight not applied: no cpu controller)");
    log.info("workers_containment", "mode=cgroup group=\"{}\" limits=\"{}\"", c->workers_dir_,
             c->summary_);
    return c;
  }
  c->tasks_rlimit_ = tasks_rlimit_is_per_worker();
  c->summary_ = "cgroup v2 not delegated here (" + r.error().reason +
                "); using rlimits: memory_max as RLIMIT_AS (address space), " +
                tasks_summary(c->tasks_rlimit_) + ", cpu_weight not applied";
  log.warn("workers_containment", "mode=rlimits reason=\"{}\"", c->summary_);
  return c;
}

core::Result<void> Containment::set_up_cgroup(const Options& options) {
  std::string group = options.group_dir;
  if (group.empty()) {
    auto proc = read_text(options.proc_cgroup);
    auto mounts = read_text(options.mountinfo);
    if (!proc || !mounts) return core::Error{ENOENT, "cannot read /proc/self/cgroup or mountinfo"};
    auto dir = cgroup2_group_dir(*proc, *mounts);
    if (!dir) return dir.error();
    group = std::move(dir.value());
  }
  auto controllers = read_text(group + "/cgroup.controllers");
  if (!controllers) return core::Error{ENOENT, "no cgroup.controllers in " + group};
  if (!has_word(*controllers, "memory") || !has_word(*controllers, "pids")) {
    std::string offered = controllers->substr(0, controllers->find('\n'));
    return core::Error{ENOTSUP, "the group " + group +
                                    " offers no memory and pids controllers (cgroup.controllers: "
                                    "\"" +
                                    offered + "\")"};
  }
  if (::access(group.c_str(), W_OK | X_OK) != 0 ||
      ::access((group + "/cgroup.subtree_control").c_str(), W_OK) != 0)
    return core::Error{EACCES, "the group " + group + " is not writable by this user"};
  cpu_ = has_word(*controllers, "cpu");
  std::string want = controllers_wanted(cpu_);
  auto subtree = read_text(group + "/cgroup.subtree_control");
  if (!subtree || !has_controllers(*subtree, cpu_)) {
    auto r = write_control(group + "/cgroup.subtree_control", want, false);
    if (!r && r.error().code == EBUSY) {
      // The group holds processes: cgroup v2 enables controllers for children only in a group
      // without processes of its own. When they are all corral's (the supervisor and its server
      // processes), they move to a leaf of their own and the write is tried again.
      auto procs = read_text(group + "/cgroup.procs");
      if (!procs) return core::errno_error("cgroup.procs");
      std::vector<pid_t> foreign;
      auto ours = own_processes(*procs, getpid(), parent_pid, &foreign);
      if (!foreign.empty())
        return core::Error{EBUSY, fmt::format("the group {} holds processes that are not corral's "
                                              "(pid {}), so its children cannot have controllers",
                                              group, foreign.front())};
      std::string leaf = group + "/" + kSupervisorGroup;
      if (::mkdir(leaf.c_str(), 0755) < 0 && errno != EEXIST) return core::errno_error("mkdir");
      auto move_all = [&](const std::string& to) {
        for (pid_t p : ours) (void)write_control(to + "/cgroup.procs", std::to_string(p), false);
      };
      move_all(leaf);
      r = write_control(group + "/cgroup.subtree_control", want, false);
      if (!r) {
        move_all(group);  // back where they were
        ::rmdir(leaf.c_str());
        return core::Error{r.error().code, "the group " + group +
                                               " refused controllers for its children (" +
                                               r.error().reason + ")"};
      }
    }
    if (!r) return r.error();
  }
  workers_dir_ = group + "/" + kWorkersGroup;
  if (::mkdir(workers_dir_.c_str(), 0755) < 0 && errno != EEXIST)
    return core::errno_error(workers_dir_.c_str());
  if (auto r = write_control(workers_dir_ + "/cgroup.subtree_control", want); !r) return r.error();
  group_dir_ = group;
  // Groups an earlier supervisor left (its workers were gone, their removal had failed).
  if (DIR* d = ::opendir(workers_dir_.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == ".." || e->d_type != DT_DIR) continue;
      remove_group_(workers_dir_ + "/" + name);
    }
    ::closedir(d);
  }
  return {};
}

core::Result<Confinement> Containment::prepare(std::string_view address, const Limits& limits) {
  Confinement c;
  if (mode_ == Mode::rlimits) {
    if (limits.memory_max) {
      c.limit_memory = true;
      c.memory.rlim_cur = c.memory.rlim_max = static_cast<rlim_t>(limits.memory_max);
    }
    if (limits.pids_max && tasks_rlimit_) {
      c.limit_tasks = true;
      c.tasks.rlim_cur = c.tasks.rlim_max = static_cast<rlim_t>(limits.pids_max);
    }
    return c;
  }
  retry_removals();
  c.group = workers_dir_ + "/" + core::bounded_file_name(address, kMaxGroupName);
  // EEXIST: the group of this address's previous worker, not removed yet (its last processes
  // were still dying); it is ours, and oom_kills below starts the count afresh.
  if (::mkdir(c.group.c_str(), 0755) < 0 && errno != EEXIST)
    return core::errno_error(c.group.c_str());
  std::erase(removals_, c.group);
  auto value = [](uint64_t v) { return v ? std::to_string(v) : std::string("max"); };
  for (auto [file, text] :
       {std::pair<const char*, std::string>{"memory.max", value(limits.memory_max)},
        {"pids.max", value(limits.pids_max)}}) {
    if (auto r = write_control(c.group + "/" + file, text); !r) {
      remove(c.group);
      return r.error();
    }
  }
  if (cpu_ && limits.cpu_weight) {
    if (auto r = write_control(c.group + "/cpu.weight", std::to_string(limits.cpu_weight)); !r) {
      remove(c.group);
      return r.error();
    }
  }
  if (limits.memory_max) {
    // Where the kernel has them: swap does not stretch the limit, and an OOM kill takes the
    // whole worker rather than one of its processes.
    (void)write_control(c.group + "/memory.swap.max", "0", false);
    (void)write_control(c.group + "/memory.oom.group", "1", false);
  }
  c.oom_kills = oom_kills(c.group);
  c.procs.reset(::open((c.group + "/cgroup.procs").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  if (!c.procs) {
    auto e = core::errno_error("cgroup.procs");
    remove(c.group);
    return e;
  }
  return c;
}

bool Containment::enter(const Confinement& c, const char** what) {
  if (c.procs) {
    // The pid in decimal, by hand: no allocation, no locale.
    char buf[24];
    char* end = buf + sizeof buf;
    char* p = end;
    for (unsigned long v = static_cast<unsigned long>(getpid()); p == end || v; v /= 10)
      *--p = static_cast<char>('0' + v % 10);
    if (::write(c.procs.get(), p, static_cast<size_t>(end - p)) != end - p) {
      *what = "cgroup.procs";
      return false;
    }
  }
  if (c.limit_memory && setrlimit(RLIMIT_AS, &c.memory) != 0) {
    *what = "setrlimit(RLIMIT_AS)";
    return false;
  }
  if (c.limit_tasks && setrlimit(RLIMIT_NPROC, &c.tasks) != 0) {
    *what = "setrlimit(RLIMIT_NPROC)";
    return false;
  }
  return true;
}

void Containment::adopt(Confinement c, pid_t pid) {
  if (c.group.empty()) return;
  if (pid <= 0) return remove(c.group);
  groups_[pid] = {std::move(c.group), c.oom_kills};
}

ExitCause Containment::reaped(pid_t pid) {
  ExitCause cause;
  auto it = groups_.find(pid);
  if (it == groups_.end()) return cause;
  cause.memory_limit = oom_kills(it->second.dir) > it->second.oom_kills;
  remove(it->second.dir);
  groups_.erase(it);
  retry_removals();
  return cause;
}

void Containment::remove(const std::string& group) {
  // Whatever the worker left in its group dies with it (cgroup.kill: Linux 5.14).
  (void)write_control(group + "/cgroup.kill", "1", false);
  if (remove_group_(group) != 0 && errno != ENOENT) {
    if (std::find(removals_.begin(), removals_.end(), group) == removals_.end())
      removals_.push_back(group);
  }
}

void Containment::retry_removals() {
  std::erase_if(removals_,
                [this](const std::string& g) { return remove_group_(g) == 0 || errno == ENOENT; });
}

Containment::~Containment() {
  for (auto& [pid, group] : groups_) remove(group.dir);
  retry_removals();
}

}  // namespace corral::workers
