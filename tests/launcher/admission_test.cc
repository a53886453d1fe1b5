// The node's admission of one more sandbox, from the figures alone.
#include "launcher/api/admission.h"

#include <gtest/gtest.h>

#include <string>

namespace strata::launcher {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A node with room for everything.
NodeLoad Roomy() {
  return {.sandboxes = 0, .memory_committed = 0, .memory_available = 16 * kGiB, .disk_available = 100 * kGiB,
          .inodes_known = true, .inodes_available = 1 << 20, .pids_available = 1 << 20};
}

std::string Refusal(const NodeLimits& limits, const NodeLoad& load, uint64_t memory = 0) {
  Status s = AdmitOnNode(limits, load, memory);
  if (s.ok()) return "";
  EXPECT_EQ(s.code(), EAGAIN) << s.ToString();
  return s.message();
}

TEST(AdmissionTest, WithoutLimitsARoomyNodeTakesEverything) {
  EXPECT_EQ(Refusal({}, Roomy(), 64 * kGiB), "");
}

TEST(AdmissionTest, EachLimitRefusesByItsFlag) {
  NodeLoad load = Roomy();
  load.sandboxes = 10;
  EXPECT_NE(Refusal({.max_sandboxes = 10}, load).find("--max-sandboxes"), std::string::npos);
  EXPECT_EQ(Refusal({.max_sandboxes = 11}, load), "");

  load = Roomy();
  load.memory_committed = 3 * kGiB;
  EXPECT_EQ(Refusal({.memory_capacity = 4 * kGiB}, load, kGiB), "");  // exactly full is allowed
  EXPECT_NE(Refusal({.memory_capacity = 4 * kGiB}, load, kGiB + 1).find("--memory-capacity"), std::string::npos);

  load = Roomy();
  load.disk_available = kGiB;
  EXPECT_NE(Refusal({.disk_reserve = 2 * kGiB}, load).find("--disk-reserve"), std::string::npos);

  load = Roomy();
  load.memory_available = kGiB;
  EXPECT_NE(Refusal({.memory_reserve = 2 * kGiB}, load).find("--memory-reserve"), std::string::npos);
  EXPECT_EQ(Refusal({}, load), "");  // (no reserve: what is available does not matter)
}

TEST(AdmissionTest, TheNodesOwnReservesHoldWithoutFlags) {
  NodeLoad load = Roomy();
  load.inodes_available = kInodeReserve - 1;
  EXPECT_NE(Refusal({}, load).find("inodes"), std::string::npos);
  load.inodes_known = false;  // btrfs: no count to keep
  EXPECT_EQ(Refusal({}, load), "");
  load = Roomy();
  load.pids_available = kPidReserve - 1;
  EXPECT_NE(Refusal({}, load).find("pid_max"), std::string::npos);
}

TEST(AdmissionTest, TheFirstLimitPassedIsTheOneNamed) {
  NodeLoad load = Roomy();
  load.sandboxes = 5;
  load.disk_available = 0;
  EXPECT_NE(Refusal({.max_sandboxes = 5, .disk_reserve = 1}, load).find("--max-sandboxes"), std::string::npos);
}

}  // namespace
}  // namespace strata::launcher
