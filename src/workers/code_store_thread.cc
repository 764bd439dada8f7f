#include "workers/code_store_thread.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace corral::workers {

core::Result<std::unique_ptr<CodeStoreThread>> CodeStoreThread::create(core::EventLoop& loop) {
  std::unique_ptr<CodeStoreThread> t(new CodeStoreThread(loop));
  t->wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!t->wake_) return core::errno_error("eventfd");
  if (auto r = loop.add(t->wake_.get(), EPOLLIN, t.get()); !r) return r.error();
  CodeStoreThread* self = t.get();
  t->thread_ = std::jthread([self](std::stop_token stop) { self->run(std::move(stop)); });
  return t;
}

CodeStoreThread::~CodeStoreThread() {
  loop_.remove(wake_.get());
  // The running task sees its stop token; the wait below sees it too.
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void CodeStoreThread::post(Work work) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(work));
  }
  ready_.notify_one();
}

void CodeStoreThread::run(std::stop_token stop) {
  for (;;) {
    Work work;
    {
      std::unique_lock lock(mutex_);
      if (!ready_.wait(lock, stop, [this] { return !queue_.empty(); })) return;  // stopping
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    std::function<void()> result = work(stop);
    if (stop.stop_requested()) return;
    {
      std::lock_guard lock(mutex_);
      results_.push_back(std::move(result));
    }
    uint64_t one = 1;
    while (::write(wake_.get(), &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
}

void CodeStoreThread::on_io(uint32_t) {
  uint64_t count;
  (void)::read(wake_.get(), &count, sizeof count);
  std::vector<std::function<void()>> results;
  {
    std::lock_guard lock(mutex_);
    results.swap(results_);
  }
  // A result may destroy this object (its owner closing): nothing of it is used after that.
  for (auto& result : results)
    if (result) result();
}

}  // namespace corral::workers
