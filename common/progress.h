// Progress: a one-line "label  12.0 MiB / 40.0 MiB  8.1 MiB/s  ETA 3s"
// status on stderr, redrawn at most five times a second, and only when
// stderr is a terminal. Add() is thread-safe and cheap.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace strata {

class Progress {
 public:
  // `total` 0: unknown (no ETA).
  Progress(std::string label, uint64_t total);
  ~Progress();  // clears the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t bytes);
  void SetTotal(uint64_t total) { total_ = total; }
  uint64_t done() const { return done_.load(); }

 private:
  void Draw(bool force);

  const std::string label_;
  std::atomic<uint64_t> total_;
  std::atomic<uint64_t> done_{0};
  const bool enabled_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace strata
