#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace strata {
namespace {

TEST(ThreadPoolTest, RunsEveryJob) {
  std::atomic<int> n{0};
  {
    ThreadPool pool(4, 2);
    for (int i = 0; i < 1000; ++i) pool.Submit([&] { ++n; });
  }
  EXPECT_EQ(n.load(), 1000);
}

TEST(ThreadPoolTest, BackgroundWorkIsCappedAndUrgentWorkPassesIt) {
  ThreadPool pool(4, 1);
  std::atomic<int> running_background{0}, max_background{0};
  std::atomic<bool> release{false};
  for (int i = 0; i < 8; ++i) {
    pool.Submit(
        [&] {
          int now = ++running_background;
          int prev = max_background.load();
          while (now > prev && !max_background.compare_exchange_weak(prev, now)) {
          }
          while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          --running_background;
        },
        ThreadPool::Priority::kBackground);
  }
  std::atomic<bool> urgent_ran{false};
  pool.Submit([&] { urgent_ran = true; });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!urgent_ran && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(urgent_ran.load());  // not stuck behind the background jobs
  release = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(max_background.load(), 1);
}

}  // namespace
}  // namespace strata
