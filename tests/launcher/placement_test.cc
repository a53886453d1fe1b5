// The gateway's placement: what a node must offer to be chosen, the spread
// of a burst, the overflow gate, and the decision rate it is built for.
#include "launcher/cluster/placement.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "launcher/sandbox/sandbox.h"

namespace strata::launcher {
namespace {

NodeRecord Node(const std::string& name, int64_t sandboxes, int64_t slots = 100, const std::string& pool = "main") {
  NodeRecord r;
  r.name = name;
  r.url = "https://" + name;
  r.labels = {{"pool", pool}};
  r.backends = {"container", "fncall"};
  r.slots = slots;
  r.memory = uint64_t{16} << 30;
  r.memory_available = uint64_t{8} << 30;
  r.sandboxes = sandboxes;
  r.at_ms = 1;
  return r;
}

TEST(PlacementTest, OnlyNodesThatCanTakeItAreChosen) {
  Placer p;
  NodeRecord full = Node("full", 100), refusing = Node("refusing", 0), other_backend = Node("vm", 0), small = Node("small", 0);
  refusing.accepting = false;
  other_backend.backends = {"microvm"};
  small.memory_available = 64 << 20;
  p.Update({full, refusing, other_backend, small, Node("ok", 50)}, {});
  PlacementRequest want;
  want.memory = 512 << 20;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(*p.Place(want), "ok");
  // Cordoned, or excluded (tried already): nothing left.
  p.Update({full, Node("ok", 50)}, {"ok"});
  auto none = p.Place(want);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), EAGAIN);
  EXPECT_NE(none.status().message().find("full or refusing"), std::string::npos) << none.status().message();
  p.Update({full, Node("ok", 50)}, {});
  EXPECT_FALSE(p.Place(want, {"ok"}).ok());
}

TEST(PlacementTest, LabelsMustAllMatch) {
  Placer p;
  NodeRecord gpu = Node("gpu", 0);
  gpu.labels["gpu"] = "a100";
  p.Update({Node("plain", 0), gpu}, {});
  PlacementRequest want;
  want.labels = {{"gpu", "a100"}, {"pool", "main"}};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(*p.Place(want), "gpu");
  want.labels = {{"gpu", "h100"}};
  auto none = p.Place(want);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("labels"), std::string::npos);
}

TEST(PlacementTest, ABurstBetweenReportsSpreadsOverEqualNodes) {
  // No report arrives during the burst: only the gateway's own count of
  // its placements keeps it from piling onto one node.
  Placer p;
  p.Update({Node("a", 10), Node("b", 10), Node("c", 10), Node("d", 10)}, {});
  std::map<std::string, int> got;
  for (int i = 0; i < 200; ++i) ++got[*p.Place({})];
  for (const auto& [name, n] : got) EXPECT_LE(n, 60) << name;  // fair share 50
  EXPECT_EQ(got.size(), 4u);
}

TEST(PlacementTest, TheLessLoadedNodeFillsFirst) {
  Placer p(PlacementPolicy{.sample = 4});
  p.Update({Node("busy", 80), Node("idle", 0)}, {});
  std::map<std::string, int> got;
  for (int i = 0; i < 60; ++i) ++got[*p.Place({})];
  EXPECT_EQ(got["idle"], 60);
}

TEST(PlacementTest, TheOverflowPoolOpensOnlyAboveTheThreshold) {
  Placer p;  // pool=cloud above 80 %
  p.Update({Node("m1", 70), Node("m2", 70), Node("cloud", 0, 100, "cloud")}, {});
  EXPECT_DOUBLE_EQ(p.MainUtilisation(), 0.7);
  for (int i = 0; i < 19; ++i) EXPECT_NE(*p.Place({}), "cloud");  // 159 / 200 = 0.795
  std::map<std::string, int> got;
  for (int i = 0; i < 20; ++i) ++got[*p.Place({})];
  EXPECT_GT(got["cloud"], 0);
  // Asking for it by label is asking for it.
  p.Update({Node("m1", 0), Node("m2", 0), Node("cloud", 0, 100, "cloud")}, {});
  PlacementRequest cloud;
  cloud.labels = {{"pool", "cloud"}};
  EXPECT_EQ(*p.Place(cloud), "cloud");
  // Main nodes full (100 %): the overflow pool takes it.
  p.Update({Node("m1", 100), Node("m2", 100), Node("cloud", 0, 100, "cloud")}, {});
  EXPECT_EQ(*p.Place({}), "cloud");
}

TEST(PlacementTest, AReportMadeAfterPlacementsArrivedCountsThemOnce) {
  const int64_t now_ms = ReportClockMs();
  Placer p;  // pool=cloud above 80 %
  auto m1 = [&](int64_t sandboxes, int64_t at_ms) {
    NodeRecord m = Node("m1", sandboxes);
    m.at_ms = at_ms;
    return m;
  };
  p.Update({m1(0, now_ms - 5000), Node("cloud", 0, 100, "cloud")}, {});
  for (int i = 0; i < 60; ++i) EXPECT_EQ(*p.Place({}), "m1");
  EXPECT_DOUBLE_EQ(p.MainUtilisation(), 0.6);
  // A report made before they arrived counts none of them: still pending.
  p.Update({m1(0, now_ms - 4000), Node("cloud", 0, 100, "cloud")}, {});
  EXPECT_DOUBLE_EQ(p.MainUtilisation(), 0.6);
  // One made after counts all 60 (created or under way): not twice, so the
  // overflow pool stays closed for the next 15.
  p.Update({m1(60, now_ms + 1000), Node("cloud", 0, 100, "cloud")}, {});
  EXPECT_DOUBLE_EQ(p.MainUtilisation(), 0.6);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(*p.Place({}), "m1");
}

TEST(PlacementTest, ARefusedPlacementIsTakenBack) {
  Placer p;
  p.Update({Node("a", 99)}, {});
  ASSERT_EQ(*p.Place({}), "a");
  EXPECT_FALSE(p.Place({}).ok());  // its last slot is counted as taken
  p.Unplace("a");
  EXPECT_TRUE(p.Place({}).ok());
}

TEST(PlacementTest, ABulkCreateNeedsRoomForAllOfIt) {
  Placer p;
  p.Update({Node("a", 90), Node("b", 50)}, {});
  PlacementRequest bulk;
  bulk.count = 20;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(*p.Place(bulk), "b");
    p.Unplace("b", 20);
  }
}

TEST(PlacementTest, SandboxIdsNameTheirNode) {
  const std::string id = NewSandboxId("node-7");
  EXPECT_EQ(SandboxIdNode(id), "node-7");
  EXPECT_EQ(SandboxIdNode(NewSandboxId()), "");
  EXPECT_EQ(SandboxIdNode("sb-x"), "");
  EXPECT_TRUE(CheckNodeName("n1").ok());
  EXPECT_FALSE(CheckNodeName("").ok());
  EXPECT_FALSE(CheckNodeName("Upper").ok());
  EXPECT_FALSE(CheckNodeName("a/b").ok());
  EXPECT_FALSE(CheckNodeName("-a").ok());
  EXPECT_FALSE(CheckNodeName(std::string(21, 'a')).ok());
}

}  // namespace
}  // namespace strata::launcher
