// Helpers for benchmark programs: timing and table printing.
#pragma once

#include "tests/testing/test_util.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Median of `samples` (copied).
double Median(std::vector<double> samples);
double Percentile(std::vector<double> samples, double p);

struct Figures {
  double p50_ms = 0, p99_ms = 0, per_second = 0;
};
// `total` runs of `one(i)`, `parallel` at a time: latency percentiles and
// the rate over the whole.
Figures Measure(int total, int parallel, const std::function<void(int)>& one);

// A Markdown table printed with aligned columns.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string Fixed(double v, int digits);

using testing::MemAvailableKiB;  // (tests/testing/test_util.h)
using testing::PerCpuFreeKiB;
using testing::MemoryCgroups;

// The directory of this program (the build tree's tests/bench).
std::string SelfDir();

// Ends the benchmark with `s`'s message when it failed. Thrown, not
// std::exit: every MountPoint, TempDir and Subprocess on the way out
// undoes itself. BenchMain prints it.
void Check(const Status& s);
template <typename T>
T Check(Result<T> r) {
  Check(r.status());
  return std::move(r).value();
}

// A benchmark's main: runs `body`; a failure prints "<program>: <why>" and
// returns 1.
int BenchMain(const std::function<int()>& body);

}  // namespace strata::bench
