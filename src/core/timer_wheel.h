// TimerWheel: O(1) arm and cancel for thousands of connection timers (header, body, idle, write),
// with millisecond resolution. A single-level wheel of kSlots 1-ms slots; a timer lives in slot
// (deadline % kSlots) on an intrusive list, so arming and cancelling are a few pointer writes. A
// timer further out than one rotation (4.096 s) stays in its slot and is skipped until its round
// comes: with 10,000 idle timers of 60 s that is 10,000 checks every 4 s, which costs nothing next
// to the syscalls the same connections make. A bitmap of non-empty slots lets the loop find the
// next deadline without scanning empty slots.
//
// Sans-IO: time is passed in, so tests drive it with a fake clock. Single-threaded.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

namespace corral::core {

class TimerWheel;

// The intrusive list links: a Timer, or a slot's head (16 bytes, not a whole Timer: the wheel's
// 4,096 heads are 64 KiB instead of 256 KiB in every process, and every worker is a process).
struct TimerLink {
  TimerLink* prev_ = nullptr;  // non-null while linked
  TimerLink* next_ = nullptr;
};

// A timer owned by its user (a connection member, say); destroying it cancels it.
class Timer : private TimerLink {
 public:
  using Callback = std::function<void()>;
  Timer() = default;
  Timer(TimerWheel& wheel, Callback cb) : wheel_(&wheel), cb_(std::move(cb)) {}
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() { cancel(); }

  void bind(TimerWheel& wheel, Callback cb) {
    cancel();
    wheel_ = &wheel;
    cb_ = std::move(cb);
  }
  // Fires once at `deadline_ms` (monotonic ms); re-arming an armed timer moves it.
  void arm_at(uint64_t deadline_ms);
  void arm_after(uint64_t delay_ms);
  void cancel();
  bool armed() const { return prev_ != nullptr; }
  uint64_t deadline() const { return deadline_; }

 private:
  friend class TimerWheel;
  TimerWheel* wheel_ = nullptr;
  Callback cb_;
  uint64_t deadline_ = 0;
};

class TimerWheel {
 public:
  static constexpr uint32_t kSlots = 4096;  // power of two; one rotation = 4.096 s

  explicit TimerWheel(uint64_t now_ms) : current_(now_ms) {
    for (auto& s : slots_) s.prev_ = s.next_ = &s;
  }
  TimerWheel(const TimerWheel&) = delete;
  TimerWheel& operator=(const TimerWheel&) = delete;
  ~TimerWheel();

  uint64_t now() const { return current_; }
  // Fires every timer whose deadline is <= now_ms, then sets the wheel's time to now_ms.
  // Callbacks may arm and cancel any timer, including the one firing. Returns how many fired.
  size_t advance(uint64_t now_ms);
  // Milliseconds until the next non-empty slot (a timer may fire then), or -1 if none is armed.
  int64_t next_timeout() const;
  size_t armed_count() const { return count_; }

 private:
  friend class Timer;
  void link(Timer& t);
  void unlink(Timer& t);
  uint32_t slot_of(uint64_t ms) const { return static_cast<uint32_t>(ms & (kSlots - 1)); }

  static Timer* timer_of(TimerLink* l) { return static_cast<Timer*>(l); }
  static TimerLink* link_of(Timer& t) { return &t; }

  std::array<TimerLink, kSlots> slots_;  // list heads (sentinels)
  std::array<uint64_t, kSlots / 64> nonempty_{};
  uint64_t current_;
  size_t count_ = 0;
};

}  // namespace corral::core
