// Helpers for benchmark programs: timing and table printing.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace strata::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Median of `samples` (copied).
double Median(std::vector<double> samples);
double Percentile(std::vector<double> samples, double p);

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

// The directory of this program (the build tree's tests/bench).
std::string SelfDir();

}  // namespace strata::bench
