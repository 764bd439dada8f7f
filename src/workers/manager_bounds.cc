// The Manager's bounds (workers/manager.h, "bounds"): the defaults from the machine's limits, the
// queue of starts and the room a start takes (a stop under way, or the longest-idle worker).
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "workers/manager_impl.h"

namespace corral::workers {

using namespace detail;

namespace {

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
}  // namespace

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

void Manager::enqueue(Home& home) {
  home.queued = true;
  home.queued_ms = loop_.now();
  home.queued_at = loop_.wall_seconds();
  home.queue_pos = queue_.insert(queue_.end(), &home);
}

void Manager::unqueue(Home& home) {
  if (!home.queued) return;
  queue_.erase(home.queue_pos);
  home.queued = false;
  if (Worker* w = std::exchange(home.awaiting, nullptr)) {
    w->claimed_by = nullptr;
    --awaiting_exit_;
  }
}

// Starts the queued starts that fit, oldest first: a start that finds a spare of its kind binds it
// (it needs a start place, no room: the spare is counted already). A start over max_workers first
// makes room (it then waits for that exit, keeping its place); at most max_starting wait so at
// once. The first start that finds no place of its kind (a start place, or a place to wait for an
// exit) ends the round: nothing overtakes it.
void Manager::pump() {
  if (pumping_) {  // a watcher called back into the manager: one more round after this one
    pump_again_ = true;
    return;
  }
  pumping_ = true;
  do {
    pump_again_ = false;
    for (auto it = queue_.begin(); it != queue_.end() && !closing_;) {
      Home& home = **it++;  // advanced first: the home may leave the queue (and go) below
      if (home.awaiting) continue;
      if (Worker* spare = spare_for(*home.kind)) {  // a warm spare: no fork, no room needed
        if (starting_ >= options_.max_starting) break;
        unqueue(home);
        spare_bind(home, *spare);
        continue;
      }
      if (has_room(home)) {
        if (starting_ >= options_.max_starting) break;
        unqueue(home);
        start(home);
      } else {
        if (awaiting_exit_ >= options_.max_starting) break;
        make_room(home);
      }
    }
  } while (pump_again_);
  pumping_ = false;
  spares_schedule();  // room, or a start place, may have freed for a spare
}

// Whether `home`'s kind and the total are under max_workers.
bool Manager::has_room(const Home& home) const {
  const Kind& kind = *home.kind;
  return live_by_kind_[kind.index] < kind.config.max_workers &&
         workers_live_ < options_.max_workers;
}

// For a start over max_workers: it waits for a stop already under way or stops the longest-idle
// worker, or, with neither, is refused with 503 and leaves the queue.
void Manager::make_room(Home& home) {
  const Kind& kind = *home.kind;
  size_t kind_live = live_by_kind_[kind.index];
  bool kind_full = kind_live >= kind.config.max_workers;
  const Kind* of = kind_full ? &kind : nullptr;  // a worker of its own kind frees both bounds
  Worker* w = room_from(of, /*stopping=*/true);
  if (!w) w = spare_room(of);  // spares are the first to go
  if (!w && (w = room_from(of, /*stopping=*/false))) {
    log_.info("worker_evicted", "address=\"{}\" pid={} idle_ms={} for=\"{}\" bound={}",
              w->home->address, w->pid, loop_.now() - w->idle_since, home.address,
              kind_full ? "kind" : "all");
    begin_stop(*w, "evicted");
  }
  if (w) {
    w->claimed_by = &home;
    home.awaiting = w;
    ++awaiting_exit_;
    return;
  }
  log_.warn("worker_limit",
            "address=\"{}\" live={} max_workers={} kind_live={} kind_max_workers={} bound={} "
            "reason=\"no idle worker to stop\"",
            home.address, workers_live_, options_.max_workers, kind_live,
            kind.config.max_workers == SIZE_MAX ? 0 : kind.config.max_workers,
            kind_full ? "kind" : "all");
  unqueue(home);
  answer(home, {{}, 503, public_error("Too many workers.", "worker_limit"), kRetryAfterS});
  settle(home);
}

// A worker whose exit would make room (of `kind`, or any when null) and that no other start
// waits for: one already stopping, or (stopping false) the longest-idle one that may be stopped.
Manager::Worker* Manager::room_from(const Kind* kind, bool stopping) {
  const uint64_t now = loop_.now();
  Worker* best = nullptr;
  for (auto& [address, s] : homes_) {
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
// is refused: the start places are held by starts that do not finish (a burst that moves, however
// long, is not refused).
void Manager::expire_queued() {
  const uint64_t now = loop_.now();
  std::vector<Home*> due;
  for (Home* s : queue_) {
    uint64_t t = s->kind->config.start_timeout_ms;
    if (!s->awaiting && now - s->queued_ms >= t && now - progress_ms_ >= t) due.push_back(s);
  }
  for (Home* s : due) {
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

}  // namespace corral::workers
