#include "proxy/pool.h"

namespace corral::proxy {

UpstreamPool::UpstreamPool(core::EventLoop& loop)
    : loop_(loop), room_timer_(loop.timers(), [this] { retry_rooms(); }) {}

UpstreamPool::~UpstreamPool() = default;  // each idle connection leaves the loop as it goes

std::unique_ptr<UpstreamConnection> UpstreamPool::take(const std::string& path) {
  auto it = idle_.find(path);
  if (it == idle_.end() || it->second.empty()) return {};
  auto c = std::move(it->second.back());
  it->second.pop_back();
  return c;
}

void UpstreamPool::give(std::unique_ptr<UpstreamConnection> c) {
  if (auto w = rooms_.find(c->path()); w != rooms_.end()) {
    // A request waits for room at this upstream: this connection is its room.
    RoomWaiter* first = w->second.front();
    w->second.pop_front();
    if (w->second.empty()) rooms_.erase(w);
    c->scheduled = false;
    first->on_room(std::move(c), true);
    return;
  }
  auto& list = idle_[c->path()];
  if (list.size() >= kMaxIdlePerPath) {
    c->shut();
    loop_.destroy_later(std::move(c));  // an event for it may be queued in this batch
    return;
  }
  c->scheduled = false;
  list.push_back(std::move(c));
}

void UpstreamPool::send_soon(UpstreamConnection* c) {
  if (c->scheduled) return;
  c->scheduled = true;
  to_send_.push_back(c);
  if (to_send_.size() > 1) return;  // the flush is scheduled
  loop_.defer([this] {
    // Connections closed this round are still alive (destroyed after the deferred functions),
    // closed and with nothing to send.
    sending_.swap(to_send_);
    for (UpstreamConnection* c : sending_) c->scheduled = false;
    for (UpstreamConnection* c : sending_)
      if (c->open() && !c->idle()) c->send();
    sending_.clear();
  });
}

UpstreamConnection* UpstreamPool::joinable(std::string_view path) {
  for (UpstreamConnection* c : to_send_)  // all scheduled: their requests have not left yet
    if (c->pipelinable() && c->echoes() && c->reusable() && c->open() && !c->idle() &&
        c->depth() < kMaxPipeline && c->latency_x8() < 8 * kFastMs && c->path() == path)
      return c;
  return nullptr;
}

size_t UpstreamPool::idle() const {
  size_t n = 0;
  for (const auto& [path, list] : idle_) n += list.size();
  return n;
}

void UpstreamPool::drop(UpstreamConnection* c) {
  auto it = idle_.find(c->path());
  if (it == idle_.end()) return;
  auto& list = it->second;
  for (size_t k = 0; k < list.size(); ++k) {
    if (list[k].get() != c) continue;
    c->shut();
    loop_.destroy_later(std::move(list[k]));  // its on_io is running
    list.erase(list.begin() + static_cast<long>(k));
    break;
  }
  if (list.empty()) idle_.erase(it);
}

void UpstreamPool::wait_for_room(std::string_view path, RoomWaiter& w) {
  auto it = rooms_.find(path);
  if (it == rooms_.end()) it = rooms_.emplace(std::string(path), std::deque<RoomWaiter*>()).first;
  it->second.push_back(&w);
  if (!room_timer_.armed()) room_timer_.arm_after(kRoomRetryMs);
}

void UpstreamPool::stop_waiting(RoomWaiter& w) {
  for (auto it = rooms_.begin(); it != rooms_.end(); ++it) {
    auto& list = it->second;
    for (auto k = list.begin(); k != list.end(); ++k) {
      if (*k != &w) continue;
      list.erase(k);
      if (list.empty()) rooms_.erase(it);
      return;
    }
  }
}

size_t UpstreamPool::waiting() const {
  size_t n = 0;
  for (const auto& [path, list] : rooms_) n += list.size();
  return n;
}

// The waiters of each path, first come first served, while connects succeed. A waiter's answer
// may make others stop waiting (or start): each step looks the path up again.
void UpstreamPool::retry_rooms() {
  std::vector<std::string> paths;
  paths.reserve(rooms_.size());
  for (const auto& [path, list] : rooms_) paths.push_back(path);
  for (const auto& path : paths) {
    for (;;) {
      auto it = rooms_.find(path);
      if (it == rooms_.end()) break;
      auto opened = UpstreamConnection::open(loop_, path, this);
      if (!opened.conn && opened.busy) break;  // still full: the first keeps its place
      RoomWaiter* first = it->second.front();
      it->second.pop_front();
      if (it->second.empty()) rooms_.erase(it);
      if (opened.conn) {
        first->on_room(std::move(opened.conn), false);
      } else {
        first->on_unreachable(opened.why);
      }
    }
  }
  if (!rooms_.empty()) room_timer_.arm_after(kRoomRetryMs);
}

}  // namespace corral::proxy
