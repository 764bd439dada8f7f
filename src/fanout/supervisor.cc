#include "fanout/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <cerrno>

#include <algorithm>

namespace corral::fanout {

core::Result<ListenerSet> make_listeners(const std::vector<core::SocketAddress>& addresses,
                                         int slots, const ListenerSet* previous,
                                         std::vector<core::UniqueFd>* passed) {
  ListenerSet set;
  set.addresses = addresses;
  set.slots.resize(static_cast<size_t>(slots));
  auto claim = [&](const core::SocketAddress& address) -> core::Result<void> {
    std::string name = claim_name("tcp", address);
    if (previous)
      for (const auto& c : previous->claims)
        if (c && c->name() == name) {
          set.claims.push_back(c);  // a reload keeping the address: ours already
          return {};
        }
    auto c = claim_listen("tcp", address);
    if (!c) return c.error();
    set.claims.push_back(std::move(c.value()));
    return {};
  };
  for (size_t a = 0; a < addresses.size(); ++a) {
    if (passed && a < passed->size() && (*passed)[a]) {
      core::UniqueFd& fd = (*passed)[a];
      auto bound = core::local_address(fd.get());
      if (!bound) return bound.error();
      set.addresses[a] = bound.value();
      for (int i = 1; i < slots; ++i) {
        core::UniqueFd copy(fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
        if (!copy) return core::Error{errno, "dup of a passed socket failed"};
        set.slots[static_cast<size_t>(i)].push_back(std::move(copy));
      }
      set.slots[0].push_back(std::move(fd));
      continue;
    }
    if (set.addresses[a].port() != 0)
      if (auto r = claim(set.addresses[a]); !r) return r.error();
    for (int i = 0; i < slots; ++i) {
      auto fd = core::listen_tcp(set.addresses[a], {.backlog = 4096, .reuse_port = true});
      if (!fd) return fd.error();
      if (i == 0 && set.addresses[a].port() == 0) {
        auto bound = core::local_address(fd->get());
        if (!bound) return bound.error();
        set.addresses[a] = bound.value();  // the others join the port the kernel chose
        if (auto r = claim(set.addresses[a]); !r) return r.error();
      }
      set.slots[static_cast<size_t>(i)].push_back(std::move(fd.value()));
    }
  }
  return set;
}

struct Supervisor::Child final : core::IoHandler {
  struct Ready final : core::IoHandler {
    Child* child = nullptr;
    void on_io(uint32_t) override { child->sup.on_child_ready(child); }
  };

  Child(Supervisor& s)
      : sup(s), kill_timer(s.loop_.timers(), [this] {
          sup.log_.warn("process_killed", "slot={} pid={} generation={} reason=stop_timeout", slot,
                        pid, generation);
          sup.launcher_.signal(pid, SIGKILL);
        }) {
    ready_handler.child = this;
  }
  void on_io(uint32_t) override {
    if (auto exit = sup.launcher_.reap(pidfd.get()))
      sup.on_child_exit(this, exit->code, exit->signo);
  }

  Supervisor& sup;
  pid_t pid = 0;
  core::UniqueFd pidfd;
  core::UniqueFd ready_rd;
  Ready ready_handler;
  int slot = 0;
  uint64_t generation = 0;
  uint64_t started_ms = 0;
  bool ready = false;
  bool sent_term = false;
  bool draining = false;  // sent kDrainSignal (a newer generation serves its slot)
  time_t drain_since = 0;
  core::Timer kill_timer;  // after the supervisor's own SIGTERM to an old process
  std::shared_ptr<ListenerSet> listeners;
  std::unique_ptr<core::MessageLink> link;
};

struct Supervisor::Slot {
  int index = 0;
  int cpu = -1;
  uint32_t restarts = 0;
  uint32_t backoff_ms = 0;
  std::string last_exit;
  std::string status = "starting";
  time_t started_at = 0;
  Child* current = nullptr;
  core::Timer respawn;
  bool spawn_waiting = false;  // the new generation's process waits for an old one's exit
};

Supervisor::Supervisor(core::EventLoop& loop, core::Logger& log, Launcher& launcher,
                       SupervisorOptions options)
    : loop_(loop),
      log_(log),
      launcher_(launcher),
      options_(std::move(options)),
      stop_deadline_(loop.timers(), [this] {
        log_.warn("stop_deadline", "processes={} action=SIGKILL", children_.size());
        kill_all(SIGKILL, false);
      }) {
  for (int i = 0; i < options_.processes; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->index = i;
    if (options_.pin && static_cast<size_t>(i) < options_.cpus.size())
      slot->cpu = options_.cpus[static_cast<size_t>(i)];
    slot->respawn.bind(loop_.timers(), [this, i] { spawn(i); });
    slots_.push_back(std::move(slot));
  }
}

Supervisor::~Supervisor() {
  for (auto& c : children_) {
    loop_.remove(c->pidfd.get());
    if (c->ready_rd) loop_.remove(c->ready_rd.get());
  }
}

core::Result<void> Supervisor::start(std::shared_ptr<ListenerSet> listeners, ChildMain main) {
  listeners_ = std::move(listeners);
  main_ = std::move(main);
  generation_ = 1;
  if (options_.max_draining > kGenerations - 1)
    options_.max_draining = static_cast<uint32_t>(kGenerations - 1);
  for (int i = 0; i < options_.processes; ++i) {
    size_t before = children_.size();
    spawn(i);
    if (i == 0 && children_.size() == before) {
      slots_[0]->respawn.cancel();  // the caller gives up: no retry behind its back
      return core::Error{EAGAIN, "the first spawn failed"};
    }
  }
  return {};
}

void Supervisor::spawn(int index) {
  if (terminating_) return;
  Slot& slot = *slots_[static_cast<size_t>(index)];
  // A fork that could not be made is tried again with the backoff of a crash loop: the slot
  // always has a process, a respawn armed or a spawn waiting (what check_finished counts on).
  auto retry_later = [this, &slot] {
    slot.status = "backoff";
    slot.backoff_ms =
        std::clamp(slot.backoff_ms * 2, options_.backoff_min_ms, options_.backoff_max_ms);
    slot.respawn.arm_after(slot.backoff_ms);
  };
  if (Child* holder = index_holder(index)) {
    // Its CIDs and forwarding pair are this generation's too: it must be gone first.
    close_old(holder, "generation_index_reused");
    slot.spawn_waiting = true;
    return;
  }
  slot.spawn_waiting = false;
  auto ready = launcher_.make_ready_pipe();
  if (!ready) {
    log_.error("spawn_failed", "slot={} error=\"{}\"", index, ready.error().reason);
    return retry_later();
  }
  auto link = launcher_.make_link();
  if (!link) {
    log_.error("spawn_failed", "slot={} error=\"{}\"", index, link.error().reason);
    return retry_later();
  }
  // A slot whose sockets were closed (its process exited 0 or 78) gets fresh ones.
  auto& sockets = listeners_->slots[static_cast<size_t>(index)];
  for (size_t a = 0; a < sockets.size(); ++a) {
    if (sockets[a]) continue;
    auto fd = launcher_.listen(listeners_->addresses[a]);
    if (!fd) {
      log_.error("listen_failed", "slot={} address={} error=\"{}\"", index,
                 listeners_->addresses[a].to_string(), fd.error().reason);
      return retry_later();
    }
    sockets[a] = std::move(fd.value());
  }
  auto pid = launcher_.launch(child_context(index, ready->theirs.get(), link->theirs.get()), main_);
  if (!pid) {
    log_.error("fork_failed", "slot={} error=\"{}\"", index, pid.error().reason);
    return retry_later();
  }
  auto pidfd = launcher_.open_pidfd(pid.value());
  if (!pidfd) {
    // Without a pidfd it could not be reaped on the loop: take it back now.
    log_.error("pidfd_open_failed", "pid={} error=\"{}\"", pid.value(), pidfd.error().reason);
    launcher_.kill_and_reap(pid.value());
    return retry_later();
  }
  auto child = std::make_unique<Child>(*this);
  child->pid = pid.value();
  child->pidfd = std::move(pidfd.value());
  child->ready_rd = std::move(ready->ours);
  child->slot = index;
  child->generation = generation_;
  child->started_ms = loop_.now();
  child->listeners = listeners_;
  link->theirs.reset();
  child->link = std::make_unique<core::MessageLink>(loop_, std::move(link->ours));
  (void)loop_.add(child->pidfd.get(), EPOLLIN, child.get());
  (void)loop_.add(child->ready_rd.get(), EPOLLIN, &child->ready_handler);
  // A replacement in the current generation takes the slot now; a new generation's process takes
  // it when it is ready (the old one keeps serving until then).
  if (!slot.current || slot.current->generation == generation_) {
    slot.current = child.get();
    slot.started_at = loop_.wall_seconds();
    slot.status = "starting";
  }
  log_.info("process_started", "slot={} pid={} cpu={} generation={}", index, child->pid, slot.cpu,
            generation_);
  if (on_link) on_link(index, *child->link);
  children_.push_back(std::move(child));
}

ChildContext Supervisor::child_context(int index, int ready_fd, int link_fd) const {
  ChildContext ctx;
  ctx.slot = index;
  ctx.cpu = slots_[static_cast<size_t>(index)]->cpu;
  ctx.generation = generation_;
  ctx.ready_fd = ready_fd;
  ctx.link_fd = link_fd;
  for (auto& fd : listeners_->slots[static_cast<size_t>(index)]) ctx.listen_fds.push_back(fd.get());
  if (const auto& quic = options_.quic; quic && index < quic->slots()) {
    for (auto& fd : quic->udp[static_cast<size_t>(index)]) ctx.udp_fds.push_back(fd.get());
    ctx.forward_rx =
        quic->forward_rx[static_cast<size_t>(index)][generation_index(generation_)].get();
    for (auto& pair : quic->forward_tx) {
      std::array<int, kGenerations> tx{};
      for (size_t g = 0; g < kGenerations; ++g) tx[g] = pair[g].get();
      ctx.forward_tx.push_back(tx);
    }
    if (quic->serving) ctx.quic_serving = quic->serving->words();
  }
  return ctx;
}

void Supervisor::on_child_ready(Child* child) {
  if (!child->ready_rd) return;
  char b;
  [[maybe_unused]] ssize_t n = ::read(child->ready_rd.get(), &b, 1);
  loop_.remove(child->ready_rd.get());
  child->ready_rd.reset();
  if (n != 1) return;  // closed without a byte: the child is exiting; its pidfd will say so
  child->ready = true;
  Slot& slot = *slots_[static_cast<size_t>(child->slot)];
  if (child->generation == generation_) {
    Child* old = slot.current;
    slot.current = child;
    slot.started_at = loop_.wall_seconds();
    slot.status = "running";
    // New connections of the slot (and QUIC Initials the old one reads) go to this one now.
    if (options_.quic && options_.quic->serving)
      options_.quic->serving->set(child->slot, child->generation);
    if (old && old != child && old->generation < child->generation && !old->sent_term &&
        !old->draining)
      drain(old);  // the new process is accepting on the same socket
    enforce_drain_bound(child->slot);
    if (generation_ != serving_generation_ && !terminating_ && serving()) {
      serving_generation_ = generation_;
      if (on_serving) on_serving(generation_);
    }
  } else if (!child->sent_term) {
    child->sent_term = true;  // an old generation's late starter: not needed any more
    launcher_.signal(child->pid, SIGTERM);
  }
}

void Supervisor::on_child_exit(Child* child, int code, int signo) {
  Slot& slot = *slots_[static_cast<size_t>(child->slot)];
  std::string how = signo ? "signal " + std::to_string(signo) : "exit " + std::to_string(code);
  uint64_t ran_ms = loop_.now() - child->started_ms;
  bool current = slot.current == child;
  log_.info("process_exited", "slot={} pid={} generation={} how=\"{}\" ran_ms={}", child->slot,
            child->pid, child->generation, how, ran_ms);
  loop_.remove(child->pidfd.get());
  child->kill_timer.cancel();  // its pid may be reused
  if (child->ready_rd) {
    // Its "ready" byte may be queued in this same epoll batch, after the exit: on_child_ready
    // must not make an exited child (destroyed after this round) the slot's current process.
    loop_.remove(child->ready_rd.get());
    child->ready_rd.reset();
  }
  if (current) {
    slot.current = nullptr;
    slot.last_exit = how;
  }
  bool asked = terminating_ || child->sent_term || child->draining;
  bool respawn = current && !asked && (signo != 0 || (code != 0 && code != kExitBadConfig));
  if (current) {
    // During a reload the slot may already have its next-generation process starting: that one
    // takes the slot instead of a respawn.
    for (auto& c : children_) {
      if (c.get() != child && c->slot == child->slot && c->generation == generation_) {
        slot.current = c.get();
        respawn = false;
      }
    }
  }
  if (current && !asked && code == kExitBadConfig) {
    slot.status = "failed";
    log_.error("process_bad_config", "slot={} exit={} action=not_respawned", child->slot, code);
  } else if (current && !asked && code == 0 && signo == 0) {
    slot.status = "exited";
  }
  if (current && !asked && !respawn) {
    // Not respawned: take the slot's sockets out of the reuseport group, or the kernel would keep
    // hashing new connections to a socket nobody accepts from. (What it had queued is reset.) A
    // later generation binds the slot again. Its QUIC sockets stay: they belong to the slot for
    // the supervisor's whole life (their group and BPF sockarray must not change).
    for (auto& fd : listeners_->slots[static_cast<size_t>(child->slot)]) fd.reset();
    log_.warn("slot_closed", "slot={} reason=\"{}\"", child->slot, how);
  } else if (current) {
    slot.status = "stopped";
  }
  if (respawn) {
    ++slot.restarts;
    if (ran_ms >= options_.stable_ms) {
      slot.backoff_ms = 0;  // it ran long enough: a crash, not a crash loop
    } else {
      slot.backoff_ms =
          std::clamp(slot.backoff_ms * 2, options_.backoff_min_ms, options_.backoff_max_ms);
    }
    if (slot.backoff_ms == 0) {
      // Through the slot's timer (due now), not loop_.defer: check_finished() below must see
      // that this slot will have a process again. (A deferred spawn was invisible to it: with
      // one server process, its kill -9 made the supervisor stop everything and exit.)
      slot.status = "starting";
      slot.respawn.arm_after(0);
    } else {
      slot.status = "backoff";
      log_.warn("process_backoff", "slot={} backoff_ms={} restarts={}", child->slot,
                slot.backoff_ms, slot.restarts);
      slot.respawn.arm_after(slot.backoff_ms);
    }
  }
  // A new generation's process that died before it was ready leaves the old one serving.
  auto it = std::find_if(children_.begin(), children_.end(),
                         [child](const auto& c) { return c.get() == child; });
  loop_.destroy_later(std::move(*it));
  children_.erase(it);
  // A new generation's process that waited for this one's generation index starts now.
  // (spawn_waiting stays set until spawn() runs: check_finished counts it as pending.)
  if (slot.spawn_waiting && !terminating_ && !index_holder(slot.index))
    loop_.defer([this, i = slot.index] { spawn(i); });
  check_finished();
}

void Supervisor::drain(Child* child) {
  if (options_.max_draining == 0) {
    close_old(child, "max_draining_generations=0");
    return;
  }
  child->draining = true;
  child->drain_since = loop_.wall_seconds();
  log_.info("process_draining", "slot={} pid={} generation={}", child->slot, child->pid,
            child->generation);
  launcher_.signal(child->pid, kDrainSignal);
}

void Supervisor::close_old(Child* child, const char* reason) {
  if (child->sent_term) return;
  child->sent_term = true;
  log_.info("process_closing", "slot={} pid={} generation={} reason={}", child->slot, child->pid,
            child->generation, reason);
  launcher_.signal(child->pid,
                   SIGTERM);  // its WebSockets get 1001; SIGKILL if it outstays stop_timeout
  child->kill_timer.arm_after(options_.stop_timeout_ms);
}

void Supervisor::enforce_drain_bound(int slot) {
  std::vector<Child*> draining;
  for (auto& c : children_)
    if (c->slot == slot && c->draining && !c->sent_term) draining.push_back(c.get());
  std::sort(draining.begin(), draining.end(),
            [](const Child* a, const Child* b) { return a->generation < b->generation; });
  for (size_t i = 0; i + options_.max_draining < draining.size(); ++i)
    close_old(draining[i], "max_draining_generations");  // the oldest first
}

Supervisor::Child* Supervisor::index_holder(int slot) const {
  for (const auto& c : children_)
    if (c->slot == slot && c->generation != generation_ &&
        generation_index(c->generation) == generation_index(generation_))
      return c.get();
  return nullptr;
}

void Supervisor::reload(std::shared_ptr<ListenerSet> listeners, ChildMain main) {
  if (terminating_) return;
  listeners_ = std::move(listeners);
  main_ = std::move(main);
  ++generation_;
  log_.info("reload", "generation={}", generation_);
  for (auto& slot : slots_) {
    slot->respawn.cancel();
    slot->backoff_ms = 0;
    if (!slot->current) slot->status = "starting";
    slot->spawn_waiting = false;
  }
  for (int i = 0; i < options_.processes; ++i) spawn(i);
}

void Supervisor::kill_all(int signo, bool old_only) {
  for (auto& c : children_) {
    if (old_only && c->generation == generation_) continue;
    if (signo == SIGTERM) {
      if (c->sent_term) continue;
      c->sent_term = true;
    }
    launcher_.signal(c->pid, signo);
  }
}

void Supervisor::signal_all(int signo) {
  for (auto& c : children_) launcher_.signal(c->pid, signo);
}

void Supervisor::terminate() {
  if (terminating_) {
    if (!killed_) {
      killed_ = true;
      log_.warn("terminate_forced", "processes={} action=SIGKILL", children_.size());
      kill_all(SIGKILL, false);
    }
    return;
  }
  terminating_ = true;
  for (auto& slot : slots_) slot->respawn.cancel();
  // Stop listening: the processes close their copies as they drain; ours would keep the sockets
  // open (new connections queued, then reset when we exit) instead of refused.
  auto close_set = [](const std::shared_ptr<ListenerSet>& set) {
    if (!set) return;
    for (auto& slot : set->slots)
      for (auto& fd : slot) fd.reset();
    set->claims.clear();  // another instance may take the addresses while these drain
  };
  close_set(listeners_);
  for (auto& c : children_) close_set(c->listeners);
  if (options_.quic) options_.quic->close();  // the processes keep their copies while they drain
  log_.info("terminate", "processes={}", children_.size());
  kill_all(SIGTERM, false);
  stop_deadline_.arm_after(options_.stop_timeout_ms);
  check_finished();
}

void Supervisor::check_finished() {
  if (finished_ || !children_.empty()) return;
  bool pending = false;
  for (auto& slot : slots_)
    pending = pending || slot->respawn.armed() || slot->current || slot->spawn_waiting;
  if (!terminating_ && pending) return;
  finished_ = true;
  stop_deadline_.cancel();
  if (on_finished) loop_.defer(on_finished);
}

std::vector<DrainingState> Supervisor::draining() const {
  std::vector<DrainingState> out;
  for (const auto& c : children_) {
    if (!c->draining && !(c->sent_term && c->generation < generation_)) continue;
    if (slots_[static_cast<size_t>(c->slot)]->current == c.get()) continue;
    out.push_back(
        {c->slot, c->pid, c->generation, c->drain_since, c->sent_term ? "closing" : "draining"});
  }
  std::sort(out.begin(), out.end(), [](const DrainingState& a, const DrainingState& b) {
    return a.generation != b.generation ? a.generation < b.generation : a.slot < b.slot;
  });
  return out;
}

std::vector<Supervisor::LiveProcess> Supervisor::live() const {
  std::vector<LiveProcess> out;
  out.reserve(children_.size());
  for (const auto& c : children_) out.push_back({c->slot, c->generation});
  return out;
}

bool Supervisor::serving() const {
  return std::all_of(slots_.begin(), slots_.end(), [this](const auto& s) {
    return s->current && s->current->ready && s->current->generation == generation_;
  });
}

int Supervisor::exit_status() const {
  if (terminating_) return 0;
  bool bad_config = std::any_of(slots_.begin(), slots_.end(),
                                [](const auto& s) { return s->status == "failed"; });
  return bad_config ? kExitBadConfig : 1;
}

std::vector<SlotState> Supervisor::state() const {
  std::vector<SlotState> out;
  for (const auto& s : slots_) {
    SlotState st;
    st.index = s->index;
    st.pid = s->current ? s->current->pid : 0;
    st.cpu = s->cpu;
    st.generation = s->current ? s->current->generation : generation_;
    st.started_at = s->started_at;
    st.restarts = s->restarts;
    st.last_exit = s->last_exit;
    st.backoff_ms = s->backoff_ms;
    st.status = s->status;
    out.push_back(std::move(st));
  }
  return out;
}

int run_fanout(core::Logger& log, Launcher& launcher, SupervisorOptions options,
               std::shared_ptr<ListenerSet> listeners, ChildMain main, FanoutHooks hooks) {
  core::EventLoop loop;
  // Every listen claim (listen_claim.h) answers other instances' probes on this loop, and stops
  // before the loop is gone (a ListenerSet may outlive it).
  struct Claims {
    core::EventLoop& loop;
    std::vector<std::weak_ptr<ListenClaim>> watched;
    void watch(const std::vector<std::shared_ptr<ListenClaim>>& claims) {
      for (const auto& c : claims) {
        if (!c) continue;
        c->watch(loop);
        watched.push_back(c);
      }
    }
    ~Claims() {
      for (auto& w : watched)
        if (auto c = w.lock()) c->unwatch();
    }
  } claims{loop, {}};
  claims.watch(listeners->claims);
  if (options.quic) claims.watch(options.quic->claims);
  Supervisor sup(loop, log, launcher, std::move(options));
  bool processes_done = false, services_done = !hooks.on_terminate, services_closing = false;
  auto close_services = [&] {
    if (services_closing || !hooks.on_terminate) return;
    services_closing = true;
    hooks.on_terminate([&] {
      services_done = true;
      if (processes_done) loop.stop();
    });
  };
  sup.on_finished = [&] {
    processes_done = true;
    close_services();
    if (services_done) loop.stop();
  };
  sup.on_link = hooks.on_link;
  sup.on_serving = hooks.on_serving;
  auto term = [&](const signalfd_siginfo& si) {
    log.info("signal", "signo={}", si.ssi_signo);
    sup.terminate();
    close_services();
  };
  (void)loop.on_signal(SIGTERM, term);
  (void)loop.on_signal(SIGINT, term);
  // SIGUSR1 (logrotate): reopen our own log files, and every server process its own (each
  // holds its own descriptors: they write the access log).
  (void)loop.on_signal(SIGUSR1, [&](const signalfd_siginfo&) {
    if (auto failed = log.reopen(); !failed.empty())
      log.error("logs_reopen_failed", "error=\"{}\"", failed);
    else
      log.info("logs_reopened", "pid={} processes={}", getpid(), sup.live_processes());
    sup.signal_all(SIGUSR1);
    if (hooks.on_reopen_logs) hooks.on_reopen_logs();
  });
  (void)loop.on_signal(SIGHUP, [&](const signalfd_siginfo&) {
    if (!hooks.on_reload) return;
    auto next_listeners = sup.listeners();
    ChildMain next_main;
    if (hooks.on_reload(next_listeners, next_main)) {
      claims.watch(next_listeners->claims);
      sup.reload(next_listeners, next_main);
    }
  });
  signal(SIGPIPE, SIG_IGN);
  if (auto r = sup.start(std::move(listeners), std::move(main)); !r) {
    log.error("fanout_failed", "error=\"{}\"", r.error().reason);
    return -1;
  }
  std::shared_ptr<void> services;
  if (hooks.on_started) services = hooks.on_started(loop, sup);
  loop.run();
  services.reset();
  // Stopped by SIGTERM/SIGINT: 0. Otherwise no server process was left and none was to be
  // respawned (each exited 0 or kExitBadConfig by itself): that is a failure of the service.
  int status = sup.exit_status();
  if (status != 0)
    log.error("supervisor_failed", "reason=\"{}\" exit={}",
              status == kExitBadConfig
                  ? "a server process found the configuration unusable (exit 78)"
                  : "every server process exited by itself",
              status);
  log.info("supervisor_stopped", "generation={} exit={}", sup.generation(), status);
  log.flush();
  return status;
}

}  // namespace corral::fanout
