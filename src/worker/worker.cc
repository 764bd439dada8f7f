#include "worker/worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/escape.h"

namespace corral::worker {

namespace {

// A control message is small (a set's files come by reference, code.manifest), but one with an
// inline `scripts` (an older manager) may be large.
constexpr size_t kMaxControlPacket = 16 * 1024 * 1024;
constexpr int kFinalFlushMs = 1000;  // the last messages (a `fatal`) before worker_main returns

// Reads `code.manifest` (when the message named one) into `code.scripts`: a set sent by
// reference. The error names the path.
core::Result<void> load_code_manifest(CodeUpdate& code) {
  if (code.manifest.empty()) return {};
  auto fail = [&](const char* what) {
    int e = errno;
    return core::Error{e, std::string(what) + " " + code.manifest + ": " + strerror(e)};
  };
  core::UniqueFd fd(::open(code.manifest.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return fail("open");
  std::string text;
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("read");
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  auto files = parse_code_manifest(text, code.version);
  if (!files)
    return core::Error{files.error().code, files.error().reason + " (" + code.manifest + ")"};
  code.scripts = std::move(*files);
  return {};
}

// The forced exit runs in a signal handler, which can reach no object: the status it exits with
// is the one static of this component.
volatile sig_atomic_t g_force_exit_status = 0;

extern "C" void on_force_exit(int) {
  static const char kLine[] = "worker force_exit: the stop took longer than force_exit_ms\n";
  [[maybe_unused]] ssize_t w = ::write(2, kLine, sizeof kLine - 1);
  _exit(g_force_exit_status);
}

// A real-time timer with a SIGALRM handler rather than a loop timer: a closer that blocks (or a
// request that never yields) cannot hold the process past force_exit_ms.
void arm_force_exit(uint32_t ms, int status) {
  g_force_exit_status = status;
  struct sigaction sa {};
  sa.sa_handler = on_force_exit;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, nullptr);
  sigset_t unblock;
  sigemptyset(&unblock);
  sigaddset(&unblock, SIGALRM);
  pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
  itimerval t{};
  t.it_value.tv_sec = ms / 1000;
  t.it_value.tv_usec = static_cast<suseconds_t>(ms % 1000) * 1000;
  if (ms == 0) t.it_value.tv_usec = 1;  // zero would disarm
  setitimer(ITIMER_REAL, &t, nullptr);
}

std::optional<int> env_fd(const char* name) {
  const char* v = getenv(name);
  if (!v || !*v) return std::nullopt;
  int fd = -1;
  auto [end, ec] = std::from_chars(v, v + strlen(v), fd);
  if (ec != std::errc() || *end != '\0' || fd < 0) return std::nullopt;
  return fd;
}

std::string env_string(const char* name) {
  const char* v = getenv(name);
  return v ? std::string(v) : std::string();
}

// The control socket: one JSON object per SOCK_SEQPACKET packet, read and written without
// blocking. What cannot be sent at once waits in a queue for EPOLLOUT.
class ControlChannel final : public core::IoHandler {
 public:
  struct Callbacks {
    std::function<void(ManagerMessage)> on_message;
    std::function<void()> on_lost;  // EOF, or an error that ends the link
  };

  ControlChannel(core::EventLoop& loop, core::Logger& log, core::UniqueFd fd, Callbacks cb)
      : loop_(loop), log_(log), fd_(std::move(fd)), cb_(std::move(cb)) {}
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;
  ~ControlChannel() {
    if (registered_) loop_.remove(fd_.get());
  }

  core::Result<void> start() {
    if (auto r = loop_.add(fd_.get(), EPOLLIN | EPOLLRDHUP, this); !r) return r;
    registered_ = true;
    return {};
  }

  bool lost() const { return lost_; }

  void send(std::string packet) {
    if (lost_) return;
    out_.push_back(std::move(packet));
    tail_is_idle_ = false;
    write_queued();
  }

  // An `idle` flip. The caller reports flips only, so an unsent `idle` at the tail of the queue
  // carries the opposite value: dropping it leaves the manager's view right with one packet less.
  void send_idle_flip(std::string packet) {
    if (lost_) return;
    if (tail_is_idle_ && !out_.empty()) {  // unsent: a packet leaves whole or not at all
      out_.pop_back();
      tail_is_idle_ = false;
      return;
    }
    out_.push_back(std::move(packet));
    tail_is_idle_ = true;
    write_queued();
  }

  // Before the process exits: what is queued (a `fatal`), for at most timeout_ms.
  void flush_blocking(int timeout_ms) {
    uint64_t deadline = core::monotonic_ms() + static_cast<uint64_t>(timeout_ms);
    while (!out_.empty() && !lost_) {
      write_queued();
      if (out_.empty() || lost_) break;
      uint64_t now = core::monotonic_ms();
      if (now >= deadline) break;
      pollfd p{fd_.get(), POLLOUT, 0};
      (void)::poll(&p, 1, static_cast<int>(deadline - now));
    }
  }

  void on_io(uint32_t events) override {
    if (lost_) return;
    if (events & EPOLLOUT) write_queued();
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) read_packets(events);
  }

 private:
  void read_packets(uint32_t events) {
    // A few packets per wakeup; level-triggered epoll brings us back for the rest.
    for (int i = 0; i < 16 && !lost_; ++i) {
      ssize_t n = ::recv(fd_.get(), nullptr, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        log_.warn("control_link_error", "error=\"{}\"", strerror(errno));
        return lose();
      }
      if (n == 0 && (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))) return lose();
      std::string packet(static_cast<size_t>(n > 0 ? n : 1), '\0');
      ssize_t got = ::recv(fd_.get(), packet.data(), packet.size(), MSG_DONTWAIT);
      if (got < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        log_.warn("control_link_error", "error=\"{}\"", strerror(errno));
        return lose();
      }
      if (got == 0) {
        if (n == 0) continue;  // an empty packet: nothing in it
        return lose();
      }
      if (static_cast<size_t>(n) > kMaxControlPacket) {
        log_.warn("control_message_dropped", "reason=\"too large\" bytes={}", n);
        continue;
      }
      packet.resize(static_cast<size_t>(got));
      auto m = parse_manager_message(packet);
      if (!m) {
        log_.warn("control_message_dropped", "reason=\"{}\"", m.error().reason);
        continue;
      }
      cb_.on_message(std::move(m.value()));
    }
  }

  void write_queued() {
    while (!out_.empty()) {
      const std::string& p = out_.front();
      ssize_t n = ::send(fd_.get(), p.data(), p.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) break;
        if (errno == EMSGSIZE) {
          log_.error("control_message_dropped", "reason=\"too large\" bytes={}", p.size());
          out_.pop_front();
          continue;
        }
        log_.warn("control_link_error", "error=\"{}\"", strerror(errno));
        out_.clear();
        lose();
        return;
      }
      out_.pop_front();  // SOCK_SEQPACKET: a packet is sent whole or not at all
    }
    if (out_.empty()) tail_is_idle_ = false;
    update_interest();
  }

  void update_interest() {
    if (!registered_) return;
    bool want_out = !out_.empty();
    if (want_out == watching_out_) return;
    watching_out_ = want_out;
    (void)loop_.modify(fd_.get(), EPOLLIN | EPOLLRDHUP | (want_out ? EPOLLOUT : 0u), this);
  }

  void lose() {
    if (lost_) return;
    lost_ = true;
    if (registered_) loop_.remove(fd_.get());
    registered_ = false;
    cb_.on_lost();
  }

  core::EventLoop& loop_;
  core::Logger& log_;
  core::UniqueFd fd_;
  Callbacks cb_;
  std::deque<std::string> out_;
  bool tail_is_idle_ = false;
  bool registered_ = false;
  bool watching_out_ = false;
  bool lost_ = false;
};

// flock(LOCK_EX) has no asynchronous form, so an old worker's lock is waited for in a helper
// thread that blocks in flock and then signals an eventfd: no polling, and the loop still sees a
// shutdown meanwhile. If the wait is abandoned the thread is detached; the state is shared so that
// whichever of the two finishes last frees it (and so closes the lock descriptor).
class LockWaiter final : public core::IoHandler {
 public:
  using Done = std::function<void(core::Result<core::UniqueFd>)>;

  LockWaiter(core::EventLoop& loop, Done done) : loop_(loop), done_(std::move(done)) {}
  LockWaiter(const LockWaiter&) = delete;
  LockWaiter& operator=(const LockWaiter&) = delete;
  ~LockWaiter() {
    if (state_ && state_->signal) loop_.remove(state_->signal.get());
    if (thread_.joinable()) thread_.detach();  // still blocked in flock; it frees the state
  }

  core::Result<void> start(core::UniqueFd lock_fd) {
    auto state = std::make_shared<State>();
    state->lock = std::move(lock_fd);
    state->signal.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!state->signal) return core::errno_error("eventfd");
    if (auto r = loop_.add(state->signal.get(), EPOLLIN, this); !r) return r;
    state_ = state;
    thread_ = std::thread([state] {
      // Signals stay blocked here (the mask is inherited): the loop's signalfd sees them.
      int rc;
      do rc = ::flock(state->lock.get(), LOCK_EX);
      while (rc < 0 && errno == EINTR);
      state->error.store(rc < 0 ? errno : 0);
      uint64_t one = 1;
      [[maybe_unused]] ssize_t w = ::write(state->signal.get(), &one, sizeof one);
    });
    return {};
  }

  void on_io(uint32_t) override {
    uint64_t v;
    if (::read(state_->signal.get(), &v, sizeof v) != sizeof v) return;
    thread_.join();
    loop_.remove(state_->signal.get());
    auto state = std::move(state_);
    if (int e = state->error.load()) {
      errno = e;
      return done_(core::errno_error("flock"));
    }
    done_(std::move(state->lock));
  }

 private:
  struct State {
    core::UniqueFd lock;
    core::UniqueFd signal;  // eventfd
    std::atomic<int> error{0};
  };
  core::EventLoop& loop_;
  Done done_;
  std::shared_ptr<State> state_;  // shared with the thread: see the class comment
  std::thread thread_;
};

}  // namespace

PublicError default_redact(const std::exception&) {
  return PublicError{"internal error", "", ""};
}

class Worker {
 public:
  enum class State { kWaitingStart, kLocking, kSetup, kRunning, kStopping, kDone };

  Worker(SetupFunction setup, WorkerOptions options, core::UniqueFd control, core::UniqueFd listen)
      : log_(2),
        options_(std::move(options)),
        setup_(std::move(setup)),
        listen_fd_(std::move(listen)),
        channel_(loop_, log_, std::move(control),
                 {.on_message = [this](ManagerMessage m) { on_message(std::move(m)); },
                  .on_lost = [this] { stop(kExitOk, "control_link_lost"); }}),
        context_(*this) {
    if (!options_.redact) options_.redact = default_redact;
    options_.server.close_timeout_ms =
        std::min(options_.server.close_timeout_ms, options_.force_exit_ms / 2);
    // CORRAL_ADDRESS is the address's wire form (core/escape.h); address() gives its bytes.
    if (!core::wire_decode(env_string("CORRAL_ADDRESS"), address_)) address_.clear();
    state_dir_ = env_string("CORRAL_STATE_DIR");
  }

  int run() {
    auto on_term = [this](const signalfd_siginfo& si) {
      stop(kExitOk, si.ssi_signo == SIGINT ? "sigint" : "sigterm");
    };
    if (auto r = loop_.on_signal(SIGTERM, on_term); !r) return setup_failed(r.error());
    if (auto r = loop_.on_signal(SIGINT, on_term); !r) return setup_failed(r.error());
    // The manager's death is a SIGTERM (through the signalfd above); a death before this call is
    // seen as EOF on the control socket, whose other end only the manager holds.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (auto r = channel_.start(); !r) return setup_failed(r.error());
    prepare();
    core::Timer log_flush(loop_.timers(), nullptr);
    log_flush.bind(loop_.timers(), [&] {
      log_.flush();
      log_flush.arm_after(200);
    });
    log_flush.arm_after(200);

    loop_.run();

    log_flush.cancel();
    server_.reset();
    loop_.run_once(0);  // frees what the server's connections left to the loop's graveyard
    channel_.flush_blocking(kFinalFlushMs);
    log_.info("worker_exit", "address=\"{}\" status={}", address_, exit_status_);
    log_.flush();
    return exit_status_;
  }

  // WorkerContext's side.
  std::string_view address() const { return address_; }
  std::string_view state_dir() const { return state_dir_; }
  const nlohmann::json& start_data() const { return start_.start; }
  const nlohmann::json& scripts() const { return code_.scripts; }
  std::string_view code_version() const { return code_.version; }
  std::string_view code_dir() const { return code_.dir; }
  core::EventLoop& loop() { return loop_; }
  core::Logger& log() { return log_; }
  void on_close(std::function<void()> closer) { closers_.push_back(std::move(closer)); }
  void on_reload(ReloadHook hook) { reload_hook_ = std::move(hook); }

  void busy_add(int delta) {
    busy_ += delta;
    if (busy_ < 0) {
      log_.error("busy_underflow", "address=\"{}\" busy={}", address_, busy_);
      busy_ = 0;
    }
    update_idle();
  }

  void fatal(const std::exception& e) {
    log_.error("worker_fatal", "address=\"{}\" error=\"{}\"", address_, e.what());
    if (state_ >= State::kStopping) return;  // already on the way out; one `fatal` is enough
    send_fatal(redact(e));
  }

 private:
  int setup_failed(const core::Error& e) {
    log_.error("worker_setup_failed", "error=\"{}\"", e.reason);
    return kExitFatal;
  }

  // The application's prepare hook, then `standby` for a spare (no address: nothing is in its
  // control socket yet, or a `start` waits there; either way it is read after this).
  void prepare() {
    if (options_.prepare) {
      try {
        options_.prepare(context_);
      } catch (const std::exception& e) {
        return fatal(e);
      } catch (...) {
        return fatal(std::runtime_error("prepare threw a non-exception"));
      }
    }
    if (state_ == State::kWaitingStart && address_.empty()) channel_.send(encode_standby());
  }

  PublicError redact(const std::exception& e) {
    PublicError p;
    try {
      p = options_.redact(e);
    } catch (...) {
      p = default_redact(e);
    }
    if (p.message.empty()) p.message = "internal error";
    // An allocation refused (under the kind's memory_max as RLIMIT_AS, say): the manager turns
    // this code into the address's `memory limit` failure (docs/process-model.md, Containment).
    if (p.code.empty() && dynamic_cast<const std::bad_alloc*>(&e)) p.code = "memory_limit";
    return p;
  }

  void send_fatal(const PublicError& p) {
    channel_.send(encode_fatal(p));
    stop(kExitFatal, "fatal");
  }

  void on_message(ManagerMessage m) {
    switch (m.type) {
      case ManagerMessageType::kShutdown:
        stop(kExitOk, "shutdown");
        return;
      case ManagerMessageType::kStart:
        if (state_ != State::kWaitingStart) {
          log_.warn("control_message_dropped", "reason=\"a second start\"");
          return;
        }
        start_ = std::move(m.start);
        if (!start_.address.empty()) address_ = start_.address;
        if (auto r = load_code_manifest(start_.code); !r) {
          log_.error("code_manifest_failed", "address=\"{}\" error=\"{}\"", address_,
                     r.error().reason);
          send_fatal({"the worker could not read its code set", "code_manifest_failed", ""});
          return;
        }
        code_ = start_.code;
        take_lock();
        return;
      case ManagerMessageType::kReload:
        if (state_ >= State::kStopping) {
          log_.debug("control_message_ignored", "type=\"reload\" reason=\"stopping\"");
          return;
        }
        reloads_.push_back(std::move(m.reload));
        schedule_reload();
        return;
      case ManagerMessageType::kPing:
        // Answered here, on the loop: a loop stuck in a handler answers nothing, and the manager
        // then stops the worker as unresponsive (issue 14), which is the point.
        channel_.send(encode_pong(m.ping_id));
        return;
      case ManagerMessageType::kUnknown:
        log_.debug("control_message_ignored", "type=\"{}\"", m.type_name);
        return;
    }
  }

  void take_lock() {
    state_ = State::kLocking;
    core::UniqueFd fd(::open(start_.lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd) return lock_failed(core::errno_error("open"));
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return locked(std::move(fd));
    if (errno != EWOULDBLOCK) return lock_failed(core::errno_error("flock"));
    // Another worker for this address still lives: wait for its exit, blocking, not polling.
    log_.info("lock_wait", "address=\"{}\" lock=\"{}\"", address_, start_.lock);
    lock_waiter_ = std::make_unique<LockWaiter>(loop_, [this](core::Result<core::UniqueFd> r) {
      loop_.destroy_later(std::move(lock_waiter_));
      if (!r) return lock_failed(r.error());
      locked(std::move(r.value()));
    });
    if (auto r = lock_waiter_->start(std::move(fd)); !r) {
      lock_waiter_.reset();
      lock_failed(r.error());
    }
  }

  void lock_failed(const core::Error& e) {
    log_.error("lock_failed", "address=\"{}\" lock=\"{}\" error=\"{}\"", address_, start_.lock,
               e.reason);
    send_fatal({"the worker could not take its address lock", "lock_failed", ""});
  }

  void locked(core::UniqueFd fd) {
    if (state_ != State::kLocking) return;
    lock_fd_ = std::move(fd);
    channel_.send(encode_started());
    state_ = State::kSetup;
    http::SiteBuilder builder;
    try {
      setup_(context_, builder);
    } catch (const std::exception& e) {
      return fatal(e);
    } catch (...) {
      return fatal(std::runtime_error("setup threw a non-exception"));
    }
    if (state_ != State::kSetup) return;  // setup called fatal(), or a stop arrived in between
    auto site = builder.build();
    if (!site) return fatal(std::runtime_error("routes do not build: " + site.error().reason));

    server_ = std::make_unique<http::Server>(loop_, log_, options_.server);
    server_->on_idle_change = [this](bool) { update_idle(); };
    // The manager listens with a backlog of 128: a burst past that would find the accept queue
    // full (the proxy then waits for room). As deep as the system allows.
    (void)::listen(listen_fd_.get(), SOMAXCONN);
    if (auto r = server_->adopt_listener(std::move(listen_fd_)); !r)
      return fatal(std::runtime_error("listen socket: " + r.error().reason));
    server_->publish(std::move(site.value()));
    state_ = State::kRunning;
    reported_idle_ = idle();
    reported_holds_ = holds();
    channel_.send(encode_ready(reported_idle_, static_cast<bool>(reload_hook_), reported_holds_));
    if (!reported_idle_) arm_holds_report();
    log_.info("worker_ready", "address=\"{}\" routes={} reload={}", address_,
              server_->site()->route_count(), reload_hook_ ? "true" : "false");
    schedule_reload();  // what arrived before `ready`
  }

  // One reload per loop round, from a zero timer: the I/O of the round (requests, a `shutdown`)
  // is dispatched between two hooks. Only once running: a reload that arrives before `ready`
  // waits in the queue.
  void schedule_reload() {
    if (state_ != State::kRunning || reloads_.empty() || reload_timer_.armed()) return;
    reload_timer_.bind(loop_.timers(), [this] { apply_next_reload(); });
    reload_timer_.arm_after(0);
  }

  void apply_next_reload() {
    if (state_ != State::kRunning || reloads_.empty()) return;
    ReloadMessage r = std::move(reloads_.front());
    reloads_.pop_front();
    if (!reload_hook_) {
      log_.warn("worker_reload_failed", "address=\"{}\" id={} error=\"no reload hook\"", address_,
                r.id);
      channel_.send(encode_reload_failed(r.id, r.code.version,
                                         {"This worker cannot reload in place.", "no_reload", ""}));
      return schedule_reload();
    }
    if (auto loaded = load_code_manifest(r.code); !loaded) {
      log_.error("worker_reload_failed", "address=\"{}\" id={} version={} error=\"{}\"", address_,
                 r.id, r.code.version, loaded.error().reason);
      channel_.send(encode_reload_failed(
          r.id, r.code.version,
          {"The new code set could not be read.", "code_manifest_failed", ""}));
      return schedule_reload();
    }
    busy_add(1);  // `idle:false` goes out before the hook runs
    nlohmann::json report;
    std::optional<PublicError> error;
    try {
      ReloadHook hook = reload_hook_;  // the hook may replace itself (on_reload) while it runs
      report = hook(r.code);
    } catch (const std::exception& e) {
      log_.error("worker_reload_failed", "address=\"{}\" id={} version={} error=\"{}\"", address_,
                 r.id, r.code.version, e.what());
      error = redact(e);
    } catch (...) {
      log_.error("worker_reload_failed", "address=\"{}\" id={} version={} error=\"{}\"", address_,
                 r.id, r.code.version, "non-exception");
      error = redact(std::runtime_error("the reload hook threw a non-exception"));
    }
    // A hook that called fatal(): the stop is under way and nothing more is answered.
    if (state_ != State::kRunning) return;
    if (error) {
      channel_.send(encode_reload_failed(r.id, r.code.version, *error));
    } else {
      code_ = std::move(r.code);
      log_.info("worker_reloaded", "address=\"{}\" id={} version={}", address_, r.id,
                code_.version);
      channel_.send(encode_reloaded(r.id, code_.version, report));
    }
    // After `reloaded`: an idle flip the manager sees follows the reply.
    busy_add(-1);
    schedule_reload();
  }

  bool idle() const { return (!server_ || server_->idle()) && busy_ == 0; }

  Holds holds() const {
    return {server_ ? server_->requests_in_flight() : 0,
            server_ ? server_->upgraded_connections() : 0, static_cast<uint64_t>(busy_)};
  }

  // While not idle, the counts go out at most once a second, when they changed since the last
  // report (a timer, not per request: a busy worker's requests cost no message each).
  static constexpr uint32_t kHoldsReportMs = 1000;

  void arm_holds_report() {
    if (holds_report_.armed()) return;
    holds_report_.bind(loop_.timers(), [this] {
      if (state_ != State::kRunning || reported_idle_) return;
      Holds h = holds();
      if (!(h == reported_holds_)) {
        reported_holds_ = h;
        // Not a flip: sent as is (send_idle_flip would cancel it against the next flip).
        channel_.send(encode_idle(false, h));
      }
      arm_holds_report();
    });
    holds_report_.arm_after(kHoldsReportMs);
  }

  // Busy is reported at once; idle only after kIdleReportDelayMs of quiet: a worker under load
  // is idle for microseconds between two requests, and reporting each flip would cost the
  // supervisor two messages per request. (The manager's idle stop counts in seconds.)
  static constexpr uint32_t kIdleReportDelayMs = 100;

  void update_idle() {
    if (state_ != State::kRunning) return;
    if (!idle()) {
      idle_report_.cancel();
      if (reported_idle_) {
        reported_idle_ = false;
        reported_holds_ = holds();
        channel_.send_idle_flip(encode_idle(false, reported_holds_));
        arm_holds_report();
      }
      return;
    }
    if (!reported_idle_ && !idle_report_.armed()) {
      idle_report_.bind(loop_.timers(), [this] {
        if (state_ != State::kRunning || !idle() || reported_idle_) return;
        reported_idle_ = true;
        holds_report_.cancel();
        reported_holds_ = holds();
        channel_.send_idle_flip(encode_idle(true, reported_holds_));
      });
      idle_report_.arm_after(kIdleReportDelayMs);
    }
  }

  // Every way out: stop accepting, let running requests finish (at most close_timeout_ms, capped
  // at half of force_exit_ms), run the closers, return `status` from worker_main.
  void stop(int status, std::string_view why) {
    if (state_ >= State::kStopping) return;
    State was = state_;
    state_ = State::kStopping;
    exit_status_ = status;
    log_.info("worker_stopping", "address=\"{}\" reason={}", address_, why);
    arm_force_exit(options_.force_exit_ms, status);
    if (lock_waiter_) loop_.destroy_later(std::move(lock_waiter_));
    reloads_.clear();  // a reload during a stop is ignored: the manager settles it by the exit
    reload_timer_.cancel();
    if (server_ && was == State::kRunning) {
      server_->close([this] { finish(); });
    } else {
      loop_.defer([this] { finish(); });
    }
  }

  void finish() {
    for (auto it = closers_.rbegin(); it != closers_.rend(); ++it) {
      try {
        (*it)();
      } catch (const std::exception& e) {
        log_.error("closer_failed", "address=\"{}\" error=\"{}\"", address_, e.what());
      } catch (...) {
        log_.error("closer_failed", "address=\"{}\" error=\"non-exception\"", address_);
      }
    }
    closers_.clear();
    state_ = State::kDone;
    loop_.stop();
  }

  core::EventLoop loop_;
  core::Logger log_;
  WorkerOptions options_;
  SetupFunction setup_;
  core::UniqueFd listen_fd_;
  core::UniqueFd lock_fd_;  // held until worker_main returns, after the closers
  ControlChannel channel_;
  WorkerContext context_;
  std::unique_ptr<LockWaiter> lock_waiter_;
  std::unique_ptr<http::Server> server_;
  std::vector<std::function<void()>> closers_;
  StartMessage start_;
  CodeUpdate code_;  // what runs: start's, then each successful reload's
  ReloadHook reload_hook_;
  std::deque<ReloadMessage> reloads_;  // waiting, in arrival order
  core::Timer reload_timer_;
  std::string address_;
  std::string state_dir_;
  State state_ = State::kWaitingStart;
  int busy_ = 0;
  bool reported_idle_ = true;
  core::Timer idle_report_;
  Holds reported_holds_;  // the counts of the last `ready` or `idle` sent
  core::Timer holds_report_;
  int exit_status_ = kExitOk;
};

std::string_view WorkerContext::address() const {
  return worker_.address();
}
std::string_view WorkerContext::state_dir() const {
  return worker_.state_dir();
}
const nlohmann::json& WorkerContext::start_data() const {
  return worker_.start_data();
}
const nlohmann::json& WorkerContext::scripts() const {
  return worker_.scripts();
}
std::string_view WorkerContext::code_version() const {
  return worker_.code_version();
}
std::string_view WorkerContext::code_dir() const {
  return worker_.code_dir();
}
void WorkerContext::on_reload(ReloadHook hook) {
  worker_.on_reload(std::move(hook));
}
core::EventLoop& WorkerContext::loop() {
  return worker_.loop();
}
core::Logger& WorkerContext::log() {
  return worker_.log();
}
void WorkerContext::on_close(std::function<void()> closer) {
  worker_.on_close(std::move(closer));
}
void WorkerContext::busy_add(int delta) {
  worker_.busy_add(delta);
}
void WorkerContext::fatal(const std::exception& e) {
  worker_.fatal(e);
}

int worker_main(SetupFunction setup, WorkerOptions options) {
  signal(SIGPIPE, SIG_IGN);
  core::Logger log(2);
  auto control = env_fd("CORRAL_CONTROL_FD");
  auto listen = env_fd("CORRAL_LISTEN_FD");
  if (!control || !listen) {
    log.error("worker_environment", "error=\"not started by a worker manager: {} is not set\"",
              control ? "CORRAL_LISTEN_FD" : "CORRAL_CONTROL_FD");
    return kExitBadEnvironment;
  }
  int type = 0, accepting = 0;
  socklen_t len = sizeof type;
  if (getsockopt(*control, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET) {
    log.error("worker_environment", "error=\"fd {} is not a SOCK_SEQPACKET socket\"", *control);
    return kExitBadEnvironment;
  }
  len = sizeof accepting;
  if (getsockopt(*listen, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) < 0 || !accepting) {
    log.error("worker_environment", "error=\"fd {} is not a listening socket\"", *listen);
    return kExitBadEnvironment;
  }
  // Nothing the application execs inherits them; the loop never blocks on them.
  for (int fd : {*control, *listen}) {
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  Worker worker(std::move(setup), std::move(options), core::UniqueFd(*control),
                core::UniqueFd(*listen));
  return worker.run();
}

}  // namespace corral::worker
