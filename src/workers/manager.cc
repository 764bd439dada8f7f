#include "workers/manager.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/escape.h"
#include "core/socket.h"
#include "http/percent.h"

namespace corral::workers {

namespace {

// A child that closed its control link may simply be exiting: its fds close a moment before its
// pidfd reports the exit. The link is called lost only if the child still lives this much later.
constexpr uint32_t kLinkCheckMs = 100;
constexpr size_t kMaxPacket = 64 * 1024;
constexpr size_t kMaxPartialLine = 16 * 1024;
constexpr size_t kMaxPublicField = 1024;
constexpr size_t kMaxKey = 256;
// File names for an address (core::bounded_file_name): a lock's is the same in every manager on
// the state directory whatever its path is spelled like, a socket's fits sun_path.
constexpr size_t kMaxLockName = 200;

// A JSON message as text; nullopt (and a logged error) when it cannot be written. Addresses cross
// JSON in their wire form (core::wire_encode), so this only guards against a path or a start
// hook's data that is not valid UTF-8.
std::optional<std::string> dump_message(core::Logger& log, const nlohmann::json& msg) {
  try {
    return msg.dump();
  } catch (const nlohmann::json::exception& e) {
    log.error("worker_message_unwritable", "error=\"{}\"", e.what());
    return std::nullopt;
  }
}

// JSON for the log only (lossy is fine there): never throws.
core::Verbatim log_json(const nlohmann::json& j) {
  return {j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

// What a start refused by the bounds tells the client: try again in a second (a worker slot frees
// as soon as one of the running workers goes idle or exits).
constexpr uint32_t kRetryAfterS = 1;
constexpr size_t kDefaultMaxWorkers = 1024;

// The first line of a small file as an unsigned number; nullopt when absent or not a number
// ("max" in a cgroup file).
std::optional<uint64_t> read_number(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[64];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(buf, &end, 10);
  if (end == buf || errno != 0 || (*end != '\n' && *end != '\0')) return std::nullopt;
  return static_cast<uint64_t>(v);
}

// This process's cgroup v2 directory ("0::/path" in /proc/self/cgroup); empty when unknown.
std::string cgroup_dir() {
  FILE* f = fopen("/proc/self/cgroup", "re");
  if (!f) return {};
  char line[4096];
  std::string dir;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "0::", 3) != 0) continue;
    dir = line + 3;
    while (!dir.empty() && dir.back() == '\n') dir.pop_back();
    break;
  }
  fclose(f);
  return dir.empty() ? std::string() : "/sys/fs/cgroup" + dir;
}

// Whether `pid` is on its way out (the kernel's PF_EXITING in /proc/PID/stat's flags): killed or
// exiting, but not yet reported by its pidfd. A process whose threads take long to die (a busy
// machine, many threads) closes its fds only with its last thread, and the exit follows.
bool exiting(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // gone already
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  // pid (comm) state ppid pgrp session tty_nr tpgid flags ...: comm may hold spaces and ')'.
  const char* p = strrchr(buf, ')');
  if (!p) return false;
  unsigned long flags = 0;
  char state = 0;
  if (sscanf(p + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2) return false;
  constexpr unsigned long kPfExiting = 0x4;
  return state == 'Z' || state == 'X' || (flags & kPfExiting) != 0;
}

nlohmann::json public_error(std::string_view message, std::string_view code) {
  return {{"message", message}, {"code", code}};
}

// A child's `fatal` error cut down to the public fields: three bounded strings, nothing else.
nlohmann::json sanitize_error(const nlohmann::json& e) {
  nlohmann::json out = {{"message", "The worker failed."}};
  if (!e.is_object()) return out;
  for (const char* key : {"message", "code", "reason"}) {
    auto it = e.find(key);
    if (it != e.end() && it->is_string()) {
      std::string v = it->get<std::string>();
      if (v.size() > kMaxPublicField) {
        // Cut at a character boundary: half a UTF-8 sequence would make every later dump() of
        // the state (the control API, the refusal sent to a server process) throw.
        size_t n = kMaxPublicField;
        while (n > 0 && (static_cast<unsigned char>(v[n]) & 0xC0) == 0x80) --n;
        v.resize(n);
      }
      out[key] = v;
    }
  }
  return out;
}

std::string iso8601(time_t t) {
  char buf[32];
  size_t n = core::format_iso8601(t, buf);
  return std::string(buf, n);
}

core::Result<void> make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) < 0 && errno != EEXIST) return core::errno_error(path.c_str());
  struct stat st;
  if (::stat(path.c_str(), &st) < 0) return core::errno_error(path.c_str());
  if (!S_ISDIR(st.st_mode)) return core::Error{ENOTDIR, path + " is not a directory"};
  ::chmod(path.c_str(), mode);
  return {};
}

std::string exit_text(const siginfo_t& info) {
  if (info.si_code == CLD_EXITED) return "exit " + std::to_string(info.si_status);
  return "signal " + std::to_string(info.si_status);
}

}  // namespace

std::string encode_address(std::string_view address) {
  return http::percent_encode_name(address);
}

std::string lock_file_name(std::string_view address) {
  return core::bounded_file_name(address, kMaxLockName) + ".lock";
}

size_t default_max_starting() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cpus <= 0) cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return 2 * static_cast<size_t>(cpus);
}

DefaultBound default_max_workers() {
  DefaultBound b{kDefaultMaxWorkers, "the default cap"};
  auto consider = [&b](uint64_t value, std::string basis) {
    size_t v = static_cast<size_t>(std::max<uint64_t>(1, value));
    if (v < b.value) b = {v, std::move(basis)};
  };
  struct rlimit r;
  if (getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    consider(r.rlim_cur / 4, fmt::format("RLIMIT_NPROC {} / 4", r.rlim_cur));
  if (auto pid_max = read_number("/proc/sys/kernel/pid_max"))
    consider(*pid_max / 4, fmt::format("kernel.pid_max {} / 4", *pid_max));
  if (std::string dir = cgroup_dir(); !dir.empty())
    if (auto pids = read_number(dir + "/pids.max"))
      consider(*pids / 4, fmt::format("{}/pids.max {} / 4", dir, *pids));
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    consider(r.rlim_cur > 64 ? (r.rlim_cur - 64) / 6 : 1,
             fmt::format("(RLIMIT_NOFILE {} - 64) / 6", r.rlim_cur));
  return b;
}

struct Manager::Kind {
  struct Segment {
    bool param = false;
    std::string literal;
  };
  struct Route {
    std::vector<Segment> segments;
    bool wildcard = false;
  };
  KindConfig config;
  std::vector<Route> routes;
  size_t index = 0;  // in kinds_ (and live_by_kind_)
};

struct Manager::OutputReader final : core::IoHandler {
  Manager* m = nullptr;
  Worker* w = nullptr;
  bool is_err = false;
  core::UniqueFd fd;
  std::string partial;

  // Not after the worker's exit: an event of the same epoll round as its pidfd's may still come,
  // and its slot may be gone by then.
  void on_io(uint32_t) override;
  // One read; false once the pipe is at EOF (and closed).
  bool read_some();
  void drain() {
    for (int i = 0; i < 64 && fd && read_some();) ++i;  // bounded: a straggler may keep writing
  }
  void close();
};

struct Manager::Worker final : core::IoHandler {
  struct Control final : core::IoHandler {
    Worker* w = nullptr;
    void on_io(uint32_t) override {
      if (!w->exited) w->m.read_control(*w);
    }
  };

  Worker(Manager& manager, Slot& s) : m(manager), slot(&s) {
    control_handler.w = this;
    for (auto* r : {&out, &err}) {
      r->m = &manager;
      r->w = this;
    }
    err.is_err = true;
  }
  void on_io(uint32_t) override {
    if (!exited) m.on_exit(*this);
  }

  Manager& m;
  Slot* slot;
  // Reaped: it waits for the loop's deferred destruction, and its slot may already be gone (the
  // events of its descriptors still queued in this epoll round are ignored).
  bool exited = false;
  pid_t pid = 0;
  core::UniqueFd pidfd;
  core::UniqueFd control;
  // Our copy of its listening socket: nothing here accepts, but its queue tells whether a
  // connection is waiting for the worker (check_idle), and with it open a connection the worker
  // never accepted is not reset when the worker closes its copy.
  core::UniqueFd listener;
  Control control_handler;
  OutputReader out, err;
  core::Timer start_timer, kill_timer, link_check;
  time_t started_at = 0;
  bool started = false;  // `started`: the lock is taken
  bool ready = false;
  bool idle = false;
  uint64_t idle_since = 0;
  uint64_t ready_at = 0;
  bool served = false;           // reported busy at least once since `ready`
  bool counts_starting = false;  // counted in starting_ (until `ready` or the exit)
  Slot* claimed_by = nullptr;    // a queued start waiting for this worker's exit
  bool stopping = false;
  bool stop_after_started = false;  // a stop asked during the start runs at `started`
  std::string failure_log;          // the full error, logged at the exit with the stderr tail
};

struct Manager::Slot {
  std::string address;
  const Kind* kind = nullptr;
  std::string socket_path;
  ino_t socket_inode = 0;
  std::unique_ptr<Worker> worker;        // the live child, if any
  std::vector<ResolveCallback> waiters;  // for the current start, or for the queued one
  bool start_queued = false;             // a start waits for the current worker's exit
  bool queued = false;                   // in queue_: a start waits for the bounds
  std::list<Slot*>::iterator queue_pos;  // where, when queued
  uint64_t queued_ms = 0;
  time_t queued_at = 0;
  Worker* awaiting = nullptr;  // the stopping worker whose exit makes room for this start
  nlohmann::json failed;       // the public error; null unless failed
  time_t failed_at = 0;
  bool suspended = false;
  std::string tail;  // the last stderr bytes
  nlohmann::json last_emitted;
};

void Manager::OutputReader::on_io(uint32_t) {
  if (fd && !w->exited) read_some();
}

bool Manager::OutputReader::read_some() {
  char buf[16 * 1024];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n > 0) {
    m->on_output(*w, is_err, std::string_view(buf, static_cast<size_t>(n)), false);
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
  m->on_output(*w, is_err, {}, true);
  close();
  return false;
}

void Manager::OutputReader::close() {
  if (!fd) return;
  m->loop_.remove(fd.get());
  fd.reset();
}

core::Result<std::unique_ptr<Manager>> Manager::create(core::EventLoop& loop, core::Logger& log,
                                                       ManagerOptions options,
                                                       std::unique_ptr<Launcher> launcher) {
  if (options.state_dir.empty())
    return core::Error{EINVAL, "workers: the state directory is empty"};
  while (options.state_dir.size() > 1 && options.state_dir.back() == '/')
    options.state_dir.pop_back();
  std::vector<std::unique_ptr<Kind>> kinds;
  for (auto& cfg : options.kinds) {
    auto kind = std::make_unique<Kind>();
    const std::string& name = cfg.name;
    if (name.empty() || name.find_first_of(":/%") != std::string::npos)
      return core::Error{EINVAL,
                         "workers." + name + ": a kind name is non-empty, without ':', '/', '%'"};
    for (const auto& k : kinds)
      if (k->config.name == name) return core::Error{EINVAL, "workers." + name + ": defined twice"};
    if (cfg.command.empty()) return core::Error{EINVAL, "workers." + name + ".command: empty"};
    for (const auto& pattern : cfg.routes) {
      Kind::Route route;
      bool params = false;
      std::string_view p = pattern;
      if (p.empty() || p[0] != '/')
        return core::Error{EINVAL,
                           "workers." + name + ".routes: \"" + pattern + "\" must start with '/'"};
      p.remove_prefix(1);
      while (true) {
        auto slash = p.find('/');
        std::string_view seg = p.substr(0, slash);
        if (route.wildcard)
          return core::Error{EINVAL,
                             "workers." + name + ".routes: \"" + pattern + "\": '*' must be last"};
        if (seg == "*") {
          route.wildcard = true;
        } else if (seg.size() > 2 && seg.front() == '{' && seg.back() == '}') {
          route.segments.push_back({true, {}});
          params = true;
        } else {
          std::string lit;
          if (seg.find_first_of("{}*") != std::string_view::npos ||
              (!seg.empty() && !http::percent_decode_segment(seg, lit)))
            return core::Error{EINVAL,
                               "workers." + name + ".routes: \"" + pattern + "\": bad segment"};
          route.segments.push_back({false, lit});
        }
        if (slash == std::string_view::npos) break;
        p.remove_prefix(slash + 1);
      }
      if (!params)
        return core::Error{EINVAL, "workers." + name + ".routes: \"" + pattern +
                                       "\" has no {param} to make the address's key"};
      kind->routes.push_back(std::move(route));
    }
    if (cfg.max_workers == 0) cfg.max_workers = SIZE_MAX;
    kind->config = std::move(cfg);
    kind->index = kinds.size();
    kinds.push_back(std::move(kind));
  }
  // A worker's socket path must fit sun_path (108 bytes with its NUL): long addresses get a
  // bounded name, but even the shortest one needs this much room after the directory.
  size_t socket_dir = options.state_dir.size() + sizeof("/sockets/") - 1;
  if (socket_dir + core::kMinFileName >= sizeof(sockaddr_un::sun_path))
    return core::Error{ENAMETOOLONG,
                       fmt::format("workers: the state directory \"{}\" is {} bytes long: worker "
                                   "sockets in it would not fit a Unix socket path ({} bytes); "
                                   "use a state directory of at most {} bytes",
                                   core::log_escaped(options.state_dir), options.state_dir.size(),
                                   sizeof(sockaddr_un::sun_path) - 1,
                                   sizeof(sockaddr_un::sun_path) - 1 - core::kMinFileName -
                                       (sizeof("/sockets/") - 1))};
  for (const char* sub : {"", "/sockets", "/locks", "/logs"}) {
    if (auto r = make_dir(options.state_dir + sub, 0700); !r) return r.error();
  }
  if (!launcher) launcher = std::make_unique<ProcessLauncher>();
  options.kinds.clear();
  std::string basis = "configured";
  if (options.max_starting == 0) options.max_starting = default_max_starting();
  if (options.max_workers == 0) {
    auto bound = default_max_workers();
    options.max_workers = bound.value;
    basis = std::move(bound.basis);
  }
  log.info("workers_bounds", "max_starting={} max_workers={} basis=\"{}\"", options.max_starting,
           options.max_workers, basis);
  std::unique_ptr<Manager> m(new Manager(loop, log, std::move(options), std::move(launcher)));
  m->live_by_kind_.assign(kinds.size(), 0);
  m->kinds_ = std::move(kinds);
  return m;
}

Manager::Manager(core::EventLoop& loop, core::Logger& log, ManagerOptions options,
                 std::unique_ptr<Launcher> launcher)
    : loop_(loop),
      log_(log),
      options_(std::move(options)),
      launcher_(std::move(launcher)),
      idle_check_(loop.timers(), [this] {
        check_idle();
        arm_idle_check();
      }) {}

Manager::~Manager() {
  // Whatever is left dies with the manager: a destructor cannot wait for a grace period.
  for (auto& [address, slot] : slots_) {
    Worker* w = slot->worker.get();
    if (!w) continue;
    loop_.remove(w->pidfd.get());
    if (w->control) loop_.remove(w->control.get());
    w->out.close();
    w->err.close();
    kill(-w->pid, SIGKILL);
    siginfo_t info{};
    while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(w->pidfd.get()), &info,
                  WEXITED) < 0 &&
           errno == EINTR) {
    }
    remove_socket(*slot);
  }
}

// Only our own socket file: another manager on the same state directory (corral restarted while
// an old worker still stopped) may have replaced it.
void Manager::remove_socket(Slot& slot) {
  struct stat st;
  if (slot.socket_path.empty() || ::stat(slot.socket_path.c_str(), &st) < 0) return;
  if (st.st_ino == slot.socket_inode) ::unlink(slot.socket_path.c_str());
}

const Manager::Kind* Manager::kind_of(std::string_view address) const {
  auto colon = address.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) return nullptr;
  auto name = address.substr(0, colon);
  for (const auto& k : kinds_)
    if (k->config.name == name) return k.get();
  return nullptr;
}

Manager::Slot* Manager::find(const std::string& address) {
  auto it = slots_.find(address);
  return it == slots_.end() ? nullptr : it->second.get();
}

const Manager::Slot* Manager::find(const std::string& address) const {
  auto it = slots_.find(address);
  return it == slots_.end() ? nullptr : it->second.get();
}

std::optional<std::string> Manager::address_for(std::string_view path) const {
  auto q = path.find_first_of("?#");
  if (q != std::string_view::npos) path = path.substr(0, q);
  if (path.empty() || path[0] != '/') return std::nullopt;
  std::vector<std::string_view> segs;
  std::string_view rest = path.substr(1);
  while (true) {
    auto slash = rest.find('/');
    segs.push_back(rest.substr(0, slash));
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  std::string decoded;
  for (const auto& kind : kinds_) {
    for (const auto& route : kind->routes) {
      size_t n = route.segments.size();
      if (segs.size() < n || (!route.wildcard && segs.size() != n)) continue;
      std::string key;
      bool ok = true;
      for (size_t i = 0; i < n && ok; ++i) {
        const auto& s = route.segments[i];
        if (!http::percent_decode_segment(segs[i], decoded)) {
          ok = false;
        } else if (s.param) {
          if (decoded.empty()) ok = false;
          if (!key.empty()) key += ':';
          key += decoded;
        } else {
          ok = decoded == s.literal;
        }
      }
      if (!ok || key.size() > kMaxKey) continue;
      return kind->config.name + ":" + key;
    }
  }
  return std::nullopt;
}

void Manager::resolve(const std::string& address, ResolveCallback cb) {
  const Kind* kind = kind_of(address);
  if (!kind) return cb({{}, 404, public_error("No such worker.", "unknown_kind")});
  if (closing_) return cb({{}, 503, public_error("The server is closing.", "closing")});
  Slot* slot = find(address);
  if (slot && slot->suspended)
    return cb({{}, 503, public_error("The worker is suspended.", "suspended")});
  if (slot && !slot->failed.is_null()) return cb({{}, 503, slot->failed});
  if (slot && slot->worker && slot->worker->ready && !slot->worker->stopping)
    return cb({slot->socket_path, 200, nullptr});
  if (!slot) {
    auto s = std::make_unique<Slot>();
    s->address = address;
    s->kind = kind;
    slot = s.get();
    slots_.emplace(address, std::move(s));
  }
  slot->waiters.push_back(std::move(cb));
  if (slot->worker) {
    if (slot->worker->stopping) slot->start_queued = true;  // a start waits for the exit
    return;
  }
  if (slot->queued) return;
  enqueue(*slot);
  std::string key = slot->address;  // pump() may answer the start and erase the slot
  pump();
  if (Slot* s = find(key); s && s->queued) changed(*s);
}

void Manager::enqueue(Slot& slot) {
  slot.queued = true;
  slot.queued_ms = loop_.now();
  slot.queued_at = loop_.wall_seconds();
  slot.queue_pos = queue_.insert(queue_.end(), &slot);
}

void Manager::unqueue(Slot& slot) {
  if (!slot.queued) return;
  queue_.erase(slot.queue_pos);
  slot.queued = false;
  if (Worker* w = std::exchange(slot.awaiting, nullptr)) {
    w->claimed_by = nullptr;
    --awaiting_exit_;
  }
}

// Starts the queued starts that fit, oldest first. A start over max_workers first makes room
// (it then waits for that exit, keeping its place); at most max_starting wait so at once. The
// first start that finds no place of its kind (a start place, or a place to wait for an exit)
// ends the round: nothing overtakes it.
void Manager::pump() {
  if (pumping_) {  // a watcher called back into the manager: one more round after this one
    pump_again_ = true;
    return;
  }
  pumping_ = true;
  do {
    pump_again_ = false;
    for (auto it = queue_.begin(); it != queue_.end() && !closing_;) {
      Slot& slot = **it++;  // advanced first: the slot may leave the queue (and go) below
      if (slot.awaiting) continue;
      if (has_room(slot)) {
        if (starting_ >= options_.max_starting) break;
        unqueue(slot);
        start(slot);
      } else {
        if (awaiting_exit_ >= options_.max_starting) break;
        make_room(slot);
      }
    }
  } while (pump_again_);
  pumping_ = false;
}

// Whether `slot`'s kind and the total are under max_workers.
bool Manager::has_room(const Slot& slot) const {
  const Kind& kind = *slot.kind;
  return live_by_kind_[kind.index] < kind.config.max_workers &&
         workers_live_ < options_.max_workers;
}

// For a start over max_workers: it waits for a stop already under way or stops the longest-idle
// worker, or, with neither, is refused with 503 and leaves the queue.
void Manager::make_room(Slot& slot) {
  const Kind& kind = *slot.kind;
  size_t kind_live = live_by_kind_[kind.index];
  bool kind_full = kind_live >= kind.config.max_workers;
  const Kind* of = kind_full ? &kind : nullptr;  // a worker of its own kind frees both bounds
  Worker* w = room_from(of, /*stopping=*/true);
  if (!w && (w = room_from(of, /*stopping=*/false))) {
    log_.info("worker_evicted", "address=\"{}\" pid={} idle_ms={} for=\"{}\" bound={}",
              w->slot->address, w->pid, loop_.now() - w->idle_since, slot.address,
              kind_full ? "kind" : "all");
    begin_stop(*w, "evicted");
  }
  if (w) {
    w->claimed_by = &slot;
    slot.awaiting = w;
    ++awaiting_exit_;
    return;
  }
  log_.warn("worker_limit",
            "address=\"{}\" live={} max_workers={} kind_live={} kind_max_workers={} bound={} "
            "reason=\"no idle worker to stop\"",
            slot.address, workers_live_, options_.max_workers, kind_live,
            kind.config.max_workers == SIZE_MAX ? 0 : kind.config.max_workers,
            kind_full ? "kind" : "all");
  unqueue(slot);
  answer(slot, {{}, 503, public_error("Too many workers.", "worker_limit"), kRetryAfterS});
  settle(slot);
}

// A worker whose exit would make room (of `kind`, or any when null) and that no other start
// waits for: one already stopping, or (stopping false) the longest-idle one that may be stopped.
Manager::Worker* Manager::room_from(const Kind* kind, bool stopping) {
  const uint64_t now = loop_.now();
  Worker* best = nullptr;
  for (auto& [address, s] : slots_) {
    Worker* w = s->worker.get();
    if (!w || w->claimed_by || (kind && s->kind != kind)) continue;
    if (stopping) {
      if (w->stopping) return w;
      continue;
    }
    if (!w->ready || w->stopping || w->stop_after_started || !w->idle) continue;
    if (!w->served && now - w->ready_at < options_.evict_grace_ms) continue;
    if (!best || w->idle_since < best->idle_since) best = w;
  }
  return best;
}

// A start queued longer than its kind's start_timeout while the queue did not move for as long
// is refused: the start slots are held by starts that do not finish (a burst that moves, however
// long, is not refused).
void Manager::expire_queued() {
  const uint64_t now = loop_.now();
  std::vector<Slot*> due;
  for (Slot* s : queue_) {
    uint64_t t = s->kind->config.start_timeout_ms;
    if (!s->awaiting && now - s->queued_ms >= t && now - progress_ms_ >= t) due.push_back(s);
  }
  for (Slot* s : due) {
    log_.warn("worker_limit",
              "address=\"{}\" starting={} max_starting={} queued={} reason=\"queued, and no "
              "start finished, for start_timeout ({} ms)\"",
              s->address, starting_, options_.max_starting, queue_.size(),
              s->kind->config.start_timeout_ms);
    unqueue(*s);
    answer(*s,
           {{}, 503, public_error("Too many workers are starting.", "start_limit"), kRetryAfterS});
    settle(*s);
  }
  if (!due.empty()) pump();
}

void Manager::answer(Slot& slot, const Resolution& r) {
  if (slot.waiters.empty()) return;
  // Deferred: a callback may call back into the manager (retry, resolve) and change this slot.
  loop_.defer([waiters = std::move(slot.waiters), r] {
    for (const auto& cb : waiters) cb(r);
  });
  slot.waiters.clear();
}

void Manager::start(Slot& slot) {
  const KindConfig& cfg = slot.kind->config;
  nlohmann::json start_data = nlohmann::json::object();
  if (cfg.start_hook) {
    try {
      start_data = cfg.start_hook(slot.address);
    } catch (const std::exception& e) {
      return fail(slot, public_error("The worker could not be started.", "start_failed"),
                  std::string("start hook threw: ") + e.what());
    } catch (...) {
      return fail(slot, public_error("The worker could not be started.", "start_failed"),
                  "start hook threw a non-exception");
    }
  }
  std::string socket_dir = options_.state_dir + "/sockets/";
  slot.socket_path =
      socket_dir + core::bounded_file_name(
                       slot.address, std::min<size_t>(kMaxLockName, sizeof(sockaddr_un::sun_path) -
                                                                        1 - socket_dir.size()));
  auto listener = core::listen_unix(slot.socket_path);
  if (!listener)
    return fail(slot, public_error("The worker could not be started.", "start_failed"),
                listener.error().reason);
  struct stat st;
  slot.socket_inode = ::stat(slot.socket_path.c_str(), &st) == 0 ? st.st_ino : 0;
  LaunchSpec spec{cfg.command, cfg.env, core::wire_encode(slot.address), options_.state_dir,
                  listener->get()};
  auto launched = launcher_->launch(spec);
  if (!launched) {
    ::unlink(slot.socket_path.c_str());
    return fail(slot, public_error("The worker could not be started.", "start_failed"),
                launched.error().reason);
  }
  auto w = std::make_unique<Worker>(*this, slot);
  w->pid = launched->pid;
  w->pidfd = std::move(launched->pidfd);
  w->control = std::move(launched->control);
  w->out.fd = std::move(launched->out);
  w->err.fd = std::move(launched->err);
  w->listener = std::move(*listener);
  w->started_at = loop_.wall_seconds();
  Worker* wp = w.get();
  w->start_timer.bind(loop_.timers(), [this, wp] { on_start_timeout(*wp); });
  w->kill_timer.bind(loop_.timers(), [wp] { kill(-wp->pid, SIGKILL); });
  w->link_check.bind(loop_.timers(), [this, wp] { on_link_check(*wp); });
  (void)loop_.add(w->pidfd.get(), EPOLLIN, w.get());
  (void)loop_.add(w->control.get(), EPOLLIN, &w->control_handler);
  (void)loop_.add(w->out.fd.get(), EPOLLIN, &w->out);
  (void)loop_.add(w->err.fd.get(), EPOLLIN, &w->err);
  w->start_timer.arm_after(cfg.start_timeout_ms);
  slot.worker = std::move(w);
  ++workers_live_;
  ++live_by_kind_[slot.kind->index];
  ++starting_;
  wp->counts_starting = true;
  arm_idle_check();
  log_.info("worker_starting", "address=\"{}\" pid={}", slot.address, wp->pid);
  nlohmann::json msg = {{"type", "start"},
                        {"address", core::wire_encode(slot.address)},
                        {"start", std::move(start_data)},
                        {"scripts", nlohmann::json::array()},
                        {"lock", options_.state_dir + "/locks/" + lock_file_name(slot.address)}};
  send(*wp, msg);
  changed(slot);
}

bool Manager::send(Worker& w, const nlohmann::json& msg) {
  if (!w.control) return false;
  auto text = dump_message(log_, msg);
  if (!text) return false;
  const std::string& data = *text;
  return ::send(w.control.get(), data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(data.size());
}

void Manager::read_control(Worker& w) {
  // Several packets per wakeup, bounded so one chatty worker cannot starve the loop.
  for (int i = 0; i < 16 && w.control; ++i) {
    char buf[kMaxPacket];
    ssize_t n = ::recv(w.control.get(), buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) return on_link_closed(w);
    if (static_cast<size_t>(n) > sizeof buf) {
      log_.warn("worker_protocol_error", "address=\"{}\" error=\"packet of {} bytes\"",
                w.slot->address, n);
      return on_link_closed(w);
    }
    auto msg = nlohmann::json::parse(std::string_view(buf, static_cast<size_t>(n)), nullptr, false);
    if (!msg.is_object() || !msg.contains("type") || !msg["type"].is_string()) {
      log_.warn("worker_protocol_error", "address=\"{}\" error=\"not a JSON message\"",
                w.slot->address);
      return on_link_closed(w);
    }
    on_message(w, msg);
  }
}

void Manager::on_message(Worker& w, const nlohmann::json& msg) {
  Slot& slot = *w.slot;
  const std::string type = msg["type"].get<std::string>();
  auto idle_of = [&msg] {
    auto it = msg.find("idle");
    return it == msg.end() || !it->is_boolean() || it->get<bool>();
  };
  if (type == "started" || (type == "ready" && !w.started)) {
    if (!w.started) {
      w.started = true;
      w.start_timer.cancel();
      log_.info("worker_started", "address=\"{}\" pid={}", slot.address, w.pid);
      if (w.stop_after_started && !w.stopping) begin_stop(w, "stop");
    }
  }
  if (type == "ready") {
    if (w.ready || w.stopping) return;
    w.ready = true;
    w.idle = idle_of();
    w.served = !w.idle;
    w.idle_since = w.ready_at = loop_.now();
    log_.info("worker_ready", "address=\"{}\" pid={} idle={}", slot.address, w.pid, w.idle);
    answer(slot, {slot.socket_path, 200, nullptr});
    changed(slot);
    if (std::exchange(w.counts_starting, false)) {
      --starting_;
      progress_ms_ = loop_.now();
      pump();
    }
  } else if (type == "idle") {
    bool idle = idle_of();
    if (idle && !w.idle) w.idle_since = loop_.now();
    if (!idle) w.served = true;
    w.idle = idle;
  } else if (type == "fatal") {
    auto it = msg.find("error");
    nlohmann::json pub = sanitize_error(it == msg.end() ? nlohmann::json() : *it);
    if (w.stopping) {
      // An error while it stops (a closer failing) is no failure of the address: it was asked to
      // go.
      log_.warn("worker_error_on_stop", "address=\"{}\" pid={} error={}", slot.address, w.pid,
                log_json(msg));
      return;
    }
    fail(slot, pub, "fatal: " + log_json(msg).text);
  }
  // Unknown types are ignored (forward compatibility).
}

void Manager::on_link_closed(Worker& w) {
  loop_.remove(w.control.get());
  w.control.reset();
  w.link_check.arm_after(kLinkCheckMs);
}

void Manager::on_link_check(Worker& w) {
  siginfo_t info{};
  if (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(w.pidfd.get()), &info,
             WEXITED | WNOHANG | WNOWAIT) == 0 &&
      info.si_pid != 0)
    return;                // it exited: on_exit decides (a crash, or the end of a stop)
  if (w.stopping) return;  // a stopping worker may close its link first
  if (exiting(w.pid)) {
    // Killed or exiting, its exit not reported yet: look again rather than call a crash a lost
    // link (a lost link after ready is recovered from; a crash is a failure).
    w.link_check.arm_after(kLinkCheckMs);
    return;
  }
  Slot& slot = *w.slot;
  const uint64_t now = loop_.now();
  if (!w.ready) {
    return fail(slot, public_error("The worker lost its link.", "link_lost"),
                "the control link closed before ready");
  }
  // Kept outside the slot: the slot goes with the recovered worker's exit, the memory must not.
  auto it = recoveries_.find(slot.address);
  if (it != recoveries_.end() && now - it->second < options_.link_recovery_window_ms) {
    return fail(slot, public_error("The worker lost its link.", "link_lost"),
                "a second lost control link within the recovery window");
  }
  recoveries_[slot.address] = now;
  log_.warn("worker_link_lost", "address=\"{}\" pid={} action=stop", slot.address, w.pid);
  begin_stop(w, "link_lost");
}

void Manager::on_start_timeout(Worker& w) {
  Slot& slot = *w.slot;
  fail(slot, public_error("The worker did not start in time.", "start_timeout"),
       fmt::format("no `started` within {} ms of the fork", slot.kind->config.start_timeout_ms));
  kill(-w.pid, SIGKILL);  // no grace: it never took its lock, there is nothing to close
}

void Manager::begin_stop(Worker& w, std::string_view why) {
  if (w.stopping) return;
  Slot& slot = *w.slot;
  w.stopping = true;
  w.start_timer.cancel();
  if (!slot.start_queued)
    answer(slot, {{}, 503, public_error("The worker was stopped.", "stopped")});
  log_.info("worker_stopping", "address=\"{}\" pid={} reason={}", slot.address, w.pid, why);
  // From now on a connect finds no socket (ENOENT), which the proxy knows never sent anything and
  // so tries again through a fresh resolve (a start queued behind this stop). Left in place, it
  // would queue on a worker that no longer accepts and be reset at its exit: for a POST, a 502.
  remove_socket(slot);
  // Without a link, SIGTERM is the same request (the worker library treats them alike).
  if (!send(w, {{"type", "shutdown"}})) kill(-w.pid, SIGTERM);
  w.kill_timer.arm_after(slot.kind->config.stop_grace_ms);
  changed(slot);
}

void Manager::fail(Slot& slot, nlohmann::json pub, std::string full) {
  slot.failed = std::move(pub);
  slot.failed_at = loop_.wall_seconds();
  slot.start_queued = false;
  answer(slot, {{}, 503, slot.failed});
  Worker* w = slot.worker.get();
  if (w && !w->stopping) {
    w->failure_log = std::move(full);  // logged at its exit, with all its stderr
    begin_stop(*w, "failed");
  } else if (w) {
    if (w->failure_log.empty()) w->failure_log = std::move(full);
  } else {
    log_.error("worker_failed", "address=\"{}\" error=\"{}\" public={} stderr_tail=\"{}\"",
               slot.address, full, log_json(slot.failed), slot.tail);
  }
  changed(slot);
}

void Manager::on_exit(Worker& w) {
  Slot& slot = *w.slot;
  // The leader is a zombie until reaped, so its pid (= the group id) cannot be reused yet: kill
  // whatever it left in its group first. A worker's process group does not outlive it.
  kill(-w.pid, SIGKILL);
  siginfo_t info{};
  if (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(w.pidfd.get()), &info,
             WEXITED | WNOHANG) < 0 ||
      info.si_pid == 0)
    return;
  std::string how = exit_text(info);
  loop_.remove(w.pidfd.get());
  if (w.control) loop_.remove(w.control.get());
  w.out.drain();
  w.err.drain();
  w.out.close();
  w.err.close();
  if (!w.out.partial.empty()) on_output(w, false, {}, true);
  if (!w.err.partial.empty()) on_output(w, true, {}, true);
  bool asked = w.stopping || closing_;
  log_.info("worker_exited", "address=\"{}\" pid={} how=\"{}\" asked={}", slot.address, w.pid, how,
            asked);
  std::string failure = std::move(w.failure_log);
  w.exited = true;
  loop_.destroy_later(std::move(slot.worker));
  --workers_live_;
  --live_by_kind_[slot.kind->index];
  if (w.counts_starting) --starting_;
  progress_ms_ = loop_.now();
  if (Slot* claimer = std::exchange(w.claimed_by, nullptr)) {  // its room is there now
    claimer->awaiting = nullptr;
    --awaiting_exit_;
  }
  remove_socket(slot);
  if (!failure.empty()) {
    log_.error("worker_failed",
               "address=\"{}\" error=\"{}\" exit=\"{}\" public={} stderr_tail=\"{}\"", slot.address,
               failure, how, log_json(slot.failed), slot.tail);
  } else if (!asked) {
    fail(slot, public_error("The worker exited unexpectedly.", "worker_exited"),
         (w.started ? "exited: " : "exited before `started`: ") + how);
  }
  if (slot.start_queued) {
    slot.start_queued = false;
    if (!slot.waiters.empty()) enqueue(slot);  // fail() above answered them if it crashed
  }
  if (closing_ && workers_live_ == 0) finish_close();
  settle(slot);
  pump();  // a worker slot, and perhaps a start slot, is free
}

void Manager::on_output(Worker& w, bool is_err, std::string_view data, bool eof) {
  Slot& slot = *w.slot;
  OutputReader& r = is_err ? w.err : w.out;
  if (is_err && !data.empty()) {
    slot.tail.append(data);
    if (slot.tail.size() > options_.stderr_tail_bytes)
      slot.tail.erase(0, slot.tail.size() - options_.stderr_tail_bytes);
  }
  // "<address> <line>", both escaped (core/escape.h): neither the address nor what the worker
  // wrote can start a line of its own. The prefix is the address's wire form with its spaces as
  // "%20" too (so it ends at the first space, and wire_decode reads it back); the line is
  // log-escaped without touching its quotes.
  std::string prefix;
  for (char c : core::wire_encode(slot.address)) {
    if (c == ' ')
      prefix += "%20";
    else
      prefix += c;
  }
  std::string lines;
  auto emit = [&](std::string_view line) {
    lines += prefix;
    lines += ' ';
    core::append_log_escaped(lines, line, false);
    lines += '\n';
  };
  while (!data.empty()) {
    auto nl = data.find('\n');
    if (nl == std::string_view::npos) {
      r.partial.append(data);
      if (r.partial.size() > kMaxPartialLine) {
        emit(r.partial);
        r.partial.clear();
      }
      break;
    }
    if (r.partial.empty()) {
      emit(data.substr(0, nl));
    } else {
      r.partial.append(data.substr(0, nl));
      emit(r.partial);
      r.partial.clear();
    }
    data.remove_prefix(nl + 1);
  }
  if (eof && !r.partial.empty()) {
    emit(r.partial);
    r.partial.clear();
  }
  if (lines.empty()) return;
  int fd = log_fd(*slot.kind);
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, lines.data(), lines.size());
  }
}

int Manager::log_fd(const Kind& kind) {
  auto it = log_fds_.find(kind.config.name);
  if (it != log_fds_.end()) return it->second.get();
  std::string path = options_.state_dir + "/logs/" + kind.config.name + ".log";
  core::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!fd) log_.error("worker_log_failed", "path=\"{}\" error=\"{}\"", path, strerror(errno));
  int raw = fd.get();
  if (fd) log_fds_.emplace(kind.config.name, std::move(fd));
  return raw;
}

// A connection in the worker's accept queue: a request handed to it that it has not taken yet
// (its `idle` flips when it reads one). A server process may have sent it any time after `ready`,
// and under load the worker may take longer than `idle` to accept: stopping it now would reset
// that connection, losing the request.
bool Manager::connection_waiting(const Worker& w) {
  pollfd p{w.listener.get(), POLLIN, 0};
  return w.listener && ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

void Manager::arm_idle_check() {
  if ((workers_live_ > 0 || !queue_.empty()) && !idle_check_.armed())
    idle_check_.arm_after(options_.idle_check_ms);
}

void Manager::check_idle() {
  const uint64_t now = loop_.now();
  std::erase_if(recoveries_,
                [&](const auto& r) { return now - r.second >= options_.link_recovery_window_ms; });
  std::vector<Worker*> due;
  for (auto& [address, slot] : slots_) {
    Worker* w = slot->worker.get();
    if (w && w->ready && !w->stopping && w->idle &&
        now - w->idle_since >= slot->kind->config.idle_ms && !connection_waiting(*w))
      due.push_back(w);
  }
  for (Worker* w : due) begin_stop(*w, "idle");
  expire_queued();
}

bool Manager::retry(const std::string& address) {
  Slot* slot = find(address);
  if (!slot || (slot->failed.is_null() && !slot->suspended)) return false;
  slot->failed = nullptr;
  slot->suspended = false;
  recoveries_.erase(address);
  log_.info("worker_retry", "address=\"{}\"", address);
  settle(*slot);
  return true;
}

bool Manager::stop(const std::string& address) {
  Slot* slot = find(address);
  if (!slot) return false;
  bool acted = false;
  if (slot->start_queued || slot->queued) {  // the queued start is cancelled; its waiters are told
    slot->start_queued = false;
    unqueue(*slot);
    answer(*slot, {{}, 503, public_error("The worker was stopped.", "stopped")});
    acted = true;
  }
  if (Worker* w = slot->worker.get()) {
    acted = true;
    if (!w->started && !w->stopping)
      w->stop_after_started = true;  // a stop during a start waits for it
    else
      begin_stop(*w, "stop");
  }
  if (acted) settle(*slot);
  if (acted) pump();  // a cancelled start may have held a place
  return acted;
}

bool Manager::suspend(const std::string& address) {
  const Kind* kind = kind_of(address);
  if (!kind) return false;
  Slot* slot = find(address);
  if (!slot) {
    auto s = std::make_unique<Slot>();
    s->address = address;
    s->kind = kind;
    slot = s.get();
    slots_.emplace(address, std::move(s));
  }
  slot->suspended = true;
  slot->start_queued = false;
  unqueue(*slot);
  answer(*slot, {{}, 503, public_error("The worker is suspended.", "suspended")});
  log_.info("worker_suspended", "address=\"{}\"", address);
  settle(*slot);
  pump();
  return true;
}

bool Manager::resume(const std::string& address) {
  Slot* slot = find(address);
  if (!slot || !slot->suspended) return false;
  slot->suspended = false;
  log_.info("worker_resumed", "address=\"{}\"", address);
  settle(*slot);
  return true;
}

void Manager::close(std::function<void()> done) {
  if (closing_) {
    if (done) loop_.defer(std::move(done));
    return;
  }
  closing_ = true;
  close_done_ = std::move(done);
  log_.info("workers_closing", "workers={}", workers_live_);
  std::vector<Slot*> slots;
  for (auto& [address, slot] : slots_) slots.push_back(slot.get());
  // Queued and waiting starts first: nothing forks after this.
  for (Slot* slot : slots) {
    slot->start_queued = false;
    unqueue(*slot);
    answer(*slot, {{}, 503, public_error("The server is closing.", "closing")});
  }
  for (Slot* slot : slots) {
    if (slot->worker) begin_stop(*slot->worker, "close");
  }
  if (workers_live_ == 0) finish_close();
  for (Slot* slot : slots) settle(*slot);
}

void Manager::finish_close() {
  idle_check_.cancel();
  if (close_done_) loop_.defer(std::exchange(close_done_, nullptr));
}

nlohmann::json Manager::entry(const std::string& address) const {
  const Slot* slot = find(address);
  return slot ? entry_of(*slot) : nlohmann::json();
}

nlohmann::json Manager::entry_of(const Slot& slot) const {
  nlohmann::json e;
  if (!slot.failed.is_null()) {
    e = {{"status", "failed"}, {"error", slot.failed}, {"at", iso8601(slot.failed_at)}};
  } else if (const Worker* w = slot.worker.get()) {
    e = {{"status", w->stopping ? "stopping"
                    : w->ready  ? "running"
                                : "starting"},
         {"pid", w->pid},
         {"startedAt", iso8601(w->started_at)}};
  } else if (slot.queued) {
    e = {{"status", "queued"}, {"queuedAt", iso8601(slot.queued_at)}};
  } else if (slot.suspended) {
    e = {{"status", "suspended"}};
  }
  if (slot.suspended) e["suspended"] = true;
  return e;
}

nlohmann::json Manager::state() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [address, slot] : slots_) {
    auto e = entry_of(*slot);
    if (!e.is_null()) out[core::wire_encode(address)] = std::move(e);
  }
  return out;
}

std::string Manager::stderr_tail(const std::string& address) const {
  const Slot* slot = find(address);
  return slot ? slot->tail : std::string();
}

void Manager::changed(Slot& slot) {
  nlohmann::json e = entry_of(slot);
  if (e == slot.last_emitted) return;
  slot.last_emitted = e;
  emit(slot.address, e);
}

void Manager::emit(const std::string& address, const nlohmann::json& e) {
  // A watcher may unwatch (itself or another) from its callback: walk a snapshot of the ids.
  std::vector<uint64_t> ids;
  for (const auto& [id, cb] : watchers_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = watchers_.find(id);
    if (it != watchers_.end()) it->second(address, e);
  }
  if (on_change) on_change(address, e);
}

void Manager::settle(Slot& slot) {
  changed(slot);
  if (slot.worker || !slot.waiters.empty() || slot.start_queued || slot.queued ||
      !slot.failed.is_null() || slot.suspended)
    return;
  std::string key = slot.address;
  slots_.erase(key);  // destroys `slot`; its last emitted entry was null
}

uint64_t Manager::watch(ChangeCallback cb) {
  uint64_t id = next_watch_++;
  watchers_.emplace(id, std::move(cb));
  return id;
}

void Manager::unwatch(uint64_t id) {
  watchers_.erase(id);
}

}  // namespace corral::workers
