// scripts/bench stores: the remote stores against the curl command, in one run.
//  1. Cold fetch: 256 x 1 MiB objects through a fresh ChunkCache (fetched,
//     hashed, written, indexed) from nginx on loopback, 8 readers and 8
//     fetch threads, versus `curl --parallel --parallel-max 8` writing the
//     same objects to files. Median of 5 runs each, alternating, after one
//     warm-up fetch (server page cache, connections).
//  2. The same against s3rver, both sides signing with SigV4.
//  3. 4 KiB range reads at random offsets, 8 threads, requests per second,
//     versus curl --parallel doing the same ranges.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "cache/chunk_cache.h"
#include "cache/s3_store.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/store_servers.h"
#include "tests/testing/test_util.h"

namespace strata::bench {
namespace {


constexpr int kObjects = 256;
constexpr size_t kObjectSize = 1 << 20;
constexpr int kParallel = 8;
constexpr int kReps = 5;
constexpr int kRangeReads = 4000;
constexpr size_t kRange = 4096;

struct Target {
  std::string name;  // "nginx", "s3rver"
  std::shared_ptr<cache::ObjectStore> store;
  std::string object_base;             // URL the curl command fetches <base><key> from
  std::vector<std::string> curl_args;  // signing flags for curl
};

// Ours: every object through a fresh cache from kParallel reader threads.
double CacheColdFetch(const Target& t, const std::vector<Digest128>& ids) {
  TempDir dir = Check(TempDir::Create("strata-bench"));
  cache::ChunkCacheOptions options;
  options.dir = dir.Sub("cache");
  options.fetch_threads = kParallel;
  auto cache = Check(cache::ChunkCache::Open(options));
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  auto t0 = Clock::now();
  for (int r = 0; r < kParallel; ++r) {
    threads.emplace_back([&, r] {
      for (size_t i = r; i < ids.size(); i += kParallel) {
        auto h = cache->Get(ids[i], t.store);
        if (!h.ok()) {
          std::fprintf(stderr, "stores_bench: %s\n", h.status().ToString().c_str());
          ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  double secs = Seconds(Clock::now() - t0);
  if (errors) Check(Error(EIO, StrCat(errors.load(), " fetches failed")));
  cache->WaitForFetches();
  return secs;
}

// The curl command on a config file of (url, output[, range]) entries.
double CurlParallel(const Target& t, const std::vector<std::string>& keys, const std::vector<std::string>& ranges,
                    bool to_files) {
  TempDir dir = Check(TempDir::Create("strata-bench"));
  std::string config;
  for (size_t i = 0; i < keys.size(); ++i) {
    config += StrCat("url = \"", t.object_base, keys[i], "\"\n");
    config += StrCat("output = \"", to_files ? dir.Sub(StrCat("o", i)) : "/dev/null", "\"\n");
    if (!ranges.empty()) config += StrCat("range = ", ranges[i], "\n");
  }
  Check(WriteFileAtomic(dir.Sub("curl.cfg"), config, false));
  SubprocessOptions options;
  options.argv = {"curl", "--silent", "--show-error", "--fail", "--parallel", "--parallel-max",
                  std::to_string(kParallel), "--config", dir.Sub("curl.cfg")};
  for (const auto& a : t.curl_args) options.argv.push_back(a);
  auto t0 = Clock::now();
  Check(RunChecked(std::move(options), "curl baseline").status());
  return Seconds(Clock::now() - t0);
}

double RangeReads(const Target& t, const std::vector<std::string>& keys, const std::vector<uint64_t>& offsets) {
  std::atomic<size_t> next{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  auto t0 = Clock::now();
  for (int r = 0; r < kParallel; ++r) {
    threads.emplace_back([&] {
      std::vector<char> buf(kRange);
      for (size_t i; (i = next++) < keys.size();) {
        auto n = t.store->GetRange(keys[i], offsets[i], buf);
        if (!n.ok() || *n != kRange) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  double secs = Seconds(Clock::now() - t0);
  if (errors) Check(Error(EIO, StrCat(errors.load(), " range reads failed")));
  return secs;
}

void Measure(Table& table, const Target& t, const std::vector<Digest128>& ids) {
  std::vector<std::string> keys;
  for (const auto& id : ids) keys.push_back(cache::ChunkKey(id));
  std::vector<double> ours, base;
  CacheColdFetch(t, ids);  // warm the server's page cache and connections alike
  for (int rep = 0; rep < kReps; ++rep) {
    ours.push_back(CacheColdFetch(t, ids));
    base.push_back(CurlParallel(t, keys, {}, true));
  }
  double o = kObjects / Median(ours), b = kObjects / Median(base);
  table.Add({StrCat("cold fetch 256 x 1 MiB via ChunkCache, ", t.name, ", ", kParallel, " parallel"),
             Fixed(o, 0) + " MiB/s", StrCat("curl --parallel-max ", kParallel), Fixed(b, 0) + " MiB/s",
             Fixed(o / b, 2), ">= 0.95"});

  std::mt19937_64 rng(42);
  std::vector<std::string> range_keys, ranges;
  std::vector<uint64_t> offsets;
  for (int i = 0; i < kRangeReads; ++i) {
    range_keys.push_back(keys[rng() % keys.size()]);
    offsets.push_back(rng() % (kObjectSize - kRange));
    ranges.push_back(StrCat(offsets.back(), "-", offsets.back() + kRange - 1));
  }
  std::vector<double> rours, rbase;
  for (int rep = 0; rep < kReps; ++rep) {
    rours.push_back(RangeReads(t, range_keys, offsets));
    rbase.push_back(CurlParallel(t, range_keys, ranges, false));
  }
  double ro = kRangeReads / Median(rours), rb = kRangeReads / Median(rbase);
  table.Add({StrCat("4 KiB range reads, ", t.name, ", ", kParallel, " threads"), Fixed(ro, 0) + " req/s",
             StrCat("curl --parallel-max ", kParallel), Fixed(rb, 0) + " req/s", Fixed(ro / rb, 2), "-"});
}

}  // namespace
}  // namespace strata::bench

static int Body(int argc, char** argv) {
  // Optional argument: "nginx" or "s3rver" to run one back end only.
  std::string only = argc > 1 ? argv[1] : "";
  using namespace strata::bench;
  namespace cache = strata::cache;
  using strata::Digest128;
  using strata::StrCat;
  std::vector<std::string> data;
  std::vector<Digest128> ids;
  for (int i = 0; i < kObjects; ++i) {
    data.push_back(strata::testing::RandomBytes(kObjectSize, 9000 + i));
    ids.push_back(strata::HashBytes(data.back()));
  }
  Table table({"measure", "strata", "baseline", "baseline figure", "ratio", "target"});

  if (only.empty() || only == "nginx") {
    auto nginx = Check(strata::testing::NginxServer::Start());
    Target t{"nginx", Check(cache::OpenStore(nginx->url() + "/bench")), nginx->url() + "/bench/", {}};
    for (int i = 0; i < kObjects; ++i) Check(t.store->Put(cache::ChunkKey(ids[i]), data[i]));
    Measure(table, t, ids);
  }

  if (!only.empty() && only != "s3rver") {
  } else if (!strata::testing::S3rverServer::Find()) {
    std::fprintf(stderr, "stores_bench: s3rver is not installed (run scripts/setup); skipping the S3 rows\n");
  } else {
    auto s3 = Check(strata::testing::S3rverServer::Start({"bench"}));
    ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
    Target t{"s3rver",
             Check(cache::OpenStore(StrCat("s3://bench/p?endpoint=", s3->endpoint()))),
             s3->endpoint() + "/bench/p/",
             {"--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "S3RVER:S3RVER", "--header",
              StrCat("x-amz-content-sha256: ", cache::kEmptyPayloadSha256)}};
    for (int i = 0; i < kObjects; ++i) Check(t.store->Put(cache::ChunkKey(ids[i]), data[i]));
    Measure(table, t, ids);
  }
  table.Print();
  return 0;
}

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return Body(argc, argv); });
}
