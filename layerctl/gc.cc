// Two-pass mark-and-sweep with a grace period over a store.
#include "layerctl/gc.h"

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "common/log.h"
#include "common/strings.h"

namespace strata::layerctl {
namespace {

constexpr const char* kStateKey = "gc/state.json";

// Object kinds gc manages; tags, leases and its own state are not collected.
bool Collectable(const std::string& key) { return key.starts_with("chunks/") || key.starts_with("layers/"); }

}  // namespace

Result<GcReport> CollectGarbage(const cache::Catalog& catalog, const GcOptions& options) {
  cache::ObjectStore& store = catalog.store();
  const int64_t now = options.now ? options.now : static_cast<int64_t>(::time(nullptr));
  GcReport report;

  // Mark: roots, then parents, then what each reachable layer names.
  std::vector<Digest128> pending;
  STRATA_ASSIGN_OR_RETURN(auto tags, catalog.ListTags());
  for (const auto& t : tags) pending.push_back(t.digest);
  STRATA_ASSIGN_OR_RETURN(auto leases, catalog.ListLeases());
  for (const auto& l : leases) {
    if (l.expires > now) {
      pending.push_back(l.digest);
      ++report.leased_layers;
    }
  }
  std::unordered_set<std::string> live;
  std::unordered_set<Digest128, Digest128Hash> layers;
  while (!pending.empty()) {
    Digest128 d = pending.back();
    pending.pop_back();
    if (!layers.insert(d).second) continue;
    live.insert(cache::Catalog::ManifestKey(d));
    live.insert(cache::Catalog::AccessKey(d));
    auto m = catalog.GetManifest(d);
    if (!m.ok()) {
      // A tag or lease naming a missing layer keeps nothing else alive, but a
      // manifest we cannot read might name chunks: stop rather than guess.
      if (m.status().code() == ENOENT) continue;
      return m.status().Annotate("gc: read a reachable manifest");
    }
    live.insert(cache::ChunkKey(m->meta_hash));
    for (const auto& e : m->extents) live.insert(cache::ChunkKey(e.hash));
    for (const auto& p : m->parents) pending.push_back(p);
  }
  report.reachable_layers = layers.size();

  // Sweep, against the record of when each object was first unreachable.
  std::map<std::string, int64_t> state;
  auto text = store.Get(kStateKey);
  if (text.ok()) {
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_object() && j.contains("unreachable_since") && j["unreachable_since"].is_object()) {
      for (auto& [k, v] : j["unreachable_since"].items()) {
        if (v.is_number_integer()) state[k] = v.get<int64_t>();
      }
    }
  } else if (text.status().code() != ENOENT) {
    return text.status().Annotate("gc: read " + std::string(kStateKey));
  }

  std::vector<cache::ObjectInfo> doomed_layers, doomed_chunks;
  std::map<std::string, int64_t> next_state;
  for (const char* prefix : {"layers/", "chunks/"}) {
    STRATA_ASSIGN_OR_RETURN(auto objects, cache::ListAll(store, prefix));
    for (auto& o : objects) {
      if (!Collectable(o.key)) continue;
      ++report.objects_scanned;
      if (live.count(o.key)) continue;
      auto it = state.find(o.key);
      int64_t since = it == state.end() ? now : it->second;
      if (it == state.end()) ++report.newly_unreachable;
      if (now - since >= options.grace_seconds) {
        (o.key.starts_with("layers/") ? doomed_layers : doomed_chunks).push_back(o);
      } else {
        ++report.waiting;
        next_state[o.key] = since;
      }
    }
  }
  // Manifests first: a reader that still finds a manifest finds its chunks.
  for (const auto* list : {&doomed_layers, &doomed_chunks}) {
    for (const auto& o : *list) {
      if (options.dry_run) {
        report.deleted_keys.push_back(o.key);
      } else {
        Status s = store.Delete(o.key);
        if (!s.ok()) return s.Annotate("gc: delete");
      }
      ++report.deleted;
      report.bytes_deleted += o.size;
    }
  }
  if (!options.dry_run) {
    nlohmann::json since = nlohmann::json::object();
    for (const auto& [k, v] : next_state) since[k] = v;
    nlohmann::json j = {{"schema", 1}, {"unreachable_since", since}};
    STRATA_RETURN_IF_ERROR(store.Put(kStateKey, j.dump()).Annotate("gc: write " + std::string(kStateKey)));
  }
  return report;
}

}  // namespace strata::layerctl
