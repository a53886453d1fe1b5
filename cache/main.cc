// cachectl: operator commands for a node's chunk cache.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cache/chunk_cache.h"
#include "common/strings.h"
#include "common/units.h"

namespace {

using strata::cache::ChunkCache;

int Fail(const strata::Status& s) {
  std::fprintf(stderr, "cachectl: %s\n", s.ToString().c_str());
  return 1;
}

std::unique_ptr<ChunkCache> OpenOrDie(const std::string& dir, int* rc) {
  strata::cache::ChunkCacheOptions options;
  options.dir = dir;
  options.capacity_bytes = 0;  // inspecting must never evict
  options.fetch_threads = 1;
  auto cache = ChunkCache::Open(options);
  if (!cache.ok()) {
    *rc = Fail(cache.status());
    return nullptr;
  }
  return std::move(*cache);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cachectl: inspect, check and shrink a node's chunk cache"};
  app.require_subcommand(1);
  app.fallthrough();  // --cache and --json also after the verb
  std::string dir = "/var/lib/strata/cache";
  bool json = false;
  app.add_option("--cache", dir, "cache directory")->capture_default_str();
  app.add_flag("--json", json, "print JSON");

  auto* stats = app.add_subcommand("stats", "chunks and bytes held");
  auto* verify = app.add_subcommand("verify", "re-hash every chunk; remove the corrupt ones");
  auto* gc = app.add_subcommand("gc", "evict least recently used chunks down to a size");
  std::string size_text;
  gc->add_option("--size", size_text, "size to shrink to, e.g. 20G")->required();
  auto* fetch = app.add_subcommand("fetch", "fetch chunks into the cache (warm a node), checking each");
  std::string store_url;
  std::vector<std::string> ids;
  fetch->add_option("--store", store_url,
                    "store URL: file:///path, http(s)://host/prefix or s3://bucket/prefix "
                    "(default: $STRATA_STORE, else /var/lib/strata/store)");
  fetch->add_option("ID", ids, "chunk names (32 hex digits)")->required();
  CLI11_PARSE(app, argc, argv);

  int rc = 0;
  auto cache = OpenOrDie(dir, &rc);
  if (!cache) return rc;

  if (stats->parsed()) {
    auto usage = cache->Usage();
    if (!usage.ok()) return Fail(usage.status());
    if (json) {
      std::cout << nlohmann::json{{"dir", dir}, {"chunks", usage->chunks}, {"bytes", usage->bytes}}.dump() << "\n";
    } else {
      std::cout << "cache   " << dir << "\nchunks  " << usage->chunks << "\nbytes   " << usage->bytes << " ("
                << strata::FormatBytes(usage->bytes) << ")\n";
    }
    return 0;
  }
  if (verify->parsed()) {
    auto report = cache->Verify();
    if (!report.ok()) return Fail(report.status());
    if (json) {
      std::cout << nlohmann::json{{"checked", report->checked},
                                  {"bytes", report->bytes},
                                  {"corrupt", report->corrupt},
                                  {"missing", report->missing}}
                       .dump()
                << "\n";
    } else {
      std::cout << "checked " << report->checked << " chunks (" << strata::FormatBytes(report->bytes)
                << "), removed " << report->corrupt << " corrupt, dropped " << report->missing << " missing\n";
    }
    return report->corrupt ? 2 : 0;
  }
  if (fetch->parsed()) {
    auto store = strata::cache::OpenStore(strata::cache::DefaultStoreUrl(store_url));
    if (!store.ok()) return Fail(store.status());
    nlohmann::json out = nlohmann::json::array();
    for (const auto& text : ids) {
      auto id = strata::Digest128::FromHex(text);
      if (!id) return Fail(strata::Error(EINVAL, "chunk name " + strata::Quote(text) + ": expected 32 hex digits"));
      bool was_cached = cache->Contains(*id);
      auto handle = cache->Get(*id, *store);
      if (!handle.ok()) return Fail(handle.status());
      const char* how = was_cached ? "cached" : "fetched";
      if (json) out.push_back({{"id", text}, {"size", handle->size()}, {"source", how}});
      else std::cout << text << " " << handle->size() << " " << how << "\n";
    }
    if (json) std::cout << out.dump() << "\n";
    return 0;
  }
  if (gc->parsed()) {
    auto target = strata::ParseSize(size_text);
    if (!target.ok()) return Fail(target.status());
    auto before = cache->Usage();
    strata::Status s = cache->Trim(*target);
    if (!s.ok()) return Fail(s);
    auto after = cache->Usage();
    if (before.ok() && after.ok()) {
      std::cout << "evicted " << (before->chunks - after->chunks) << " chunks ("
                << strata::FormatBytes(before->bytes - after->bytes) << "); " << after->chunks << " chunks ("
                << strata::FormatBytes(after->bytes) << ") remain\n";
    }
    return 0;
  }
  return 0;
}
