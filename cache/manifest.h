// Manifest: what a layer is, decided only by its content.
//
// A layer is an EROFS metadata image plus a data blob. The blob is cut into
// extents, one per distinct file chunk or group of small chunks side by
// side, each stored once under the XXH3-128 of its bytes. The manifest
// lists them with kind, name, parents and build facts — no times, no host
// names — and the layer's digest is the XXH3-128 of the manifest's
// canonical JSON, so one tree always gives one digest.
// docs/formats.md has the field-by-field description.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace strata::cache {

enum class LayerKind { kBase, kWorkspace, kToolkit, kDiff };
std::string_view LayerKindName(LayerKind kind);
Result<LayerKind> ParseLayerKind(std::string_view name);

// One stored piece of the blob: `length` bytes at blob offset `offset`
// (a multiple of the block size). The blob holds zeros from offset+length
// up to the next extent.
struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
  Digest128 hash;
};

struct Manifest {
  static constexpr int kSchema = 1;

  LayerKind kind = LayerKind::kBase;
  std::string name;
  std::vector<Digest128> parents;  // digests, bottom first; diffs only
  uint32_t chunk_size = 0;         // EROFS chunk size: the largest extent
  uint32_t block_size = 4096;
  Digest128 meta_hash;             // the metadata image, stored as a chunk
  uint64_t meta_size = 0;
  uint64_t blob_size = 0;
  std::vector<Extent> extents;     // by offset, non-overlapping
  // Build facts.
  uint64_t files = 0;              // inodes in the image
  uint64_t bytes = 0;              // sum of regular file sizes
  std::string source;              // XXH3-128 of the input archive; "" for a directory

  // Canonical JSON: sorted keys, no spaces. The digest is taken over it.
  std::string ToJson() const;
  static Result<Manifest> FromJson(std::string_view json);
  Digest128 Digest() const { return HashBytes(ToJson()); }

  // Checks the invariants readers rely on (extents sorted, inside the blob,
  // no longer than a chunk, parents only on diffs); names the broken one.
  Status Validate() const;

  // The extent containing blob offset `offset`, or nullptr when the offset
  // falls in padding between extents (reads as zeros) or past the end.
  const Extent* FindExtent(uint64_t offset) const;

  // Bytes of distinct stored data: the extents plus the metadata image.
  uint64_t StoredBytes() const;
};

}  // namespace strata::cache
