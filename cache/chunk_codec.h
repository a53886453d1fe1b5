// How content-named objects (extents and metadata images) sit in a store:
// either their exact bytes, or one zstd frame of them. The name is always
// the XXH3-128 of the uncompressed bytes, so dedup, manifests and layer
// digests do not depend on the encoding (docs/formats.md, "Objects").
//
// A reader tells the two apart by checking, not by a flag: an object that
// starts with the zstd frame magic is decoded, and kept when what comes out
// hashes to the name; otherwise the object's own bytes must hash to the
// name (a raw chunk may begin with any bytes, the magic included). Anything
// that fails both ways is corrupt, never data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cache/object_store.h"
#include "common/hash.h"
#include "common/status.h"

namespace strata::cache {

struct Compression {
  bool zstd = true;
  int level = 1;
  // "none" or "zstd:LEVEL".
  std::string ToString() const;
  friend bool operator==(const Compression&, const Compression&) = default;
};

// "none", "zstd" (level 1) or "zstd:LEVEL" (1-19); the error names the text.
Result<Compression> ParseCompression(std::string_view text);

// The bytes to store for a chunk: a zstd frame of `raw` when compression is
// on and the frame is at least 1/32 smaller; nullopt to store `raw` itself.
// Thread-safe (one compression context per thread).
std::optional<std::string> CompressChunk(std::string_view raw, const Compression& compression);

struct DecodedChunk {
  std::string bytes;         // the chunk itself, checked against its name
  uint64_t stored_size = 0;  // the object's size in the store
  bool compressed = false;
};

// Turns a stored object back into the chunk named `id` (see the top of this
// file); EBADMSG when it is neither. `size`, when not 0, is the chunk's
// size (an extent's length, a metadata image's size, from the manifest):
// anything else is corrupt, and a frame claiming more is refused before
// anything is allocated. Unknown sizes are bounded by kMaxChunkObject.
Result<DecodedChunk> DecodeChunk(const Digest128& id, std::string stored, uint64_t size = 0);

// Get + DecodeChunk; errors name the chunk and the store.
Result<DecodedChunk> GetChunk(ObjectStore& store, const Digest128& id, uint64_t size = 0);

// The largest chunk object a reader accepts when it does not know the size.
inline constexpr uint64_t kMaxChunkObject = uint64_t{1} << 30;

}  // namespace strata::cache
