// The node daemon's registries: what lasts, what dies with a boot, and
// what an older daemon left where this one no longer keeps it.
#include "launcher/node/registry.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>

#include "common/fs.h"
#include "tests/testing/test_util.h"

namespace strata::launcher {
namespace {

using nlohmann::json;

std::map<std::string, json> AllOf(Registry& r) {
  std::map<std::string, json> out;
  auto all = r.All();
  EXPECT_TRUE(all.ok()) << all.status().ToString();
  if (all.ok()) {
    for (auto& [k, v] : *all) out[k] = v;
  }
  return out;
}

TEST(RegistryTest, SandboxesLastTheBootAndWarmPoolsOutliveIt) {
  TempDir dir = testing::MakeTempDir();
  const std::string state = dir.Sub("state");
  {
    ASSERT_OK_AND_ASSIGN(auto r, Registry::Open(state, "boot-a"));
    EXPECT_TRUE(r->first_start_in_boot());
    ASSERT_OK(r->Record("sb-1", {{"status", "running"}}));
    ASSERT_OK(r->Record("sb-2", {{"status", "creating"}}));
    ASSERT_OK(r->Forget("sb-2"));
    ASSERT_OK(r->RecordLasting("warm:wp-1", {{"kind", "warm-pool"}, {"size", 2}}));
    ASSERT_OK(r->MarkSwept());
    EXPECT_FALSE(r->first_start_in_boot());
  }
  {
    // A restart in the same boot finds both, the lasting registry's first.
    ASSERT_OK_AND_ASSIGN(auto r, Registry::Open(state, "boot-a"));
    EXPECT_FALSE(r->first_start_in_boot());
    ASSERT_OK_AND_ASSIGN(auto all, r->All());
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].first, "warm:wp-1");
    EXPECT_EQ(all[1].first, "sb-1");
    EXPECT_EQ(all[1].second["status"], "running");
    EXPECT_EQ(r->moved(), 0);
  }
  {
    // The next boot: its sandboxes died with the machine, the pool did not,
    // and the earlier boot's registry is gone from disk.
    ASSERT_OK_AND_ASSIGN(auto r, Registry::Open(state, "boot-b"));
    EXPECT_TRUE(r->first_start_in_boot());
    auto all = AllOf(*r);
    EXPECT_EQ(all.size(), 1u);
    EXPECT_TRUE(all.count("warm:wp-1"));
    EXPECT_NE(::access((state + "/boot/boot-b").c_str(), F_OK), -1);
    EXPECT_EQ(::access((state + "/boot/boot-a").c_str(), F_OK), -1);
  }
}

TEST(RegistryTest, AnOlderDaemonsSandboxRecordsMoveToThisBoots) {
  TempDir dir = testing::MakeTempDir();
  const std::string state = dir.Sub("state");
  {
    ASSERT_OK_AND_ASSIGN(auto r, Registry::Open(state, "boot-a"));
    // Where a daemon before 2026-12-04 kept them.
    ASSERT_OK(r->RecordLasting("sb-old", {{"status", "running"}}));
    ASSERT_OK(r->RecordLasting("warm:wp-1", {{"kind", "warm-pool"}}));
  }
  ASSERT_OK_AND_ASSIGN(auto r, Registry::Open(state, "boot-a"));
  EXPECT_EQ(r->moved(), 1);
  // Moved, not copied: forgetting it here forgets it everywhere.
  ASSERT_OK(r->Forget("sb-old"));
  auto all = AllOf(*r);
  EXPECT_EQ(all.size(), 1u);
  EXPECT_TRUE(all.count("warm:wp-1"));
}

TEST(RegistryTest, ATakenWarmSandboxIsThePoolsOrTheCreatesNeverBoth) {
  TempDir dir = testing::MakeTempDir();
  ASSERT_OK_AND_ASSIGN(auto r, Registry::Open(dir.Sub("state"), "boot-a"));
  ASSERT_OK(r->Record("wm-7", {{"kind", "warm"}, {"pool", "wp-1"}}));
  ASSERT_OK(r->Rename("wm-7", "sb-9", {{"status", "running"}, {"internal", "wm-7"}}));
  auto all = AllOf(*r);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all["sb-9"]["internal"], "wm-7");
}

TEST(RegistryTest, ABootIdThatIsNoNameIsRefused) {
  TempDir dir = testing::MakeTempDir();
  for (const char* bad : {"", "..", "a/b"}) {
    auto r = Registry::Open(dir.Sub("state"), bad);
    EXPECT_EQ(r.status().code(), ENOENT) << bad;
  }
}

}  // namespace
}  // namespace strata::launcher
