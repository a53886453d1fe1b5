// Moving layers between a layer directory and a store: push, pull, verify.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cache/catalog.h"
#include "cache/chunk_codec.h"
#include "layerctl/builder.h"

namespace strata::layerctl {

struct PushOptions {
  size_t parallel = 16;  // uploads (and their compression) at a time
  // nullopt: the store's default (Catalog::GetSettings).
  std::optional<cache::Compression> compression;
};

struct PushReport {
  Digest128 digest;
  cache::Compression compression;
  uint64_t chunks = 0;          // distinct chunks (extents + metadata image)
  uint64_t chunks_uploaded = 0;
  uint64_t bytes_uploaded = 0;  // the uploaded chunks' own bytes, manifest and tag excluded
  uint64_t bytes_sent = 0;      // what the store received for them (compressed or not)
  uint64_t chunks_compressed = 0;
  uint64_t chunks_present = 0;
  uint64_t bytes_present = 0;
};

// Publishes a built layer: missing chunks first, then the metadata image,
// then the manifest, then (when given) the tag, so nobody ever resolves a
// half-published layer. Chunks already in the store are not sent again
// (whatever their encoding), so a push that failed half-way resumes where
// it stopped. Each chunk is compressed by the worker that uploads it. A
// diff's parents must already be published.
Result<PushReport> Push(const BuiltLayer& layer, const cache::Catalog& catalog,
                        const std::optional<cache::LayerRef>& tag, const PushOptions& options = {});

struct PullReport {
  Digest128 digest;
  cache::Manifest manifest;
  uint64_t bytes = 0;
};

// Writes the layer's meta.img, blob.img and manifest.json into `out_dir`
// (the files `build -o` writes), checking every chunk against its name.
Result<PullReport> Pull(const cache::Catalog& catalog, const Digest128& digest, const std::string& out_dir,
                        size_t parallel = 16);

struct LayerVerifyReport {
  Digest128 digest;
  uint64_t chunks = 0;
  uint64_t bytes = 0;         // the chunks' own bytes
  uint64_t stored_bytes = 0;  // as the store holds them
  uint64_t compressed = 0;    // chunks stored as zstd frames
  std::vector<std::string> problems;  // one line per missing or corrupt chunk, or fsck's verdict
  bool ok() const { return problems.empty(); }
};

// Fetches every chunk, decodes it (raw or zstd) and checks its hash, then
// assembles the image and runs fsck.erofs on it.
Result<LayerVerifyReport> Verify(const cache::Catalog& catalog, const Digest128& digest, size_t parallel = 16);

}  // namespace strata::layerctl
