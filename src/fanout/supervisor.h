// Supervisor: the fan-out of corral (the `wired_srvworkers_run` design, with its gaps closed).
// It creates every listening socket before forking (one SO_REUSEPORT socket per slot and address,
// kept open here for the supervisor's whole life; each address claimed first, so no other corral
// joins the group: listen_claim.h), forks one server process per slot, optionally
// pinned, and supervises them on its own event loop through a pidfd per child:
//
//  * slot i always has socket i and CPU i; a process killed by a signal or exiting non-zero is
//    re-forked into the same slot. Exit 0 is not respawned, nor kExitBadConfig (78). A process
//    that dies within `stable_ms` of its start backs off exponentially (100 ms -> 30 s); one that
//    ran longer is respawned at once and its backoff is reset.
//  * A respawn is always armed on the slot's timer (due at once for a plain crash), so a slot
//    that will have a process again is never taken for a finished one: a crash never stops the
//    supervisor. It finishes by itself only when no slot has a process or a respawn to come.
//  * terminate(): SIGTERM once to every live process, no more respawns; a second terminate() or
//    the stop deadline sends SIGKILL. on_finished runs when every process has been reaped.
//  * reload(): a new generation with a new spec (and, if the addresses changed, new sockets).
//    Old process i is told to drain (kDrainSignal) only once new process i reports ready, so a
//    slot is never without a process accepting, and a new generation that fails to start leaves
//    the old one serving. Unchanged sockets are shared by the generations: nothing is refused. A
//    draining process stops accepting, finishes its requests and keeps its upgraded connections
//    (WebSockets, relays) until they close or its drain timeout passes, then exits 0.
//  * draining generations: at most `max_draining` per slot; past it the oldest is sent SIGTERM
//    (its WebSockets get 1001) and SIGKILL after stop_timeout_ms. Generations of a slot that run
//    at once never share a generation index (generation % kGenerations: the QUIC CIDs and
//    forwarding pairs, quic_sockets.h): a new process whose index is still held by an old one
//    waits for that one's exit (it is sent SIGTERM), the slot's serving process meanwhile
//    serving.
//
// A dead process's socket stays open here, so connections the kernel queued for it wait for its
// replacement instead of being reset. A spawn that fails at any step (ready pipe, link, listening
// socket, fork, pidfd) is retried with the backoff of a crash loop, so the slot comes back.
//
// Every OS call on processes goes through the Launcher it is given (launcher.h: the real
// ForkLauncher, or fake_launcher.h in tests), and every delay (respawn, backoff, deadlines)
// runs on its event loop's clock.
//
// Single-threaded; one Supervisor per process with the ForkLauncher (fork and signal dispositions
// are process-wide). The loop and the launcher are borrowed and must outlive it.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/message_link.h"
#include "core/socket.h"
#include "core/unique_fd.h"
#include "fanout/launcher.h"
#include "fanout/listen_claim.h"
#include "fanout/quic_sockets.h"

namespace corral::fanout {

// Sent to a process of an older generation once its successor is ready: drain (stop accepting,
// keep upgraded connections until they close or the drain timeout). SIGTERM means close now.
// SIGUSR2 rather than SIGHUP: a hangup of the terminal's process group must not drain every
// serving process at once.
constexpr int kDrainSignal = SIGUSR2;

// The listening sockets of one configuration: per slot, one socket per address.
struct ListenerSet {
  std::vector<core::SocketAddress> addresses;        // as bound (port 0 resolved)
  std::vector<std::vector<core::UniqueFd>> slots;    // slots[i][a]
  std::vector<std::shared_ptr<ListenClaim>> claims;  // claims[a]: "tcp-<address>"
};
// Binds `addresses` once per slot with SO_REUSEPORT; a port 0 is resolved by the first socket and
// reused by the others so every slot shares it. Each address is claimed first (a port 0 once it is
// resolved; listen_claim.h), or its claim is shared with `previous` (the set a reload replaces)
// if that has it: an address held by another corral fails with kErrorClaimed.
// `passed[a]`, when valid, is a listening socket made by someone else (systemd's socket
// activation) for address a: it is taken instead of binding, unclaimed, and every slot shares it
// (one accept queue that all processes accept from, where their own sockets would be a reuseport
// group).
core::Result<ListenerSet> make_listeners(const std::vector<core::SocketAddress>& addresses,
                                         int slots, const ListenerSet* previous = nullptr,
                                         std::vector<core::UniqueFd>* passed = nullptr);

struct SupervisorOptions {
  int processes = 1;
  bool pin = false;
  std::vector<int> cpus;       // allowed CPUs (slot i -> cpus[i] when pinning)
  uint32_t stable_ms = 1'000;  // a process that ran this long resets its backoff
  uint32_t backoff_min_ms = 100;
  uint32_t backoff_max_ms = 30'000;
  uint32_t stop_timeout_ms = 20'000;  // after SIGTERM, SIGKILL what is left
  // Older generations draining at once per slot (0: an old process is closed, not drained); at
  // most kGenerations - 1.
  uint32_t max_draining = kGenerations - 1;
  // QUIC sockets (make_quic_sockets with `processes` slots), or null. Unlike the ListenerSet they
  // never change with a reload: every generation and every respawn gets the same ones.
  std::shared_ptr<QuicSockets> quic;
};

struct SlotState {
  int index = 0;
  pid_t pid = 0;  // 0: no process (waiting for a respawn, or exited)
  int cpu = -1;
  uint64_t generation = 0;
  time_t started_at = 0;
  uint32_t restarts = 0;
  std::string last_exit;  // "exit 3", "signal 9", "" if none yet
  uint32_t backoff_ms = 0;
  std::string status;  // starting | running | backoff | exited | failed (bad config) | stopped
};

// A process of an older generation still running (draining, or closing after the bound).
struct DrainingState {
  int slot = 0;
  pid_t pid = 0;
  uint64_t generation = 0;
  time_t since = 0;    // when it was told to drain
  std::string status;  // draining | closing
};

class Supervisor {
 public:
  Supervisor(core::EventLoop& loop, core::Logger& log, Launcher& launcher,
             SupervisorOptions options);
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  ~Supervisor();

  // Forks every slot. Fails (and forks nothing more, nor retries) if the first spawn fails.
  core::Result<void> start(std::shared_ptr<ListenerSet> listeners, ChildMain main);
  // A new generation with `main` and `listeners` (pass the current set to keep the sockets).
  void reload(std::shared_ptr<ListenerSet> listeners, ChildMain main);
  void terminate();
  // Sends `signo` to every live process, of every generation (SIGUSR1: reopen the logs).
  void signal_all(int signo);

  std::vector<SlotState> state() const;
  std::vector<DrainingState> draining() const;  // oldest first
  // Every process not reaped yet, of every generation (starting, serving, draining, closing):
  // its slot and generation. GET /metrics sums the gauges of these only.
  struct LiveProcess {
    int slot = 0;
    uint64_t generation = 0;
  };
  std::vector<LiveProcess> live() const;
  const std::shared_ptr<ListenerSet>& listeners() const { return listeners_; }
  uint64_t generation() const { return generation_; }
  bool terminating() const { return terminating_; }
  size_t live_processes() const { return children_.size(); }
  // Once finished: 0 after terminate(); else no process was left and none was to be respawned
  // (each exited 0 or kExitBadConfig by itself), a failure of the service: kExitBadConfig if a
  // slot found the configuration unusable, 1 otherwise. run_fanout returns it.
  int exit_status() const;
  std::function<void()> on_finished;  // every process reaped after terminate(), or none left to
                                      // run (each exited 0 or 78 by itself)
  // A process's link to the supervisor is up (set its on_message); it lives as long as the process.
  std::function<void(int slot, core::MessageLink& link)> on_link;
  // Every slot has a ready process of the current generation: once per generation (the first,
  // then each reload's once its processes all accept). Not called for a generation that a newer
  // one replaces before it got there, nor while a slot is closed or in backoff.
  std::function<void(uint64_t generation)> on_serving;
  bool serving() const;  // every slot's process is of the current generation and ready

 private:
  struct Child;
  struct Slot;
  void spawn(int slot);
  void on_child_exit(Child* child, int code, int signo);
  void on_child_ready(Child* child);
  void check_finished();
  void kill_all(int signo, bool old_only);
  void drain(Child* child);
  void close_old(Child* child, const char* reason);
  void enforce_drain_bound(int slot);
  Child* index_holder(int slot) const;  // an older live process with generation_'s index

  ChildContext child_context(int slot, int ready_fd, int link_fd) const;

  core::EventLoop& loop_;
  core::Logger& log_;
  Launcher& launcher_;
  SupervisorOptions options_;
  uint64_t generation_ = 0;
  std::shared_ptr<ListenerSet> listeners_;  // shared: an old generation keeps its own set open
                                            // until its last process is gone
  ChildMain main_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Child>> children_;
  bool terminating_ = false;
  bool killed_ = false;
  bool finished_ = false;
  uint64_t serving_generation_ = 0;  // the last generation on_serving was called for
  core::Timer stop_deadline_;
};

// The seed's library call: fork `processes` server processes running `main`, supervise them, and
// forward SIGTERM/SIGINT, starting them through `launcher`. Returns -1 if the first spawn fails;
// once every process has been reaped, 0 after SIGTERM/SIGINT, else (no process left and none to
// respawn: each exited 0 or kExitBadConfig by itself) kExitBadConfig if a slot failed so, 1
// otherwise. A crash never ends it: a crashed process is respawned. Call once, from a
// single-threaded caller. `on_reload` (SIGHUP) may return a new ChildMain and listener set to start
// a new generation.
struct FanoutHooks {
  std::function<bool(std::shared_ptr<ListenerSet>&, ChildMain&)> on_reload;
  // After the first generation is forked: may start more services on the supervisor's loop (the
  // control API); what it returns is destroyed before the loop.
  std::function<std::shared_ptr<void>(core::EventLoop&, Supervisor&)> on_started;
  // Each server process's link (see Supervisor::on_link).
  std::function<void(int slot, core::MessageLink& link)> on_link;
  // Each generation once all its processes accept (see Supervisor::on_serving).
  std::function<void(uint64_t generation)> on_serving;
  // Shutdown of what on_started started (the worker manager): call `done` when it is over; the
  // supervisor returns once its processes are reaped and `done` was called.
  std::function<void(std::function<void()> done)> on_terminate;
  // SIGUSR1, after the supervisor's own logs and its processes': services' own log files.
  std::function<void()> on_reopen_logs;
};
int run_fanout(core::Logger& log, Launcher& launcher, SupervisorOptions options,
               std::shared_ptr<ListenerSet> listeners, ChildMain main, FanoutHooks hooks = {});

}  // namespace corral::fanout
