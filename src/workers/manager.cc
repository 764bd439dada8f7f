#include "workers/manager.h"
#include "workers/manager_impl.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/escape.h"
#include "core/socket.h"
#include "http/percent.h"
#include "workers/control_codec.h"
#include "workers/orphans.h"

namespace corral::workers {

using namespace detail;

namespace {

// A child that closed its control link may simply be exiting: its fds close a moment before its
// pidfd reports the exit. The link is called lost only if the child still lives this much later.
constexpr uint32_t kLinkCheckMs = 100;
constexpr size_t kMaxPartialLine = 16 * 1024;
constexpr size_t kMaxPublicField = 1024;

}  // namespace

nlohmann::json detail::sanitize_error(const nlohmann::json& e) {
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

Manager::~Manager() {
  // Whatever is left dies with the manager: a destructor cannot wait for a grace period.
  for (auto& [address, home] : homes_) {
    if (!home->worker) continue;
    kill_now(*home->worker);
    remove_socket(*home);
  }
  spares_destroy();
  sweep_orphans(/*wait=*/true);  // what they left outside their groups, reaped before we go
}

void Manager::signal(const Worker& w, int sig) {
  launcher_->signal(w.pid, w.pidfd.get(), sig);
}

void Manager::sweep_orphans(bool wait) {
  if (!options_.sweep_orphans) return;
  std::set<pid_t> workers;
  for (const auto& [address, home] : homes_)
    if (home->worker && !home->worker->exited) workers.insert(home->worker->pid);
  for (const auto& kind : kinds_)
    for (const auto& s : kind->spares)
      if (s->worker && !s->worker->exited) workers.insert(s->worker->pid);
  auto is_worker = [&workers](pid_t pid) { return workers.count(pid) > 0; };
  // A destructor's sweep waits for each orphan; the ones their deaths hand to us come in the
  // next round (a tree deeper than a sweep kills, or forks that raced the kills).
  for (int round = 0; round < (wait ? 16 : 1); ++round) {
    SweepResult r = launcher_->sweep_orphans(session_, is_worker, wait);
    if (r.killed || r.reaped)
      log_.info("worker_orphans", "killed={} reaped={} left={}", r.killed, r.reaped, r.left);
    if (wait) {
      if (r.killed == 0 && r.left == 0) break;
      continue;
    }
    // Their children reach us when they die: look again soon, then less and less often.
    if (r.killed || r.left) {
      orphan_retry_ms_ = std::clamp<uint32_t>(orphan_retry_ms_ * 2, 10, 1'000);
      orphan_sweep_.arm_after(orphan_retry_ms_);
    } else {
      orphan_retry_ms_ = 0;
    }
  }
}

// The destructor's way out for a worker or a spare: off the loop, its group killed, reaped.
void Manager::kill_now(Worker& w) {
  loop_.remove(w.pidfd.get());
  if (w.control) loop_.remove(w.control.get());
  w.out.close();
  w.err.close();
  launcher_->kill_and_wait(w.pid, w.pidfd.get());
}

// Only our own socket file: another manager on the same state directory (corral restarted while
// an old worker still stopped) may have replaced it.
void Manager::remove_socket(Home& home) {
  struct stat st;
  if (home.socket_path.empty() || ::stat(home.socket_path.c_str(), &st) < 0) return;
  if (st.st_ino == home.socket_inode) ::unlink(home.socket_path.c_str());
}

const Manager::Kind* Manager::kind_of(std::string_view address) const {
  auto colon = address.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) return nullptr;
  auto name = address.substr(0, colon);
  for (const auto& k : kinds_)
    if (k->config.name == name) return k.get();
  return nullptr;
}

Manager::Home* Manager::find(const std::string& address) {
  auto it = homes_.find(address);
  return it == homes_.end() ? nullptr : it->second.get();
}

const Manager::Home* Manager::find(const std::string& address) const {
  auto it = homes_.find(address);
  return it == homes_.end() ? nullptr : it->second.get();
}

void Manager::resolve(const std::string& address, ResolveCallback cb) {
  const Kind* kind = kind_of(address);
  if (!kind) return cb({{}, 404, public_error("No such worker.", "unknown_kind")});
  if (closing_) return cb({{}, 503, public_error("The server is closing.", "closing")});
  Home* home = find(address);
  if (home && home->suspended)
    return cb({{}, 503, public_error("The worker is suspended.", "suspended")});
  if (home && !home->failed.is_null()) return cb({{}, 503, home->failed});
  if (home && home->worker && home->worker->ready && !home->worker->stopping)
    return cb({home->socket_path, 200, nullptr, 0, home->worker->pid, false});
  if (!home) {
    auto s = std::make_unique<Home>();
    s->address = address;
    s->kind = kind;
    home = s.get();
    homes_.emplace(address, std::move(s));
  }
  home->waiters.push_back(std::move(cb));
  if (home->worker) {
    if (home->worker->stopping) home->start_queued = true;  // a start waits for the exit
    return;
  }
  if (home->queued) return;
  enqueue(*home);
  std::string key = home->address;  // pump() may answer the start and erase the home
  pump();
  if (Home* s = find(key); s && s->queued) changed(*s);
}

void Manager::answer(Home& home, const Resolution& r) {
  if (home.waiters.empty()) return;
  // Deferred: a callback may call back into the manager (retry, resolve) and change this home.
  loop_.defer([waiters = std::move(home.waiters), r] {
    for (const auto& cb : waiters) cb(r);
  });
  home.waiters.clear();
}

void Manager::start(Home& home) {
  const KindConfig& cfg = home.kind->config;
  auto data = start_data(home);
  if (!data) return;
  home.socket_path = socket_path_for(home.address);
  auto listener = core::listen_unix(home.socket_path);
  if (!listener)
    return fail(home, public_error("The worker could not be started.", "start_failed"),
                listener.error().reason);
  struct stat st;
  home.socket_inode = ::stat(home.socket_path.c_str(), &st) == 0 ? st.st_ino : 0;
  LaunchSpec spec{cfg.command,        cfg.env,         core::wire_encode(home.address),
                  options_.state_dir, listener->get(), cfg.in_process};
  spec.limits = cfg.limits;
  auto launched = launcher_->launch(spec);
  if (!launched) {
    ::unlink(home.socket_path.c_str());
    return fail(home, public_error("The worker could not be started.", "start_failed"),
                launched.error().reason);
  }
  Worker* w = adopt(home, std::move(launched.value()), std::move(listener.value()));
  begin_start(*w, std::move(*data));
}

std::optional<nlohmann::json> Manager::start_data(Home& home) {
  const KindConfig& cfg = home.kind->config;
  if (!cfg.start_hook) return nlohmann::json::object();
  try {
    return cfg.start_hook(home.address);
  } catch (const std::exception& e) {
    fail(home, public_error("The worker could not be started.", "start_failed"),
         std::string("start hook threw: ") + e.what());
  } catch (...) {
    fail(home, public_error("The worker could not be started.", "start_failed"),
         "start hook threw a non-exception");
  }
  return std::nullopt;
}

std::string Manager::socket_path_for(const std::string& address) const {
  std::string socket_dir = options_.state_dir + "/sockets/";
  return socket_dir + core::bounded_file_name(
                          address, std::min<size_t>(kMaxLockName, sizeof(sockaddr_un::sun_path) -
                                                                      1 - socket_dir.size()));
}

// The worker of a launch, in `home`: its descriptors watched, its timers bound, counted live.
Manager::Worker* Manager::adopt(Home& home, Launched launched, core::UniqueFd listener) {
  auto w = std::make_unique<Worker>(*this, home);
  w->pid = launched.pid;
  w->pidfd = std::move(launched.pidfd);
  w->control = std::move(launched.control);
  w->out.fd = std::move(launched.out);
  w->err.fd = std::move(launched.err);
  w->listener = std::move(listener);
  w->started_at = loop_.wall_seconds();
  Worker* wp = w.get();
  w->start_timer.bind(loop_.timers(), [this, wp] { on_start_timeout(*wp); });
  w->ready_timer.bind(loop_.timers(), [this, wp] { on_ready_timeout(*wp); });
  w->kill_timer.bind(loop_.timers(), [this, wp] { signal(*wp, SIGKILL); });
  w->link_check.bind(loop_.timers(), [this, wp] { on_link_check(*wp); });
  (void)loop_.add(w->pidfd.get(), EPOLLIN, w.get());
  (void)loop_.add(w->control.get(), EPOLLIN, &w->control_handler);
  (void)loop_.add(w->out.fd.get(), EPOLLIN, &w->out);
  (void)loop_.add(w->err.fd.get(), EPOLLIN, &w->err);
  home.worker = std::move(w);
  ++workers_live_;
  ++live_by_kind_[home.kind->index];
  arm_idle_check();
  return wp;
}

// `start` to a worker in its address's home (just launched, or a spare just bound): from now on
// it is starting, under the start timer.
void Manager::begin_start(Worker& w, nlohmann::json start_data) {
  Home& home = *w.home;
  const KindConfig& cfg = home.kind->config;
  w.started_at = loop_.wall_seconds();
  w.start_ms = loop_.now();
  if (cfg.code) w.version = cfg.code->version;
  w.start_timer.arm_after(cfg.start_timeout_ms);
  ++starting_;
  w.counts_starting = true;
  kinds_[home.kind->index]->counters.started(w.from_spare);
  log_.info("worker_starting", "address=\"{}\" pid={}{}", home.address, w.pid,
            w.from_spare ? " spare=true" : "");
  // The code set goes by reference (code.manifest): its size never makes the message too large.
  nlohmann::json msg = control::start(core::wire_encode(home.address), std::move(start_data),
                                      options_.state_dir + "/locks/" + lock_file_name(home.address),
                                      cfg.code ? &*cfg.code : nullptr);
  rollout_on_start(home);
  errno = 0;
  if (!send(w, msg)) {
    // A worker that already exited (a program that is not a worker, one that dies at once):
    // its exit, read from its pidfd next, fails the start as worker_exited with its status.
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) return changed(home);
    // A start that never reaches a live worker would only fail at start_timeout: say why now (a
    // code set too large for the control socket's buffer, say).
    return fail(home, public_error("The worker could not be started.", "start_failed"),
                "the start message could not be sent on the control link");
  }
  changed(home);
}

bool Manager::send(Worker& w, const nlohmann::json& msg) {
  if (!w.control) return false;
  // Addresses cross JSON in their wire form (core::wire_encode), so this only fails for a path or
  // a start hook's data that is not valid UTF-8.
  auto text = control::encode(msg);
  if (!text) {
    log_.error("worker_message_unwritable", "error=\"{}\"", text.error().reason);
    return false;
  }
  const std::string& data = text.value();
  return ::send(w.control.get(), data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(data.size());
}

void Manager::read_control(Worker& w) {
  // Several packets per wakeup, bounded so one chatty worker cannot starve the loop.
  for (int i = 0; i < 16 && w.control; ++i) {
    char buf[control::kMaxPacket];
    ssize_t n = ::recv(w.control.get(), buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) return on_link_closed(w);
    if (static_cast<size_t>(n) > sizeof buf) {
      log_.warn("worker_protocol_error", "address=\"{}\" error=\"packet of {} bytes\"",
                w.home->address, n);
      return on_link_closed(w);
    }
    auto msg = control::decode(std::string_view(buf, static_cast<size_t>(n)));
    if (!msg) {
      log_.warn("worker_protocol_error", "address=\"{}\" error=\"{}\"", w.home->address,
                msg.error().reason);
      return on_link_closed(w);
    }
    on_message(w, msg.value().body);
  }
}

void Manager::on_message(Worker& w, const nlohmann::json& msg) {
  if (w.spare) return spare_on_message(w, msg);
  Home& home = *w.home;
  const std::string type = msg["type"].get<std::string>();
  auto idle_of = [&msg] {
    auto it = msg.find("idle");
    return it == msg.end() || !it->is_boolean() || it->get<bool>();
  };
  if (type == "started" || (type == "ready" && !w.started)) {
    if (!w.started) {
      w.started = true;
      w.start_timer.cancel();
      w.ready_timer.arm_after(home.kind->config.ready_timeout_ms);  // the setup's bound
      log_.info("worker_started", "address=\"{}\" pid={}", home.address, w.pid);
      if (w.stop_after_started && !w.stopping) begin_stop(w, w.stop_reason);
    }
  }
  if (type == "ready") {
    if (w.ready || w.stopping) return;
    w.ready = true;
    w.ready_timer.cancel();
    home.spare_lost = false;
    auto reload = msg.find("reload");
    w.can_reload = reload != msg.end() && reload->is_boolean() && reload->get<bool>();
    w.idle = idle_of();
    w.served = !w.idle;
    w.idle_since = w.ready_at = loop_.now();
    w.idle_since_wall = loop_.wall_seconds();
    record_holds(w, msg);
    heartbeat_on_ready(w, msg);
    log_.info("worker_ready", "address=\"{}\" pid={} idle={}", home.address, w.pid, w.idle);
    // A rollout may replace it now (its waiters then wait for the new worker).
    rollout_on_ready(w);
    if (!w.stopping) answer(home, {home.socket_path, 200, nullptr, 0, w.pid, true});
    changed(home);
    if (std::exchange(w.counts_starting, false)) {
      record_start_latency(*kinds_[home.kind->index], loop_.now() - w.start_ms, w.from_spare);
      --starting_;
      progress_ms_ = loop_.now();
      pump();
    }
  } else if (type == "reloaded") {
    rollout_on_reloaded(w, msg);
  } else if (type == "idle") {
    bool idle = idle_of();
    if (idle && !w.idle) {
      w.idle_since = loop_.now();
      w.idle_since_wall = loop_.wall_seconds();
    }
    if (!idle) w.served = true;
    w.idle = idle;
    record_holds(w, msg);
    if (w.ready) changed(home);  // idle_since, idle_stop_at and holds are in its entry
  } else if (type == "pong") {
    heartbeat_on_pong(w, msg);
  } else if (type == "fatal") {
    auto it = msg.find("error");
    nlohmann::json pub = sanitize_error(it == msg.end() ? nlohmann::json() : *it);
    // Containment (containment.h): an allocation failed under the kind's memory limit.
    if (ended_by_memory_limit({}, pub, home.kind->config.limits)) pub = memory_limit_error();
    if (w.stopping) {
      // An error while it stops (a closer failing) is no failure of the address: it was asked to
      // go.
      log_.warn("worker_error_on_stop", "address=\"{}\" pid={} error={}", home.address, w.pid,
                log_json(msg));
      return;
    }
    fail(home, pub, "fatal: " + log_json(msg).text);
  }
  // Unknown types are ignored (forward compatibility).
}

void Manager::on_link_closed(Worker& w) {
  loop_.remove(w.control.get());
  w.control.reset();
  w.link_check.arm_after(kLinkCheckMs);
}

void Manager::on_link_check(Worker& w) {
  Liveness liveness = launcher_->liveness(w.pid, w.pidfd.get());
  if (liveness == Liveness::exited) return;  // on_exit decides (a crash, or the end of a stop)
  if (w.stopping) return;                    // a stopping worker may close its link first
  if (liveness == Liveness::exiting) {
    // Killed or exiting, its exit not reported yet: look again rather than call a crash a lost
    // link (a lost link after ready is recovered from; a crash is a failure).
    w.link_check.arm_after(kLinkCheckMs);
    return;
  }
  if (w.spare) return spare_stop(w, "link_lost");
  link_lost(w, "link_lost", public_error("The worker lost its link.", "link_lost"));
}

void Manager::link_lost(Worker& w, std::string_view why, nlohmann::json error) {
  Home& home = *w.home;
  const uint64_t now = loop_.now();
  rollout_on_link_lost(home);
  if (!w.ready) {
    return fail(home, std::move(error),
                why == "link_lost" ? std::string("the control link closed before ready")
                                   : fmt::format("{} before ready", why));
  }
  // Kept outside the home: the home goes with the recovered worker's exit, the memory must not.
  auto it = recoveries_.find(home.address);
  if (it != recoveries_.end() && now - it->second < options_.link_recovery_window_ms) {
    return fail(home, std::move(error),
                fmt::format("{}: a second lost control link within the recovery window", why));
  }
  recoveries_[home.address] = now;
  log_.warn("worker_link_lost", "address=\"{}\" pid={} action=stop reason={}", home.address, w.pid,
            why);
  begin_stop(w, why);
}

void Manager::on_start_timeout(Worker& w) {
  Home& home = *w.home;
  fail(home, public_error("The worker did not start in time.", "start_timeout"),
       fmt::format("no `started` within {} ms of the fork", home.kind->config.start_timeout_ms));
  signal(w, SIGKILL);  // no grace: it never took its lock, there is nothing to close
}

// Past the setup's bound: a worker that took its lock and never said `ready` holds a start place
// and its requests for ever. It is failed like a start that timed out, and killed at once: a
// setup that is stuck would not read `shutdown` either.
void Manager::on_ready_timeout(Worker& w) {
  Home& home = *w.home;
  fail(home, public_error("The worker did not get ready in time.", "ready_timeout"),
       fmt::format("no `ready` within {} ms of `started`", home.kind->config.ready_timeout_ms));
  signal(w, SIGKILL);
}

void Manager::begin_stop(Worker& w, std::string_view why) {
  if (w.stopping) return;
  Home& home = *w.home;
  w.stopping = true;
  w.start_timer.cancel();
  w.ready_timer.cancel();
  if (!home.start_queued)
    answer(home, {{}, 503, public_error("The worker was stopped.", "stopped")});
  log_.info("worker_stopping", "address=\"{}\" pid={} reason={}", home.address, w.pid, why);
  kinds_[home.kind->index]->counters.stopped(why);
  // From now on a connect finds no socket (ENOENT), which the proxy knows never sent anything and
  // so tries again through a fresh resolve (a start queued behind this stop). Left in place, it
  // would queue on a worker that no longer accepts and be reset at its exit: for a POST, a 502.
  remove_socket(home);
  // Without a link, SIGTERM is the same request (the worker library treats them alike).
  if (!send(w, control::shutdown())) signal(w, SIGTERM);
  w.kill_timer.arm_after(home.kind->config.stop_grace_ms);
  changed(home);
}

void Manager::fail(Home& home, nlohmann::json pub, std::string full) {
  auto code = pub.find("code");
  kinds_[home.kind->index]->counters.failed(
      code != pub.end() && code->is_string() ? std::string_view(code->get_ref<const std::string&>())
                                             : "",
      full.starts_with("fatal: "));
  home.failed = std::move(pub);
  home.failed_at = loop_.wall_seconds();
  home.start_queued = false;
  answer(home, {{}, 503, home.failed});
  rollout_on_failed(home);
  Worker* w = home.worker.get();
  if (w && !w->stopping) {
    w->failure_log = std::move(full);  // logged at its exit, with all its stderr
    begin_stop(*w, "failed");
  } else if (w) {
    if (w->failure_log.empty()) w->failure_log = std::move(full);
  } else {
    log_.error("worker_failed", "address=\"{}\" error=\"{}\" public={} stderr_tail=\"{}\"",
               home.address, full, log_json(home.failed), home.tail);
  }
  changed(home);
}

void Manager::on_exit(Worker& w) {
  if (w.spare) return spare_on_exit(w);
  Home& home = *w.home;
  // The launcher kills what it left in its group (which does not outlive its leader), reaps it
  // and removes its containment group.
  std::optional<WorkerExit> exit = launcher_->reap(w.pid, w.pidfd.get());
  if (!exit) return;
  std::string how = exit->text();
  const ExitCause cause = exit->cause;
  loop_.remove(w.pidfd.get());
  if (w.control) loop_.remove(w.control.get());
  w.out.drain();
  w.err.drain();
  w.out.close();
  w.err.close();
  if (!w.out.partial.empty()) on_output(w, false, {}, true);
  if (!w.err.partial.empty()) on_output(w, true, {}, true);
  bool asked = w.stopping || closing_;
  log_.info("worker_exited", "address=\"{}\" pid={} how=\"{}\" asked={}", home.address, w.pid, how,
            asked);
  std::string failure = std::move(w.failure_log);
  w.exited = true;
  loop_.destroy_later(std::move(home.worker));
  --workers_live_;
  --live_by_kind_[home.kind->index];
  if (w.counts_starting) --starting_;
  progress_ms_ = loop_.now();
  if (Home* claimer = std::exchange(w.claimed_by, nullptr)) {  // its room is there now
    claimer->awaiting = nullptr;
    --awaiting_exit_;
  }
  remove_socket(home);
  // Containment: a worker its memory limit killed (its cgroup's OOM kill) fails with that reason
  // (containment.h; under rlimits the worker's own `fatal` says so, on_message).
  bool by_memory = !asked && ended_by_memory_limit(cause, nullptr, home.kind->config.limits);
  // A spare that died after its bind but before `started` (killed meanwhile, or dead before it
  // read `start`) never ran anything of the address: as for a spare that dies before its bind,
  // that is no failure of the address. Its start is made again, once (a kind whose spares all
  // die at `start` then fails as usual), with another spare or a fork.
  const bool rebind = !asked && failure.empty() && !by_memory && w.from_spare && !w.started &&
                      !w.stop_after_started && !home.spare_lost && !home.suspended;
  if (rebind) {
    home.spare_lost = true;
    log_.warn("worker_spare_lost", "address=\"{}\" pid={} how=\"{}\" action=start_again",
              home.address, w.pid, how);
  } else if (!failure.empty()) {
    log_.error("worker_failed",
               "address=\"{}\" error=\"{}\" exit=\"{}\" public={} stderr_tail=\"{}\"", home.address,
               failure, how, log_json(home.failed), home.tail);
  } else if (!asked) {
    fail(home,
         by_memory ? memory_limit_error()
                   : public_error("The worker exited unexpectedly.", "worker_exited"),
         (w.started ? "exited: " : "exited before `started`: ") + how);
  }
  // A rollout's replacement starts at once, waited for or not.
  bool replace = !rebind && rollout_on_exit(home, !failure.empty() || !asked);
  if (rebind && !home.queued && (!home.waiters.empty() || rollout_entry(home)))
    enqueue(home);  // its waiters (or a rollout's replacement) wait on
  if (home.start_queued) {
    home.start_queued = false;
    if (!home.waiters.empty() || replace)
      enqueue(home);  // fail() above answered them if it crashed
  }
  if (closing_ && workers_live_ == 0) finish_close();
  settle(home);
  sweep_orphans();  // what it left outside its group came to us at its exit
  pump();           // a worker place, and perhaps a start place, is free
}

void Manager::on_output(Worker& w, bool is_err, std::string_view data, bool eof) {
  Home& home = *w.home;
  OutputReader& r = is_err ? w.err : w.out;
  if (is_err && !data.empty()) {
    home.tail.append(data);
    if (home.tail.size() > options_.stderr_tail_bytes)
      home.tail.erase(0, home.tail.size() - options_.stderr_tail_bytes);
  }
  // "<time> <address> [<pid>] <line>" (kind_log.h), both escaped (core/escape.h): neither the
  // address nor what the worker wrote can start a line of its own. A line's time is when its
  // first byte was read: a partial line keeps the time it began.
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  const std::string prefix = kind_log_address(home.address);
  std::string lines;
  auto emit = [&](std::string_view line, int64_t at_ms) {
    append_kind_log_line(lines, at_ms, prefix, w.pid, line);
  };
  while (!data.empty()) {
    auto nl = data.find('\n');
    if (nl == std::string_view::npos) {
      if (r.partial.empty()) r.partial_ms = now_ms;
      r.partial.append(data);
      if (r.partial.size() > kMaxPartialLine) {
        emit(r.partial, r.partial_ms);
        r.partial.clear();
      }
      break;
    }
    if (r.partial.empty()) {
      emit(data.substr(0, nl), now_ms);
    } else {
      r.partial.append(data.substr(0, nl));
      emit(r.partial, r.partial_ms);
      r.partial.clear();
    }
    data.remove_prefix(nl + 1);
  }
  if (eof && !r.partial.empty()) {
    emit(r.partial, r.partial_ms);
    r.partial.clear();
  }
  if (lines.empty()) return;
  const KindConfig& cfg = home.kind->config;
  KindLog& file = kind_logs_.of(cfg.name, options_.state_dir + "/logs", cfg.log_rotation);
  if (auto r = file.write(lines); !r)
    log_.error("worker_log_failed", "path=\"{}\" error=\"{}\"", file.path(), r.error().reason);
  if (output_watchers_.empty()) return;
  std::vector<uint64_t> ids;  // a watcher may unwatch itself, or another
  for (const auto& [id, cb] : output_watchers_) ids.push_back(id);
  for (uint64_t id : ids)
    if (auto it = output_watchers_.find(id); it != output_watchers_.end())
      it->second(cfg.name, lines);
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
  for (auto& [address, home] : homes_) {
    Worker* w = home->worker.get();
    if (w && w->ready && !w->stopping && w->idle &&
        now - w->idle_since >= home->kind->config.idle_ms && !connection_waiting(*w))
      due.push_back(w);
  }
  for (Worker* w : due) begin_stop(*w, "idle");
  expire_queued();
  // Orphans come at a worker's exit (swept there); this finds those of a worker that gave up
  // being a subreaper, and zombies of orphans that died by themselves.
  if (!orphan_sweep_.armed()) sweep_orphans();
}

bool Manager::retry(const std::string& address) {
  Home* home = find(address);
  if (!home || (home->failed.is_null() && !home->suspended)) return false;
  home->failed = nullptr;
  home->suspended = false;
  recoveries_.erase(address);
  log_.info("worker_retry", "address=\"{}\"", address);
  settle(*home);
  return true;
}

bool Manager::stop(const std::string& address) {
  Home* home = find(address);
  if (!home) return false;
  bool acted = false;
  if (home->start_queued || home->queued) {  // the queued start is cancelled; its waiters are told
    home->start_queued = false;
    unqueue(*home);
    answer(*home, {{}, 503, public_error("The worker was stopped.", "stopped")});
    acted = true;
  }
  if (Worker* w = home->worker.get()) {
    acted = true;
    if (!w->started && !w->stopping)
      w->stop_after_started = true;  // a stop during a start waits for it
    else
      begin_stop(*w, "stop");
  }
  if (acted) settle(*home);
  if (acted) pump();  // a cancelled start may have held a place
  return acted;
}

bool Manager::suspend(const std::string& address) {
  const Kind* kind = kind_of(address);
  if (!kind) return false;
  Home* home = find(address);
  if (!home) {
    auto s = std::make_unique<Home>();
    s->address = address;
    s->kind = kind;
    home = s.get();
    homes_.emplace(address, std::move(s));
  }
  home->suspended = true;
  home->start_queued = false;
  unqueue(*home);
  answer(*home, {{}, 503, public_error("The worker is suspended.", "suspended")});
  log_.info("worker_suspended", "address=\"{}\"", address);
  settle(*home);
  pump();
  return true;
}

bool Manager::resume(const std::string& address) {
  Home* home = find(address);
  if (!home || !home->suspended) return false;
  home->suspended = false;
  log_.info("worker_resumed", "address=\"{}\"", address);
  settle(*home);
  return true;
}

void Manager::close(std::function<void()> done) {
  if (closing_) {
    if (done) loop_.defer(std::move(done));
    return;
  }
  closing_ = true;
  close_done_ = std::move(done);
  rollout_on_close();
  log_.info("workers_closing", "workers={}", workers_live_);
  std::vector<Home*> homes;
  for (auto& [address, home] : homes_) homes.push_back(home.get());
  // Queued and waiting starts first: nothing forks after this.
  for (Home* home : homes) {
    home->start_queued = false;
    unqueue(*home);
    answer(*home, {{}, 503, public_error("The server is closing.", "closing")});
  }
  for (Home* home : homes) {
    if (home->worker) begin_stop(*home->worker, "close");
  }
  spares_on_close();
  if (workers_live_ == 0) finish_close();
  for (Home* home : homes) settle(*home);
}

void Manager::finish_close() {
  idle_check_.cancel();
  if (close_done_) loop_.defer(std::exchange(close_done_, nullptr));
}

}  // namespace corral::workers
