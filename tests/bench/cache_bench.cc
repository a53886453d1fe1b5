// scripts/bench cache: the chunk cache against plain reads, in one run.
//  1. Warm reads: every byte of 256 x 1 MiB chunks through ChunkCache::Read
//     in 128 KiB pieces versus pread of one plain file with the same bytes.
//  2. Single flight: 64 threads each read the same 64 missing chunks through
//     one cache (store requests must be 64) versus the same reads straight
//     from the store with no cache, at 0 and 5 ms of added store latency.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "cache/chunk_cache.h"
#include "common/fs.h"
#include "common/strings.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/test_util.h"

namespace strata::bench {
namespace {


constexpr size_t kChunk = 1 << 20;
constexpr size_t kPiece = 128 << 10;

void WarmReads(Table& table) {
  const int kChunks = 256;
  TempDir dir = Check(TempDir::Create("strata-bench"));
  auto store = Check(cache::OpenStore("file://" + dir.Sub("store")));
  std::vector<Digest128> ids;
  std::string plain_path = dir.Sub("plain");
  UniqueFd plain = Check(OpenFile(plain_path, O_RDWR | O_CREAT, 0644));
  for (int i = 0; i < kChunks; ++i) {
    std::string data = testing::RandomBytes(kChunk, 1000 + i);
    ids.push_back(HashBytes(data));
    Check(store->Put(cache::ChunkKey(ids.back()), data));
    Check(PwriteFull(plain.get(), data, static_cast<uint64_t>(i) * kChunk));
  }
  cache::ChunkCacheOptions options;
  options.dir = dir.Sub("cache");
  auto cache = Check(cache::ChunkCache::Open(options));
  std::vector<char> buf(kPiece);
  auto through_cache = [&] {
    for (const auto& id : ids) {
      for (size_t off = 0; off < kChunk; off += kPiece) Check(cache->Read(id, store, off, buf));
    }
  };
  auto plain_pread = [&] {
    for (uint64_t off = 0; off < uint64_t{kChunks} * kChunk; off += kPiece) Check(PreadFull(plain.get(), buf, off));
  };
  through_cache();  // warm: fetch everything once
  plain_pread();
  ::sync();  // no writeback of the fresh chunk files during the timed reads
  std::vector<double> ours, base;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = Clock::now();
    through_cache();
    auto t1 = Clock::now();
    plain_pread();
    auto t2 = Clock::now();
    ours.push_back(kChunks / Seconds(t1 - t0));
    base.push_back(kChunks / Seconds(t2 - t1));
  }
  double o = Median(ours), b = Median(base);
  table.Add({"warm read, 256 MiB in 128 KiB reads", Fixed(o, 0) + " MiB/s", "pread of a plain file",
             Fixed(b, 0) + " MiB/s", Fixed(o / b, 2), ">= 0.90"});
}

void SingleFlight(Table& table, std::chrono::milliseconds latency) {
  const int kChunks = 64, kThreads = 64;
  TempDir dir = Check(TempDir::Create("strata-bench"));
  auto inner = Check(cache::OpenStore("file://" + dir.Sub("store")));
  std::vector<Digest128> ids;
  for (int i = 0; i < kChunks; ++i) {
    std::string data = testing::RandomBytes(kChunk, 5000 + i);
    ids.push_back(HashBytes(data));
    Check(inner->Put(cache::ChunkKey(ids.back()), data));
  }
  auto store = std::make_shared<testing::FaultyStore>(inner);
  store->SetDelay(latency);

  cache::ChunkCacheOptions options;
  options.dir = dir.Sub("cache");
  options.fetch_threads = kThreads;
  auto cache = Check(cache::ChunkCache::Open(options));
  std::atomic<int> errors{0};
  auto run = [&](auto&& read_one) {
    std::vector<std::thread> threads;
    auto t0 = Clock::now();
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<char> buf(kChunk);
        for (int i = 0; i < kChunks; ++i) {
          if (!read_one(ids[(i + t) % kChunks], buf)) ++errors;
        }
      });
    }
    for (auto& th : threads) th.join();
    return Seconds(Clock::now() - t0);
  };
  store->ResetCounts();
  double ours = run([&](const Digest128& id, std::vector<char>& buf) { return cache->Read(id, store, 0, buf).ok(); });
  int ours_requests = store->gets();
  store->ResetCounts();
  double base = run([&](const Digest128& id, std::vector<char>& buf) {
    return store->GetRange(cache::ChunkKey(id), 0, buf).ok();
  });
  int base_requests = store->gets();
  if (errors) std::fprintf(stderr, "cache_bench: %d reads failed\n", errors.load());
  std::string label = StrCat("64 threads x 64 missing 1 MiB chunks, store +", latency.count(), " ms");
  table.Add({label, StrCat(ours_requests, " requests, ", Fixed(ours * 1000, 0), " ms"), "no cache",
             StrCat(base_requests, " requests, ", Fixed(base * 1000, 0), " ms"), Fixed(base / ours, 2) + "x faster",
             "requests = 64"});
}

}  // namespace
}  // namespace strata::bench

static int Body() {
  using namespace strata::bench;
  Table table({"measure", "strata", "baseline", "baseline figure", "ratio", "target"});
  WarmReads(table);
  SingleFlight(table, std::chrono::milliseconds(0));
  SingleFlight(table, std::chrono::milliseconds(5));
  table.Print();
  return 0;
}

int main() {
  return strata::bench::BenchMain([&] { return Body(); });
}
