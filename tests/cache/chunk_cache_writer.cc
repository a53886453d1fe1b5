// Test helper: fills a chunk cache from a store until killed.
//   chunk_cache_writer CACHE_DIR STORE_URL CAPACITY_BYTES SEED
#include <cstdio>
#include <cstdlib>
#include <random>

#include "cache/chunk_cache.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: chunk_cache_writer CACHE_DIR STORE_URL CAPACITY SEED\n");
    return 2;
  }
  auto store = strata::cache::OpenStore(argv[2]);
  if (!store.ok()) return 1;
  auto objects = strata::cache::ListAll(**store, "chunks/");
  if (!objects.ok() || objects->empty()) return 1;
  strata::cache::ChunkCacheOptions options;
  options.dir = argv[1];
  options.capacity_bytes = std::strtoull(argv[3], nullptr, 10);
  options.fetch_threads = 4;
  auto cache = strata::cache::ChunkCache::Open(options);
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.status().ToString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::mt19937 rng(static_cast<unsigned>(std::atoi(argv[4])));
  char buf[4096];
  while (true) {
    const auto& key = (*objects)[rng() % objects->size()].key;
    auto id = strata::Digest128::FromHex(key.substr(key.rfind('/') + 1));
    auto n = (*cache)->Read(*id, *store, 0, buf);
    if (!n.ok()) {
      std::fprintf(stderr, "%s\n", n.status().ToString().c_str());
      return 1;
    }
  }
}
