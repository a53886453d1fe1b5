// ThreadPool: a fixed set of worker threads with two queues. Urgent work
// (a reader is waiting) always runs first; background work (prefetch) runs
// only on idle workers and never on more than `max_background` at once, so
// it cannot hold back a waiting reader for long.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace strata {

// Runs fn(0) .. fn(n-1) on up to `threads` threads and returns the first
// error (after which no new index starts), or OK.
Status ParallelFor(size_t n, size_t threads, const std::function<Status(size_t)>& fn);


class ThreadPool {
 public:
  enum class Priority { kUrgent, kBackground };

  // `threads` >= 1; `max_background` of them at most run background work.
  ThreadPool(size_t threads, size_t max_background);
  // Finishes queued urgent work, drops queued background work, joins.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Thread-safe. Jobs must not throw.
  void Submit(std::function<void()> job, Priority priority = Priority::kUrgent);
  size_t queued_background() const;

 private:
  void Run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> urgent_, background_;
  size_t max_background_;
  size_t running_background_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata
