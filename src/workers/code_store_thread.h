// CodeStoreThread: the code store's work (workers/code_store.h: snapshots, rollbacks, collection),
// run off the supervisor's loop. A snapshot reads every file of a code directory, which may take
// seconds (a 4 GiB file, thousands of small files); on the loop it would stall every proxied
// request and the control socket meanwhile. Here it runs on one thread of its own, one task at a
// time in the order they were posted (so a collection never runs while a snapshot writes objects),
// and each task's result comes back to the loop as a function the loop runs: the thread writes an
// eventfd the loop watches.
//
// Lifetime: owned by Rollouts, on the loop's thread. The destructor asks the running task to stop
// (its std::stop_token: a snapshot ends within one chunk's read) and joins the thread; the tasks
// not run and the results not delivered are dropped. post() and the results run on the loop's
// thread only; the work runs on the store's thread only.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

#include "core/event_loop.h"
#include "core/result.h"
#include "core/unique_fd.h"

namespace corral::workers {

class CodeStoreThread final : public core::IoHandler {
 public:
  // The work of a task: runs on the store's thread, returns what runs on the loop afterwards.
  using Work = std::function<std::function<void()>(std::stop_token)>;

  static core::Result<std::unique_ptr<CodeStoreThread>> create(core::EventLoop& loop);
  ~CodeStoreThread();
  CodeStoreThread(const CodeStoreThread&) = delete;
  CodeStoreThread& operator=(const CodeStoreThread&) = delete;

  // Queues `work` behind the tasks posted before it.
  void post(Work work);

  void on_io(uint32_t events) override;

 private:
  explicit CodeStoreThread(core::EventLoop& loop) : loop_(loop) {}
  void run(std::stop_token stop);

  core::EventLoop& loop_;
  core::UniqueFd wake_;  // eventfd: written by the thread when a result is ready

  std::mutex mutex_;  // guards the two lists
  std::condition_variable_any ready_;
  std::deque<Work> queue_;
  std::vector<std::function<void()>> results_;
  std::jthread thread_;  // last: it stops and joins before the lists are destroyed
};

}  // namespace corral::workers
