// ThreadPool with an urgent and a capped background queue.
#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace strata {

Status ParallelFor(size_t n, size_t threads, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first;
  auto worker = [&] {
    while (!failed.load()) {
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard lock(mu);
        if (!failed.exchange(true)) first = std::move(s);
      }
    }
  };
  threads = std::max<size_t>(1, std::min(threads, n));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return first;
}

ThreadPool::ThreadPool(size_t threads, size_t max_background)
    : max_background_(max_background) {
  if (threads == 0) threads = 1;
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    background_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Submit(std::function<void()> job, Priority priority) {
  {
    std::lock_guard lock(mu_);
    (priority == Priority::kUrgent ? urgent_ : background_).push_back(std::move(job));
  }
  cv_.notify_one();
}

size_t ThreadPool::queued_background() const {
  std::lock_guard lock(mu_);
  return background_.size();
}

void ThreadPool::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] {
      return !urgent_.empty() || (!background_.empty() && running_background_ < max_background_) ||
             (stopping_ && urgent_.empty());
    });
    if (stopping_ && urgent_.empty()) return;
    bool background = urgent_.empty();
    std::function<void()> job;
    if (background) {
      job = std::move(background_.front());
      background_.pop_front();
      ++running_background_;
    } else {
      job = std::move(urgent_.front());
      urgent_.pop_front();
    }
    lock.unlock();
    job();
    lock.lock();
    if (background) {
      --running_background_;
      cv_.notify_one();  // another background job may start now
    }
  }
}

}  // namespace strata
