// EventLoop: one per process (STYLE rule 6). epoll in level-triggered mode (one read per readable
// wakeup, no extra read to see EAGAIN), a TimerWheel, signals through signalfd, and deferred work:
// objects closed inside their own callback are destroyed after the current dispatch round, so
// an event for them later in the same epoll batch still finds live memory (and a closed flag).
//
// now() is the monotonic time in milliseconds, read once per iteration; wall_seconds() likewise;
// now_us() too, in microseconds, from the real monotonic clock whatever clock was given (for
// measurements, /metrics' latency histograms: never for timers).
// The monotonic clock is a constructor argument (STYLE rule 5): a test that must not depend on
// how fast the machine runs (a round's latency, a timer that would fire under load) passes a
// clock it controls; everything else uses monotonic_ms.
// Never blocks except in epoll_wait. Not thread-safe; wake() is the one call other threads may
// make.
#pragma once

#include <sys/epoll.h>
#include <sys/signalfd.h>

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <vector>

#include "core/result.h"
#include "core/timer_wheel.h"
#include "core/unique_fd.h"

namespace corral::core {

class IoHandler {
 public:
  virtual void on_io(uint32_t events) = 0;

 protected:
  ~IoHandler() = default;
};

uint64_t monotonic_ms();
uint64_t monotonic_us();

class EventLoop {
 public:
  using SignalCallback = std::function<void(const signalfd_siginfo&)>;
  using Clock = std::function<uint64_t()>;  // monotonic milliseconds

  explicit EventLoop(Clock clock = monotonic_ms);
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;
  ~EventLoop();

  Result<void> add(int fd, uint32_t events, IoHandler* handler);
  Result<void> modify(int fd, uint32_t events, IoHandler* handler);
  void remove(int fd);

  uint64_t now() const { return now_ms_; }
  uint64_t now_us() const { return now_us_; }
  time_t wall_seconds() const { return wall_s_; }
  TimerWheel& timers() { return timers_; }

  // Blocks the signals and delivers them through a signalfd; one callback per signal number.
  Result<void> on_signal(int signo, SignalCallback cb);

  // Runs `fn` after the current dispatch round (before the next epoll_wait).
  void defer(std::function<void()> fn) { deferred_.push_back(std::move(fn)); }
  // Destroys `obj` after the current dispatch round.
  template <typename T>
  void destroy_later(std::unique_ptr<T> obj) {
    graveyard_.push_back({obj.release(), [](void* p) { delete static_cast<T*>(p); }});
  }

  // Runs until stop(). Returns when stopped.
  void run();
  // One iteration: wait at most `max_wait_ms` (-1: until an event or timer), dispatch, run
  // deferred.
  void run_once(int max_wait_ms = -1);
  void stop() { stopping_ = true; }
  bool stopping() const { return stopping_; }

 private:
  class SignalHandler;
  void update_time();
  void run_deferred();

  Clock clock_;
  bool real_clock_;  // clock_ is monotonic_ms
  UniqueFd epfd_;
  uint64_t now_ms_;
  uint64_t now_us_;
  time_t wall_s_;
  TimerWheel timers_;
  bool stopping_ = false;
  std::vector<std::function<void()>> deferred_;
  std::vector<std::pair<void*, void (*)(void*)>> graveyard_;
  std::vector<std::function<void()>> running_;  // run_deferred's spares
  std::vector<std::pair<void*, void (*)(void*)>> dying_;
  std::unique_ptr<SignalHandler> signals_;
  std::vector<epoll_event> events_;
};

}  // namespace corral::core
