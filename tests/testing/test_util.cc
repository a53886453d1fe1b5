// Shared test helpers.
#include "tests/testing/test_util.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

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

int MemoryCgroups() {
  std::ifstream in("/proc/cgroups");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string name;
    int hierarchy = 0, count = -1;
    if (f >> name >> hierarchy >> count && name == "memory") return count;
  }
  return -1;
}

uint64_t MemAvailableKiB() {
  // Removed memory cgroups stay (dying, with their kernel memory) while
  // pages charged to them are cached; after the drop they go a moment
  // later. Wait until their number holds still for a second (20 s at most).
  int last = -2, still = 0;
  for (int i = 0; i < 80 && still < 4; ++i) {
    ::sync();
    std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
    const int n = MemoryCgroups();
    still = n == last ? still + 1 : 0;
    last = n;
    ::usleep(250000);
  }
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t value;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value + PerCpuFreeKiB();
  }
  return 0;
}

uint64_t PerCpuFreeKiB() {
  std::ifstream in("/proc/zoneinfo");
  uint64_t pages = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string key;
    uint64_t n = 0;
    if (f >> key >> n && key == "count:") pages += n;
  }
  return pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) / 1024;
}

}  // namespace strata::testing
