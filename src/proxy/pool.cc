#include "proxy/pool.h"

namespace corral::proxy {

UpstreamPool::UpstreamPool(core::EventLoop& loop) : loop_(loop) {}

UpstreamPool::~UpstreamPool() = default;  // each idle connection leaves the loop as it goes

std::unique_ptr<UpstreamConnection> UpstreamPool::take(const std::string& path) {
  auto it = idle_.find(path);
  if (it == idle_.end() || it->second.empty()) return {};
  auto c = std::move(it->second.back());
  it->second.pop_back();
  return c;
}

void UpstreamPool::give(std::unique_ptr<UpstreamConnection> c) {
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
    if (c->pipelinable() && c->reusable() && c->open() && !c->idle() && c->depth() < kMaxPipeline &&
        c->latency_x8() < 8 * kFastMs && c->path() == path)
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

}  // namespace corral::proxy
