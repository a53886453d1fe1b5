// Shared test helpers.
#include "tests/testing/test_util.h"

#include <unistd.h>

#include <cstring>
#include <fstream>

namespace strata::testing {

TempDir MakeTempDir() {
  auto dir = TempDir::Create("strata-test");
  if (!dir.ok()) {
    ADD_FAILURE() << dir.status().ToString();
    std::abort();
  }
  return std::move(*dir);
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&s[i], &v, 8);
  }
  for (; i < n; ++i) s[i] = static_cast<char>(rng());
  return s;
}

std::string TestBinaryDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return Dirname(buf);
}

uint64_t MemAvailableKiB() {
  ::sync();
  std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t value;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value;
  }
  return 0;
}

}  // namespace strata::testing
