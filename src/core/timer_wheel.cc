#include "core/timer_wheel.h"

#include <bit>

namespace corral::core {

void Timer::arm_at(uint64_t deadline_ms) {
  if (armed()) wheel_->unlink(*this);
  deadline_ = deadline_ms;
  wheel_->link(*this);
}

void Timer::arm_after(uint64_t delay_ms) {
  arm_at(wheel_->now() + delay_ms);
}

void Timer::cancel() {
  if (armed()) wheel_->unlink(*this);
}

TimerWheel::~TimerWheel() {
  // Unlink everything still armed so the timers' own destructors do not touch freed slots.
  for (auto& head : slots_) {
    while (head.next_ != &head) {
      TimerLink* t = head.next_;
      head.next_ = t->next_;
      t->prev_ = t->next_ = nullptr;
    }
    head.prev_ = head.next_ = nullptr;
  }
}

void TimerWheel::link(Timer& t) {
  // A deadline already due goes into the next slot: it fires on the next advance().
  uint64_t at = t.deadline_ > current_ ? t.deadline_ : current_ + 1;
  uint32_t s = slot_of(at);
  TimerLink& head = slots_[s];
  TimerLink* l = link_of(t);
  l->prev_ = head.prev_;
  l->next_ = &head;
  head.prev_->next_ = l;
  head.prev_ = l;
  nonempty_[s / 64] |= uint64_t{1} << (s % 64);
  ++count_;
}

void TimerWheel::unlink(Timer& timer) {
  TimerLink& t = *link_of(timer);
  t.prev_->next_ = t.next_;
  t.next_->prev_ = t.prev_;
  // The slot's list may now be empty: find its head through the neighbours is not possible
  // cheaply, so the bitmap is cleared lazily in advance()/next_timeout().
  t.prev_ = t.next_ = nullptr;
  --count_;
}

size_t TimerWheel::advance(uint64_t now_ms) {
  if (now_ms <= current_) return 0;
  size_t fired = 0;
  uint64_t ticks = now_ms - current_;
  if (ticks > kSlots) ticks = kSlots;
  uint64_t tick = current_ + 1;
  current_ = now_ms;  // callbacks that re-arm see the new time
  for (uint64_t i = 0; i < ticks; ++i, ++tick) {
    uint32_t s = slot_of(tick);
    uint64_t bit = uint64_t{1} << (s % 64);
    if (!(nonempty_[s / 64] & bit)) continue;
    TimerLink& head = slots_[s];
    if (head.next_ == &head) {
      nonempty_[s / 64] &= ~bit;
      continue;
    }
    // Move the slot's list aside, then fire or re-link each timer; callbacks may touch any timer.
    TimerLink pending;
    pending.prev_ = head.prev_;
    pending.next_ = head.next_;
    pending.prev_->next_ = &pending;
    pending.next_->prev_ = &pending;
    head.prev_ = head.next_ = &head;
    nonempty_[s / 64] &= ~bit;
    while (pending.next_ != &pending) {
      TimerLink* l = pending.next_;
      pending.next_ = l->next_;
      l->next_->prev_ = &pending;
      l->prev_ = l->next_ = nullptr;
      --count_;
      Timer* t = timer_of(l);
      if (t->deadline_ <= now_ms) {
        ++fired;
        if (t->cb_) t->cb_();
      } else {
        link(*t);
      }
    }
    pending.prev_ = pending.next_ = nullptr;
  }
  return fired;
}

int64_t TimerWheel::next_timeout() const {
  if (count_ == 0) return -1;
  // Scan the bitmap from the slot after current_, wrapping once.
  uint32_t start = slot_of(current_ + 1);
  for (uint32_t d = 0; d < kSlots;) {
    uint32_t s = (start + d) & (kSlots - 1);
    uint64_t word = nonempty_[s / 64] >> (s % 64);
    if (word) {
      uint32_t skip = static_cast<uint32_t>(std::countr_zero(word));
      d += skip;
      if (d >= kSlots) break;
      return static_cast<int64_t>(d) + 1;
    }
    d += 64 - (s % 64);
  }
  return -1;
}

}  // namespace corral::core
