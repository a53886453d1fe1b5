// Helpers shared by strata's tests.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "common/fs.h"
#include "common/status.h"

namespace strata::testing {

// Fails the test with the error's message when `expr` is not OK.
#define ASSERT_OK(expr)                                                   \
  do {                                                                    \
    auto&& strata_test_s_ = (expr);                                       \
    ASSERT_TRUE(strata_test_s_.ok()) << ::strata::internal::ToStatus(strata_test_s_).ToString(); \
  } while (0)
#define EXPECT_OK(expr)                                                   \
  do {                                                                    \
    auto&& strata_test_s_ = (expr);                                       \
    EXPECT_TRUE(strata_test_s_.ok()) << ::strata::internal::ToStatus(strata_test_s_).ToString(); \
  } while (0)

// `lhs = value of expr`, or fail the test.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(STRATA_CONCAT_(strata_test_r_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)   \
  auto tmp = (expr);                                 \
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString(); \
  lhs = std::move(tmp).value()

// A temporary directory for one test, removed afterwards pass or fail.
TempDir MakeTempDir();

// Deterministic pseudo-random bytes.
std::string RandomBytes(size_t n, uint64_t seed);

// MemAvailable of /proc/meminfo in KiB plus PerCpuFreeKiB(), after
// syncing and dropping the page cache, and once the memory cgroups that
// were removed and held only by cached pages are gone (so that a
// difference is what something holds).
uint64_t MemAvailableKiB();
// Free pages on the page allocator's per-CPU lists (/proc/zoneinfo, each
// zone's pagesets' `count`), in KiB. MemFree and MemAvailable leave them
// out, and they swing by tens of MiB with how each CPU last allocated and
// freed (on this VM a CPU's list may keep 36 MiB for good and grow far
// past it; 59 MiB of them went back to MemFree in 5 idle seconds).
uint64_t PerCpuFreeKiB();
// Memory cgroups on the node, live and dying (/proc/cgroups); -1 without.
int MemoryCgroups();

// Directory of the running test binary (helpers are built beside it).
std::string TestBinaryDir();

}  // namespace strata::testing
