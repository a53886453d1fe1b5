// Benchmark helpers.
#include "tests/bench/bench_util.h"

#include <atomic>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "common/fs.h"

namespace strata::bench {

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = '\0';
  return Dirname(buf);
}

void Check(const Status& s) {
  if (!s.ok()) throw std::runtime_error(s.ToString());
}

int BenchMain(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, e.what());
    return 1;
  }
}

double Median(std::vector<double> samples) { return Percentile(std::move(samples), 50); }

double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  size_t i = static_cast<size_t>(p / 100.0 * static_cast<double>(samples.size() - 1) + 0.5);
  return samples[std::min(i, samples.size() - 1)];
}

void Table::Print() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (size_t r = 0; r < rows_.size(); ++r) {
    std::string line = "|";
    for (size_t i = 0; i < width.size(); ++i) {
      std::string cell = i < rows_[r].size() ? rows_[r][i] : "";
      line += " " + cell + std::string(width[i] - cell.size(), ' ') + " |";
    }
    std::printf("%s\n", line.c_str());
    if (r == 0) {
      std::string sep = "|";
      for (size_t w : width) sep += std::string(w + 2, '-') + "|";
      std::printf("%s\n", sep.c_str());
    }
  }
  std::fflush(stdout);
}

Figures Measure(int total, int parallel, const std::function<void(int)>& one) {
  std::vector<double> ms;
  std::mutex mu;
  std::atomic<int> next{0};
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < parallel; ++t) {
    threads.emplace_back([&] {
      for (int i; (i = next++) < total;) {
        auto t0 = Clock::now();
        one(i);
        double d = Seconds(Clock::now() - t0) * 1000;
        std::lock_guard lock(mu);
        ms.push_back(d);
      }
    });
  }
  for (auto& t : threads) t.join();
  return {Percentile(ms, 50), Percentile(ms, 99), total / Seconds(Clock::now() - start)};
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace strata::bench
