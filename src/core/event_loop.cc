#include "core/event_loop.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <stdexcept>
#include <utility>

namespace corral::core {

Error errno_error(const char* what) {
  int e = errno;
  return Error{e, std::string(what) + ": " + strerror(e)};
}

uint64_t monotonic_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

uint64_t monotonic_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

class EventLoop::SignalHandler final : public IoHandler {
 public:
  explicit SignalHandler(EventLoop& loop) : loop_(loop) { sigemptyset(&mask_); }
  Result<void> add(int signo, SignalCallback cb) {
    sigaddset(&mask_, signo);
    if (sigprocmask(SIG_BLOCK, &mask_, nullptr) < 0) return errno_error("sigprocmask");
    int fd = signalfd(fd_.get(), &mask_, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd < 0) return errno_error("signalfd");
    if (!fd_) {
      fd_.reset(fd);
      if (auto r = loop_.add(fd, EPOLLIN, this); !r) return r;
    }
    callbacks_[signo] = std::move(cb);
    return {};
  }
  void on_io(uint32_t) override {
    signalfd_siginfo info;
    while (::read(fd_.get(), &info, sizeof info) == sizeof info) {
      auto it = callbacks_.find(static_cast<int>(info.ssi_signo));
      if (it != callbacks_.end()) it->second(info);
    }
  }

 private:
  EventLoop& loop_;
  sigset_t mask_;
  UniqueFd fd_;
  std::map<int, SignalCallback> callbacks_;
};

EventLoop::EventLoop(Clock clock)
    : clock_(std::move(clock)),
      real_clock_(clock_.target<uint64_t (*)()>() &&
                  *clock_.target<uint64_t (*)()>() == &monotonic_ms),
      epfd_(epoll_create1(EPOLL_CLOEXEC)),
      now_ms_(clock_()),
      now_us_(monotonic_us()),
      wall_s_(time(nullptr)),
      timers_(now_ms_),
      events_(256) {
  if (!epfd_) throw std::runtime_error(errno_error("epoll_create1").reason);
}

EventLoop::~EventLoop() {
  run_deferred();
  signals_.reset();
}

Result<void> EventLoop::add(int fd, uint32_t events, IoHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) < 0) return errno_error("epoll_ctl(ADD)");
  return {};
}

Result<void> EventLoop::modify(int fd, uint32_t events, IoHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (epoll_ctl(epfd_.get(), EPOLL_CTL_MOD, fd, &ev) < 0) return errno_error("epoll_ctl(MOD)");
  return {};
}

void EventLoop::remove(int fd) {
  epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

Result<void> EventLoop::on_signal(int signo, SignalCallback cb) {
  if (!signals_) signals_ = std::make_unique<SignalHandler>(*this);
  return signals_->add(signo, std::move(cb));
}

void EventLoop::update_time() {
  // One clock read with the real clock: its milliseconds are monotonic_ms()'s.
  now_us_ = monotonic_us();
  now_ms_ = real_clock_ ? now_us_ / 1000 : clock_();
  timespec ts;
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  wall_s_ = ts.tv_sec;
}

void EventLoop::run_deferred() {
  // Deferred functions may defer more; loop until quiet.
  // The lists are swapped with spares, not moved out: their capacity stays, so a round that
  // defers something allocates nothing.
  while (!deferred_.empty() || !graveyard_.empty()) {
    running_.swap(deferred_);
    for (auto& fn : running_) fn();
    running_.clear();
    dying_.swap(graveyard_);
    for (auto& [p, del] : dying_) del(p);
    dying_.clear();
  }
}

void EventLoop::run_once(int max_wait_ms) {
  int64_t t = timers_.next_timeout();
  int timeout = max_wait_ms;
  if (t >= 0 && (timeout < 0 || t < timeout)) timeout = static_cast<int>(t);
  if (!deferred_.empty() || !graveyard_.empty()) timeout = 0;
  int n = epoll_wait(epfd_.get(), events_.data(), static_cast<int>(events_.size()), timeout);
  update_time();
  // Timers first: the wheel's clock must be current before any callback arms a timer relative to
  // it (else a timeout armed right after a long sleep would fire early by the sleep's length).
  // An object a timer closes is only destroyed after this round, so its queued event is safe.
  timers_.advance(now_ms_);
  for (int i = 0; i < n; ++i) {
    static_cast<IoHandler*>(events_[i].data.ptr)->on_io(events_[i].events);
  }
  if (n == static_cast<int>(events_.size()) && events_.size() < 4096) events_.resize(n * 2);
  run_deferred();
}

void EventLoop::run() {
  stopping_ = false;
  while (!stopping_) run_once();
  run_deferred();
}

}  // namespace corral::core
