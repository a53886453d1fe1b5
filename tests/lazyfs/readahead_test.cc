// Readahead across extents (lazyfs/served_layer.h): a layer served straight
// from a ServedLayer over a counting store, no mounts, so every request it
// makes is visible.
#include <gtest/gtest.h>

#include <set>

#include "cache/catalog.h"
#include "cache/chunk_cache.h"
#include "common/fs.h"
#include "common/strings.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "lazyfs/served_layer.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/test_util.h"

namespace strata::lazyfs {
namespace {

using namespace std::chrono_literals;
using testing::RandomBytes;

constexpr int kFiles = 200;
constexpr size_t kFileSize = 64 << 10;  // one extent each, side by side in the blob

class ReadaheadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string src = dir_.Sub("src");
    ASSERT_OK(MakeDirs(src));
    for (int i = 0; i < kFiles; ++i) {
      ASSERT_OK(WriteFileAtomic(src + StrCat("/f", 1000 + i), RandomBytes(kFileSize, i)));
    }
    ASSERT_OK_AND_ASSIGN(auto inner, cache::OpenStore("file://" + dir_.Sub("store")));
    store_ = std::make_shared<testing::FaultyStore>(inner);
    cache::Catalog catalog(inner);
    ASSERT_OK_AND_ASSIGN(layerctl::BuiltLayer built,
                         layerctl::BuildLayer({.source = src, .output_dir = dir_.Sub("layer"), .name = "ra"}));
    ASSERT_OK(layerctl::Push(built, catalog, cache::LayerRef{"ra", "1"}).status());
    manifest_ = built.manifest;
    ASSERT_EQ(manifest_.extents.size(), static_cast<size_t>(kFiles));
    cache::ChunkCacheOptions options;
    options.dir = dir_.Sub("cache");
    ASSERT_OK_AND_ASSIGN(cache_, cache::ChunkCache::Open(options));
    layer_ = std::make_shared<ServedLayer>(built.digest, manifest_, store_, *cache_);
    ASSERT_OK(layer_->Load());
    store_->ResetCounts();
  }

  void TearDown() override {
    if (layer_) layer_->WaitForBackground();
    if (cache_) cache_->WaitForFetches();
  }

  // Reads extent `i` whole through the layer, as the kernel would.
  void ReadExtent(size_t i) {
    const cache::Extent& e = manifest_.extents[i];
    std::string buf(e.length, '\0');
    ASSERT_OK_AND_ASSIGN(size_t n, layer_->ReadBlob(e.offset, buf));
    ASSERT_EQ(n, e.length);
    ASSERT_EQ(HashBytes(buf), e.hash) << "extent " << i;
  }

  int Gets(size_t i) const { return store_->GetsOf(cache::ChunkKey(manifest_.extents[i].hash)); }
  // Extents the store was asked for, and a check that none was asked twice.
  std::set<size_t> Fetched() const {
    std::set<size_t> out;
    for (size_t i = 0; i < manifest_.extents.size(); ++i) {
      EXPECT_LE(Gets(i), 1) << "extent " << i << " fetched twice";
      if (Gets(i)) out.insert(i);
    }
    return out;
  }
  void Settle() {
    layer_->WaitForBackground();
    cache_->WaitForFetches();
  }

  TempDir dir_ = testing::MakeTempDir();
  std::shared_ptr<testing::FaultyStore> store_;
  cache::Manifest manifest_;
  std::unique_ptr<cache::ChunkCache> cache_;
  std::shared_ptr<ServedLayer> layer_;
};

TEST_F(ReadaheadTest, AReaderWalkingTheBlobGetsTheNextExtentsAheadWithinItsWindow) {
  store_->SetDelay(2ms);
  for (size_t i = 0; i < 10; ++i) ReadExtent(i);
  Settle();
  std::set<size_t> fetched = Fetched();
  // Ahead of the reader, but never more than the largest window (64
  // extents) past where it stopped.
  EXPECT_GT(fetched.size(), 12u);
  EXPECT_LT(*fetched.rbegin(), 10u + 64u);
  LayerStats st = layer_->Stats();
  EXPECT_GT(st.readahead_fetches, 0u);
  EXPECT_EQ(st.chunks_fetched, fetched.size());
  EXPECT_EQ(st.read_errors, 0u);
  // The rest of the blob, in order, to its end: nothing is asked twice and
  // nothing past the last extent (Fetched() checks both).
  for (size_t i = 10; i < manifest_.extents.size(); ++i) ReadExtent(i);
  Settle();
  EXPECT_EQ(Fetched().size(), manifest_.extents.size());
  // Readahead did most of the fetching: the reader mostly found its extents ready.
  EXPECT_GT(layer_->Stats().readahead_fetches, manifest_.extents.size() / 2);
}

TEST_F(ReadaheadTest, OneReadIsNotAPatternAndAReaderThatJumpedAwayIsNotFollowed) {
  // Scattered reads, no two in sequence: only what they read is fetched.
  for (size_t i : {150u, 20u, 90u, 3u}) ReadExtent(i);
  Settle();
  EXPECT_EQ(Fetched(), (std::set<size_t>{3, 20, 90, 150}));
  EXPECT_EQ(layer_->Stats().readahead_fetches, 0u);

  // A sequential run, then a jump: after the jump nothing more is fetched
  // for the old run, and the single read over there brings nothing with it.
  for (size_t i = 40; i < 46; ++i) ReadExtent(i);
  Settle();
  const std::set<size_t> before = Fetched();
  const size_t ahead = *before.rbegin();
  EXPECT_GT(ahead, 45u);
  ReadExtent(120);
  std::this_thread::sleep_for(100ms);
  Settle();
  std::set<size_t> after = Fetched();
  after.erase(120);
  EXPECT_EQ(after, before);
}

TEST_F(ReadaheadTest, AReaderThatHopsOverExtentsIsNotWalkingUntilItStepsTwiceInARow) {
  // As an import reads some of a directory's files: forward, a few extents
  // apart, now and then two neighbours. Only what it reads is fetched.
  const std::vector<size_t> hops = {10, 12, 13, 16, 17, 19, 22};
  for (size_t i : hops) ReadExtent(i);
  Settle();
  EXPECT_EQ(Fetched(), std::set<size_t>(hops.begin(), hops.end()));
  EXPECT_EQ(layer_->Stats().readahead_fetches, 0u);
  // Then it walks. Its last skipped extents (20, 21) might still be read by
  // a reader beside it, until they fall 4 behind its end: from 25 on, its
  // steps are dense, and the second one opens its window.
  for (size_t i = 23; i <= 25; ++i) ReadExtent(i);
  Settle();
  EXPECT_EQ(layer_->Stats().readahead_fetches, 0u);
  ReadExtent(26);
  Settle();
  std::set<size_t> fetched = Fetched();
  EXPECT_TRUE(fetched.count(27) && fetched.count(28)) << "the window after 26";
  EXPECT_GT(layer_->Stats().readahead_fetches, 0u);
}

TEST_F(ReadaheadTest, ReadsThatArriveOutOfOrderStillWalk) {
  // Readers side by side, or requests answered out of order: each read a
  // step ahead of the one it fills in after.
  for (size_t i : {40u, 42u, 41u, 43u, 45u, 44u, 46u}) ReadExtent(i);
  Settle();
  std::set<size_t> fetched = Fetched();
  EXPECT_TRUE(fetched.count(47) && fetched.count(50)) << "the window after 46";
  EXPECT_GT(layer_->Stats().readahead_fetches, 0u);
}

TEST_F(ReadaheadTest, AWalkerThatStartsHoppingLosesItsWindow) {
  for (size_t i = 60; i <= 65; ++i) ReadExtent(i);
  Settle();
  const std::set<size_t> walked = Fetched();
  const size_t ahead = *walked.rbegin();
  ASSERT_GT(ahead, 65u);
  // Every third extent from here: once the first skipped ones fall 4
  // behind, nothing is fetched but what it reads.
  std::set<size_t> hops;
  for (size_t i = 68; i <= ahead + 20 && i < static_cast<size_t>(kFiles); i += 3) {
    ReadExtent(i);
    hops.insert(i);
  }
  Settle();
  // (The step onto 68 still tops its window up, by the 3 extents it moved.)
  for (size_t i : Fetched()) {
    if (i > ahead + 8) {
      EXPECT_TRUE(hops.count(i)) << "extent " << i << " fetched, never read";
    }
  }
}

TEST_F(ReadaheadTest, TheRecordedAccessListComesFirstAndReadaheadWaitsForIt) {
  store_->SetDelay(3ms);
  // The list: every 2nd extent, last first (long enough to outlast the
  // reader below on a quiet machine).
  std::vector<uint32_t> list;
  for (int i = kFiles - 2; i >= 0; i -= 2) list.push_back(static_cast<uint32_t>(i));
  layer_->Prefetch(list);
  // A sequential reader meanwhile: it gets its own extents (joining the
  // list's fetches where they meet) but no guesses while the list runs.
  for (size_t i = 0; i < 5; ++i) ReadExtent(i);
  LayerStats during = layer_->Stats();
  // (On a loaded machine the list may have ended first; then guesses may
  // follow, and there is nothing to say.)
  if (during.list_fetches + 3 < list.size()) {
    EXPECT_EQ(during.readahead_fetches, 0u);
  }
  Settle();
  std::set<size_t> fetched = Fetched();
  for (uint32_t i : list) EXPECT_TRUE(fetched.count(i)) << "listed extent " << i;
  LayerStats st = layer_->Stats();
  EXPECT_GE(st.list_fetches, list.size() - 3);  // extents 0, 2 and 4 may have been the reader's
  EXPECT_EQ(st.read_errors, 0u);
}

TEST_F(ReadaheadTest, AListOfExtentsOnTheNodesDiskIsReadAheadNotFetched) {
  std::vector<uint32_t> list;
  for (uint32_t i = 0; i < 40; ++i) list.push_back(i);
  layer_->Prefetch(list);  // a fresh node: fetched
  Settle();
  ASSERT_EQ(Fetched().size(), list.size());
  store_->ResetCounts();
  // The next mount's list, the chunks on the node's disk: nothing fetched,
  // every file read ahead (after the list was issued, on a worker).
  const uint64_t before = cache_->stats().disk_readaheads;
  layer_->Prefetch(list);
  Settle();
  EXPECT_TRUE(Fetched().empty());
  EXPECT_EQ(cache_->stats().disk_readaheads - before, list.size());
  for (size_t i = 0; i < 5; ++i) ReadExtent(i);
  EXPECT_EQ(layer_->Stats().read_errors, 0u);
}

TEST_F(ReadaheadTest, AStoreThatFailsReadaheadLeavesReadersTheirOwnErrorsOnly) {
  for (size_t i = 0; i < 4; ++i) ReadExtent(i);
  Settle();
  // The store goes down: readahead's fetches fail quietly, the reader's
  // own read fails clearly, and nothing bad is cached.
  store_->SetDown(true);
  const cache::Extent& e = manifest_.extents[100];
  std::string buf(e.length, '\0');
  auto n = layer_->ReadBlob(e.offset, buf);
  EXPECT_FALSE(n.ok());
  Settle();
  store_->SetDown(false);
  for (size_t i = 4; i < 30; ++i) ReadExtent(i);
  ReadExtent(100);
  Settle();
  EXPECT_EQ(layer_->Stats().read_errors, 1u);
}

}  // namespace
}  // namespace strata::lazyfs
