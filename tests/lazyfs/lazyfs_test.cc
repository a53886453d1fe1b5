// System tests of lazyfs in kernel mode: a real FUSE mount, real EROFS
// file-backed mounts, a real store directory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "lazyfs/client.h"
#include "lazyfs/daemon.h"
#include "tests/lazyfs/lazyfs_fixture.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/test_util.h"
#include "tests/testing/tree.h"

namespace strata::lazyfs {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::MakeTempDir;
using testing::RandomBytes;

TEST_F(LazyfsTest, ARichTreeReadsBackIdentical) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src));
  Publish(src, "rich");
  StartDaemon(Options());
  ASSERT_OK(daemon_->MountAt("rich:1", store_url_, dir_.Sub("mnt"), false).status());
  ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(src));
  ASSERT_OK_AND_ASSIGN(auto got, testing::SnapshotTree(dir_.Sub("mnt")));
  auto diff = testing::DiffTrees(want, got);
  EXPECT_TRUE(diff.empty()) << Join(diff, "\n");
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("mnt")));
}

TEST_F(LazyfsTest, ReadingOneSmallFileFetchesOnlyItsExtent) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  for (int i = 0; i < 50; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/big-", i), RandomBytes(1 << 20, i)));
  ASSERT_OK(WriteFileAtomic(src + "/small", "just this\n"));
  layerctl::BuiltLayer layer = Publish(src, "lazy");
  StartDaemon(Options());
  store_->ResetCounts();
  ASSERT_OK(daemon_->MountAt("lazy:1", store_url_, dir_.Sub("mnt"), false).status());
  EXPECT_EQ(store_->GetsOf(cache::ChunkKey(layer.manifest.meta_hash)), 1);
  int chunk_gets_at_mount = 0;
  for (const auto& e : layer.manifest.extents) chunk_gets_at_mount += store_->GetsOf(cache::ChunkKey(e.hash));
  EXPECT_EQ(chunk_gets_at_mount, 0);  // metadata only; no data before a read
  ASSERT_OK_AND_ASSIGN(std::string got, ReadFileToString(dir_.Sub("mnt/small")));
  EXPECT_EQ(got, "just this\n");
  // Listing and stat-ing everything needs metadata only.
  ASSERT_OK(RunChecked({.argv = {"find", dir_.Sub("mnt"), "-ls"}}, "find").status());
  json stats = daemon_->Stats(dir_.Sub("mnt"));
  ASSERT_EQ(stats["layers"].size(), 1u);
  const auto& l = stats["layers"][0];
  EXPECT_EQ(l["chunks_fetched"], 1);
  EXPECT_EQ(l["bytes_fetched"], 10);
  EXPECT_LT(l["blob_fetched_percent"].get<double>(), 0.01);
  int data_gets = 0;
  for (const auto& e : layer.manifest.extents) data_gets += store_->GetsOf(cache::ChunkKey(e.hash));
  EXPECT_EQ(data_gets, 1);
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("mnt")));
}

TEST_F(LazyfsTest, ConcurrentColdReadersMakeOneRequestPerExtent) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  std::string data = RandomBytes(8 << 20, 9);
  ASSERT_OK(WriteFileAtomic(src + "/cold", data));
  layerctl::BuiltLayer layer = Publish(src, "cold");
  StartDaemon(Options());
  ASSERT_OK(daemon_->MountAt("cold:1", store_url_, dir_.Sub("mnt"), false).status());
  store_->SetDelay(20ms);
  std::atomic<int> good{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 32; ++i) {
    readers.emplace_back([&] {
      auto got = ReadFileToString(dir_.Sub("mnt/cold"));
      good += got.ok() && *got == data;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(good.load(), 32);
  EXPECT_EQ(layer.manifest.extents.size(), 8u);
  for (const auto& e : layer.manifest.extents) EXPECT_EQ(store_->GetsOf(cache::ChunkKey(e.hash)), 1) << e.hash.Hex();
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("mnt")));
}

TEST_F(LazyfsTest, SlowDownOrCorruptStoresGiveEioNeverHangsOrBadBytes) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(WriteFileAtomic(src + "/a", RandomBytes(300000, 1)));
  ASSERT_OK(WriteFileAtomic(src + "/b", RandomBytes(300000, 2)));
  ASSERT_OK(WriteFileAtomic(src + "/c", RandomBytes(300000, 3)));
  Publish(src, "faulty");
  DaemonOptions o = Options();
  o.fetch_deadline = 1s;
  StartDaemon(o);
  ASSERT_OK(daemon_->MountAt("faulty:1", store_url_, dir_.Sub("mnt"), false).status());

  store_->SetDelay(5s);  // slow: past the deadline
  auto start = std::chrono::steady_clock::now();
  auto slow = ReadFileToString(dir_.Sub("mnt/a"));
  EXPECT_FALSE(slow.ok());
  EXPECT_EQ(slow.status().code(), EIO);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  store_->SetDelay(0ms);

  store_->SetDown(true);
  auto down = ReadFileToString(dir_.Sub("mnt/b"));
  EXPECT_EQ(down.status().code(), EIO);
  store_->SetDown(false);

  store_->SetCorrupt(true);
  auto corrupt = ReadFileToString(dir_.Sub("mnt/c"));
  EXPECT_EQ(corrupt.status().code(), EIO);
  store_->SetCorrupt(false);
  // Nothing bad was cached: the same file reads correctly now.
  ASSERT_OK_AND_ASSIGN(std::string c, ReadFileToString(dir_.Sub("mnt/c")));
  EXPECT_EQ(c, RandomBytes(300000, 3));
  ASSERT_OK_AND_ASSIGN(std::string b, ReadFileToString(dir_.Sub("mnt/b")));
  EXPECT_EQ(b, RandomBytes(300000, 2));
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("mnt")));
}

TEST_F(LazyfsTest, OneMountPerLayerSharedByUsersAndDroppedAfterTheGracePeriod) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(WriteFileAtomic(src + "/f", "shared"));
  Publish(src, "shared");
  DaemonOptions o = Options();
  o.grace = 3s;
  StartDaemon(o);
  // The node's lease is in the store by the time the mount is answered,
  // however slow the store takes it (it is written beside the load).
  store_->SetPutDelay(300ms);
  ASSERT_OK_AND_ASSIGN(auto a, daemon_->MountAt("shared:1", store_url_, dir_.Sub("a"), false));
  store_->SetPutDelay(0ms);
  {
    ASSERT_OK_AND_ASSIGN(auto leases, catalog_->ListLeases());
    ASSERT_EQ(leases.size(), 1u);
    EXPECT_EQ(leases[0].digest, a.digest);
  }
  ASSERT_OK_AND_ASSIGN(auto b, daemon_->MountAt("shared:1", store_url_, dir_.Sub("b"), false));
  ASSERT_OK_AND_ASSIGN(auto c, daemon_->Acquire("shared:1", store_url_, "sandbox-1"));
  EXPECT_EQ(a.path, b.path);
  EXPECT_EQ(a.path, c.path);
  json stats = daemon_->Stats("");
  ASSERT_EQ(stats["layers"].size(), 1u);
  EXPECT_EQ(stats["layers"][0]["holders"], 3);
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("a")));
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("b")));
  ASSERT_OK(daemon_->Release(c.digest, "sandbox-1"));
  EXPECT_TRUE(IsMountPoint(a.path));  // within the grace period
  ASSERT_OK_AND_ASSIGN(auto leases, catalog_->ListLeases());
  EXPECT_EQ(leases.size(), 1u);
  // The unload unmounts first and drops the lease after: wait for both.
  for (int i = 0; i < 150; ++i) {
    ASSERT_OK_AND_ASSIGN(leases, catalog_->ListLeases());
    if (!IsMountPoint(a.path) && leases.empty()) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_FALSE(IsMountPoint(a.path));
  EXPECT_TRUE(leases.empty());
}

// The lease is written beside the load: a load that fails after it (here
// the metadata image is missing from the store) takes it back.
TEST_F(LazyfsTest, AMountThatFailsLeavesNoLeaseAndNoMount) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(WriteFileAtomic(src + "/f", "broken"));
  layerctl::BuiltLayer layer = Publish(src, "broken");
  ASSERT_OK(inner_->Delete(cache::ChunkKey(layer.manifest.meta_hash)));
  StartDaemon(Options());
  auto mounted = daemon_->MountAt("broken:1", store_url_, dir_.Sub("mnt"), false);
  ASSERT_FALSE(mounted.ok());
  EXPECT_NE(mounted.status().ToString().find("metadata image"), std::string::npos) << mounted.status().ToString();
  EXPECT_FALSE(IsMountPoint(dir_.Sub("mnt")));
  ASSERT_OK_AND_ASSIGN(auto leases, catalog_->ListLeases());
  EXPECT_TRUE(leases.empty());
  EXPECT_EQ(daemon_->Stats("")["layers"].size(), 0u);
}

TEST_F(LazyfsTest, RecordedAccessListIsPrefetchedAtTheNextMount) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  for (int i = 0; i < 20; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/f", i), RandomBytes(200000, i)));
  layerctl::BuiltLayer layer = Publish(src, "rec");
  {
    StartDaemon(Options());
    ASSERT_OK(daemon_->MountAt("rec:1", store_url_, dir_.Sub("mnt"), true).status());
    ASSERT_OK(ReadFileToString(dir_.Sub("mnt/f7")).status());
    ASSERT_OK(ReadFileToString(dir_.Sub("mnt/f3")).status());
    ASSERT_OK(daemon_->UnmountAt(dir_.Sub("mnt")));
    daemon_.reset();
  }
  ASSERT_OK_AND_ASSIGN(auto list, catalog_->GetAccessList(layer.digest));
  ASSERT_EQ(list.size(), 2u);
  auto name_of = [&](uint32_t i) { return layer.manifest.extents[i].hash; };
  EXPECT_EQ(name_of(list[0]), HashBytes(RandomBytes(200000, 7)));
  EXPECT_EQ(name_of(list[1]), HashBytes(RandomBytes(200000, 3)));

  // A fresh node (empty cache) prefetches both without anyone reading.
  ASSERT_OK(RemoveTree(dir_.Sub("cache")));
  StartDaemon(Options());
  store_->ResetCounts();
  ASSERT_OK(daemon_->MountAt("rec:1", store_url_, dir_.Sub("mnt"), false).status());
  for (int i = 0; i < 100; ++i) {
    if (store_->GetsOf(cache::ChunkKey(name_of(list[0]))) && store_->GetsOf(cache::ChunkKey(name_of(list[1])))) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(store_->GetsOf(cache::ChunkKey(name_of(list[0]))), 1);
  EXPECT_EQ(store_->GetsOf(cache::ChunkKey(name_of(list[1]))), 1);
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("mnt")));
}

}  // namespace
}  // namespace strata::lazyfs
