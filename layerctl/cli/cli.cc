// What the layerctl verbs share.
#include "layerctl/cli/cli.h"

#include <cstdio>
#include <iostream>

#include "common/strings.h"
#include "common/units.h"

namespace strata::layerctl::cli {

using nlohmann::json;

Result<cache::Catalog> Cli::OpenCatalog() const {
  STRATA_ASSIGN_OR_RETURN(auto store, cache::OpenStore(cache::DefaultStoreUrl(store_url)));
  return cache::Catalog(store);
}

int Fail(const Status& s) {
  std::fprintf(stderr, "layerctl: %s\n", s.ToString().c_str());
  return 1;
}

Result<PushOptions> ParsePushOptions(const std::string& compress) {
  PushOptions options;
  if (!compress.empty()) {
    auto c = cache::ParseCompression(compress);
    if (!c.ok()) return c.status().Annotate("--compress");
    options.compression = *c;
  }
  return options;
}

Result<std::optional<cache::LayerRef>> ParseOptionalTag(const std::string& tag) {
  if (tag.empty()) return std::optional<cache::LayerRef>();
  STRATA_ASSIGN_OR_RETURN(auto t, cache::ParseTag(tag));
  return std::optional<cache::LayerRef>(std::move(t));
}

void PrintPush(const PushReport& r, const std::optional<cache::LayerRef>& tag, bool as_json) {
  if (as_json) {
    json j = {{"digest", r.digest.Hex()},         {"chunks", r.chunks},
              {"chunks_uploaded", r.chunks_uploaded}, {"bytes_uploaded", r.bytes_uploaded},
              {"bytes_sent", r.bytes_sent},           {"chunks_compressed", r.chunks_compressed},
              {"compress", r.compression.ToString()},
              {"chunks_present", r.chunks_present},   {"bytes_present", r.bytes_present}};
    if (tag) j["tag"] = tag->ToString();
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << r.digest.Hex() << "\n";
  std::fprintf(stderr, "uploaded %s in %llu chunks (%s sent, %s), %s already present in %llu chunks%s\n",
               FormatBytes(r.bytes_uploaded).c_str(), static_cast<unsigned long long>(r.chunks_uploaded),
               FormatBytes(r.bytes_sent).c_str(), r.compression.ToString().c_str(),
               FormatBytes(r.bytes_present).c_str(), static_cast<unsigned long long>(r.chunks_present),
               tag ? (", tagged " + tag->ToString()).c_str() : "");
}

json ManifestSummary(const Digest128& digest, const cache::Manifest& m) {
  json parents = json::array();
  for (const auto& p : m.parents) parents.push_back(p.Hex());
  return {{"digest", digest.Hex()},    {"kind", cache::LayerKindName(m.kind)},
          {"name", m.name},            {"parents", parents},
          {"chunk_size", m.chunk_size}, {"meta_size", m.meta_size},
          {"blob_size", m.blob_size},  {"extents", m.extents.size()},
          {"stored_bytes", m.StoredBytes()}, {"files", m.files},
          {"bytes", m.bytes},          {"source", m.source}};
}

}  // namespace strata::layerctl::cli
