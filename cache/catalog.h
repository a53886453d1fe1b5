// Catalog: the layer catalogue kept in an ObjectStore — manifests, tags,
// REF resolution, layer stacks, access lists and leases. Store layout:
//
//   chunks/<2 hex>/<32 hex>      extents and metadata images (content-named)
//   layers/<digest>.json         manifests (canonical JSON)
//   layers/<digest>.access       recorded access list (last writer wins)
//   tags/<name>/<version>        tag records: digest, created, by
//   leases/<node>/<digest>       a node's claim that it has the layer mounted
//   settings.json                the store's defaults for writers (optional)
//
// Thread-safe as far as the store is.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cache/chunk_codec.h"
#include "cache/manifest.h"
#include "cache/object_store.h"

namespace strata::cache {

// A REF: "NAME:VERSION" or a layer digest (32 hex digits).
struct LayerRef {
  std::string name, version;  // empty for a digest
  Digest128 digest;           // valid when name is empty
  bool is_digest() const { return name.empty(); }
  std::string ToString() const;
};
Result<LayerRef> ParseRef(std::string_view text);
// "NAME:VERSION" only (for --tag).
Result<LayerRef> ParseTag(std::string_view text);

struct TagRecord {
  std::string name, version;
  Digest128 digest;
  std::string created;  // RFC 3339, UTC
  std::string by;       // user@host
};

struct Lease {
  std::string node;
  Digest128 digest;
  int64_t expires = 0;  // unix seconds
};

// What a store asks of everyone who writes to it; settings.json, e.g.
// {"compress": "zstd:1"}. A store without the object has the defaults.
struct StoreSettings {
  Compression compression;  // of the chunks pushed without --compress
};

// A layer of a resolved stack. The manifest is shared (Catalog::SharedManifest).
struct StackLayer {
  Digest128 digest;
  std::shared_ptr<const Manifest> manifest;
};

class Catalog {
 public:
  explicit Catalog(std::shared_ptr<ObjectStore> store) : store_(std::move(store)) {}

  ObjectStore& store() const { return *store_; }
  const std::shared_ptr<ObjectStore>& shared_store() const { return store_; }

  static std::string ManifestKey(const Digest128& digest);
  static std::string AccessKey(const Digest128& digest);
  static std::string TagKey(std::string_view name, std::string_view version);
  static std::string LeaseKey(std::string_view node, const Digest128& digest);

  // The digest a REF names; ENOENT (naming the REF and the store) when the
  // tag or the manifest does not exist.
  Result<Digest128> Resolve(const LayerRef& ref) const;
  Result<Digest128> Resolve(std::string_view ref) const;

  // Fetches the manifest and checks that it hashes to `digest`; `text`,
  // when given, receives it as stored (canonical JSON).
  Result<Manifest> GetManifest(const Digest128& digest, std::string* text = nullptr) const;
  // The same, parsed once per process: a manifest is named by its content,
  // so one parse serves every store and every caller. It stays while anyone
  // holds it, and the last kManifestsKept asked for besides. A layer of
  // 10,000 extents takes some 35 ms to parse and 350 KB to hold, which a
  // sandbox created or adopted with it would otherwise pay each time.
  Result<std::shared_ptr<const Manifest>> SharedManifest(const Digest128& digest) const;
  static constexpr size_t kManifestsKept = 16;
  Result<bool> HasManifest(const Digest128& digest) const;
  // Stores the manifest (idempotent) and returns its digest.
  Result<Digest128> PutManifest(const Manifest& manifest) const;

  Result<TagRecord> GetTag(std::string_view name, std::string_view version) const;
  // Points NAME:VERSION at `digest` (which must have a manifest), replacing
  // what it named before.
  Result<TagRecord> SetTag(std::string_view name, std::string_view version, const Digest128& digest) const;
  Status DeleteTag(std::string_view name, std::string_view version) const;
  // Every tag, or those of one name, sorted by name then version.
  Result<std::vector<TagRecord>> ListTags(std::string_view name = "") const;

  // Resolves --layer REFs (bottom first) into the full stack. A diff named
  // first brings its recorded parents; a diff named above other layers
  // requires them to be exactly its parents.
  Result<std::vector<StackLayer>> ResolveStack(const std::vector<std::string>& refs) const;

  // Access lists: extent indexes in first-touch order.
  Status PutAccessList(const Digest128& digest, const std::vector<uint32_t>& extents) const;
  Result<std::vector<uint32_t>> GetAccessList(const Digest128& digest) const;  // ENOENT when none

  // The store's settings; the defaults when it has none.
  Result<StoreSettings> GetSettings() const;
  Status PutSettings(const StoreSettings& settings) const;
  static constexpr const char* kSettingsKey = "settings.json";

  Status PutLease(const Lease& lease) const;
  Status DropLease(std::string_view node, const Digest128& digest) const;
  Result<std::vector<Lease>> ListLeases() const;

 private:
  std::shared_ptr<ObjectStore> store_;
};

// Names and versions: 1-128 of [A-Za-z0-9._-], not starting with '.' or '-'.
Status ValidateTagPart(std::string_view what, std::string_view value);
// Seconds since the epoch as RFC 3339 UTC ("2026-11-29T08:20:00Z").
std::string FormatTime(int64_t unix_seconds);
// "user@host" of this process.
std::string WhoAmI();

}  // namespace strata::cache
