// ThreadPool with an urgent and a capped background queue.
#include "common/thread_pool.h"

namespace strata {

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
