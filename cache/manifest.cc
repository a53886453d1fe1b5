// Manifest JSON and invariants.
#include "cache/manifest.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace strata::cache {

using nlohmann::json;

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kBase: return "base";
    case LayerKind::kWorkspace: return "workspace";
    case LayerKind::kToolkit: return "toolkit";
    case LayerKind::kDiff: return "diff";
  }
  return "base";
}

Result<LayerKind> ParseLayerKind(std::string_view name) {
  for (LayerKind k : {LayerKind::kBase, LayerKind::kWorkspace, LayerKind::kToolkit, LayerKind::kDiff}) {
    if (LayerKindName(k) == name) return k;
  }
  return Error(EINVAL, StrCat("layer kind ", Quote(name), ": expected base, workspace, toolkit or diff"));
}

std::string Manifest::ToJson() const {
  // Extents as compact [offset, length, "hash"] triples: a large image has
  // hundreds of thousands of them.
  json extents_json = json::array();
  for (const auto& e : extents) extents_json.push_back(json::array({e.offset, e.length, e.hash.Hex()}));
  json parents_json = json::array();
  for (const auto& p : parents) parents_json.push_back(p.Hex());
  json j = {
      {"schema", kSchema},
      {"kind", LayerKindName(kind)},
      {"name", name},
      {"parents", parents_json},
      {"chunk_size", chunk_size},
      {"block_size", block_size},
      {"meta", {{"hash", meta_hash.Hex()}, {"size", meta_size}}},
      {"blob", {{"size", blob_size}, {"extents", extents_json}}},
      {"build", {{"files", files}, {"bytes", bytes}, {"source", source}}},
  };
  return j.dump();  // nlohmann's object keeps keys sorted: canonical
}

namespace {

Result<Digest128> DigestField(const json& j, std::string_view what) {
  if (!j.is_string()) return Error(EINVAL, StrCat("manifest: ", what, " is not a string"));
  auto d = Digest128::FromHex(j.get_ref<const std::string&>());
  if (!d) return Error(EINVAL, StrCat("manifest: ", what, " is not 32 hex digits"));
  return *d;
}

}  // namespace

Result<Manifest> Manifest::FromJson(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Error(EINVAL, "manifest: not a JSON object");
  Manifest m;
  try {
    int schema = j.at("schema").get<int>();
    if (schema != kSchema) {
      return Error(ENOTSUP, StrCat("manifest: schema ", schema, " is not supported (this strata reads ", kSchema, ")"));
    }
    STRATA_ASSIGN_OR_RETURN(m.kind, ParseLayerKind(j.at("kind").get<std::string>()));
    m.name = j.at("name").get<std::string>();
    for (const auto& p : j.at("parents")) {
      STRATA_ASSIGN_OR_RETURN(Digest128 d, DigestField(p, "parent"));
      m.parents.push_back(d);
    }
    m.chunk_size = j.at("chunk_size").get<uint32_t>();
    m.block_size = j.at("block_size").get<uint32_t>();
    STRATA_ASSIGN_OR_RETURN(m.meta_hash, DigestField(j.at("meta").at("hash"), "meta.hash"));
    m.meta_size = j.at("meta").at("size").get<uint64_t>();
    const json& blob = j.at("blob");
    m.blob_size = blob.at("size").get<uint64_t>();
    const json& extents = blob.at("extents");
    if (!extents.is_array()) return Error(EINVAL, "manifest: blob.extents is not an array");
    m.extents.reserve(extents.size());
    for (const auto& e : extents) {
      if (!e.is_array() || e.size() != 3) return Error(EINVAL, "manifest: an extent is not [offset, length, hash]");
      STRATA_ASSIGN_OR_RETURN(Digest128 h, DigestField(e[2], "extent hash"));
      m.extents.push_back({e[0].get<uint64_t>(), e[1].get<uint64_t>(), h});
    }
    const json& build = j.at("build");
    m.files = build.at("files").get<uint64_t>();
    m.bytes = build.at("bytes").get<uint64_t>();
    m.source = build.at("source").get<std::string>();
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("manifest: ", e.what()));
  }
  STRATA_RETURN_IF_ERROR(m.Validate());
  return m;
}

Status Manifest::Validate() const {
  if (block_size < 512 || (block_size & (block_size - 1))) {
    return Error(EINVAL, StrCat("manifest: block size ", block_size, " is not a power of two >= 512"));
  }
  if (chunk_size < block_size || (chunk_size & (chunk_size - 1))) {
    return Error(EINVAL, StrCat("manifest: chunk size ", chunk_size, " is not a power of two >= the block size"));
  }
  if (kind != LayerKind::kDiff && !parents.empty()) {
    return Error(EINVAL, StrCat("manifest: a ", LayerKindName(kind), " layer cannot have parents"));
  }
  if (blob_size % block_size) return Error(EINVAL, "manifest: blob size is not a multiple of the block size");
  uint64_t end = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    if (e.length == 0 || e.length > chunk_size) {
      return Error(EINVAL, StrCat("manifest: extent ", i, " has length ", e.length, " (chunk size ", chunk_size, ")"));
    }
    if (e.offset % block_size || e.offset < end || e.offset + e.length > blob_size) {
      return Error(EINVAL, StrCat("manifest: extent ", i, " at offset ", e.offset, " overlaps, is unaligned or lies past the blob"));
    }
    end = e.offset + e.length;
  }
  return OkStatus();
}

const Extent* Manifest::FindExtent(uint64_t offset) const {
  auto it = std::upper_bound(extents.begin(), extents.end(), offset,
                             [](uint64_t off, const Extent& e) { return off < e.offset; });
  if (it == extents.begin()) return nullptr;
  --it;
  return offset < it->offset + it->length ? &*it : nullptr;
}

uint64_t Manifest::StoredBytes() const {
  uint64_t total = meta_size;
  for (const auto& e : extents) total += e.length;
  return total;
}

}  // namespace strata::cache
