// ServedLayer: one layer as lazyfs serves it — its metadata image and its
// blob as byte ranges, read through the node's chunk cache.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cache/chunk_cache.h"
#include "cache/manifest.h"
#include "cache/object_store.h"

namespace strata::lazyfs {

struct LayerStats {
  uint64_t image_bytes = 0;        // metadata image + blob
  uint64_t meta_bytes = 0;
  uint64_t blob_bytes = 0;
  uint64_t stored_bytes = 0;       // distinct extent bytes + metadata image
  uint64_t bytes_fetched = 0;      // from the store by reads of this layer
  uint64_t bytes_from_cache = 0;   // served from chunks already on the node
  uint64_t chunks_fetched = 0;
  uint64_t extents_touched = 0;
  uint64_t bytes_touched = 0;      // distinct extent bytes read so far
  double blob_fetched_percent = 0; // bytes_touched / blob_bytes
  double fetch_p50_ms = 0, fetch_p99_ms = 0;
  uint64_t read_errors = 0;
};

class ServedLayer {
 public:
  ServedLayer(Digest128 digest, cache::Manifest manifest, std::shared_ptr<cache::ObjectStore> store,
              cache::ChunkCache& cache);

  // Fetches the metadata image (whole) into the cache and pins it.
  Status Load();

  const Digest128& digest() const { return digest_; }
  const cache::Manifest& manifest() const { return manifest_; }
  const std::shared_ptr<cache::ObjectStore>& store() const { return store_; }

  // Reads [offset, offset+out.size()) of the metadata image or the blob;
  // short only at the end. Blob bytes between extents read as zeros. A chunk
  // that cannot be had within the cache's deadline, or that is corrupt, is
  // an error (the FUSE layer answers EIO). Thread-safe.
  Result<size_t> ReadMeta(uint64_t offset, std::span<char> out);
  Result<size_t> ReadBlob(uint64_t offset, std::span<char> out);

  // Queues background fetches of the listed extents (indexes into the
  // manifest's extents), in order.
  void Prefetch(const std::vector<uint32_t>& extents);

  // Extent indexes in the order this layer first read them.
  std::vector<uint32_t> AccessOrder() const;
  LayerStats Stats() const;

 private:
  void NoteRead(size_t index, const cache::ChunkCache::Handle& h, uint64_t bytes, double fetch_ms);

  const Digest128 digest_;
  const cache::Manifest manifest_;
  const std::shared_ptr<cache::ObjectStore> store_;
  cache::ChunkCache& cache_;
  cache::ChunkCache::Handle meta_;

  std::unique_ptr<std::atomic<bool>[]> touched_;
  std::atomic<uint64_t> bytes_fetched_{0}, bytes_from_cache_{0}, chunks_fetched_{0};
  std::atomic<uint64_t> extents_touched_{0}, bytes_touched_{0}, read_errors_{0};
  mutable std::mutex mu_;                 // guards the two below
  std::vector<uint32_t> access_order_;
  std::vector<double> fetch_ms_;          // the latest fetch latencies (a ring)
  size_t fetch_ms_next_ = 0;
};

}  // namespace strata::lazyfs
