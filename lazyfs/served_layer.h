// ServedLayer: one layer as lazyfs serves it — its metadata image and its
// blob as byte ranges, read through the node's chunk cache.
//
// Readahead: a reader that walks the blob in order (extent after extent)
// gets the next extents fetched ahead of it in the background, in a window
// that opens at 2 extents on its second dense step in a row and doubles
// with every further one, up to 64 extents or 32 MiB of blob. A step is
// dense when no extent before it is left unread; the last 4 may be read
// late (readers side by side, requests answered out of order) and still
// count. A reader that hops forward over extents it never reads (an import
// reading some of a directory's files) keeps its stream but not its
// window, which opens again only after two dense steps. At most 8 such
// fetches per layer run at once, and the chunk cache runs at most its
// background share (DaemonOptions::prefetch_threads) for the whole node, all
// behind every waiting read. A reader that jumps away starts a new stream;
// the old one is never fetched past its window and stops being topped up
// once idle. While a recorded access list is being prefetched the layer does
// no readahead: the list knows better than a guess.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cache/chunk_cache.h"
#include "cache/manifest.h"
#include "cache/object_store.h"
#include "lazyfs/layer_record.h"

namespace strata::lazyfs {

struct LayerStats {
  uint64_t image_bytes = 0;        // metadata image + blob
  uint64_t meta_bytes = 0;
  uint64_t blob_bytes = 0;
  uint64_t stored_bytes = 0;       // distinct extent bytes + metadata image
  uint64_t meta_bytes_fetched = 0; // the metadata image as the store sent it (0: it was cached)
  uint64_t bytes_fetched = 0;      // from the store for this layer's blob (as stored: compressed or not)
  uint64_t chunk_bytes_fetched = 0;  // the chunks those bytes made
  uint64_t bytes_from_cache = 0;   // served from chunks already on the node
  uint64_t chunks_fetched = 0;
  uint64_t readahead_fetches = 0;  // of chunks_fetched, started by readahead
  uint64_t list_fetches = 0;       // of chunks_fetched, started by the recorded access list
  uint64_t extents_touched = 0;
  uint64_t bytes_touched = 0;      // distinct extent bytes read so far
  double blob_fetched_percent = 0; // bytes_touched / blob_bytes
  double fetch_p50_ms = 0, fetch_p99_ms = 0;
  uint64_t read_errors = 0;
};

class ServedLayer : public std::enable_shared_from_this<ServedLayer> {
 public:
  // Always held by a shared_ptr (readahead's completions hold a weak one).
  // `record` keeps the stats and access order (layer_record.h); null: in
  // this process's memory only.
  ServedLayer(Digest128 digest, cache::Manifest manifest, std::shared_ptr<cache::ObjectStore> store,
              cache::ChunkCache& cache, std::unique_ptr<LayerRecord> record = nullptr);

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
  // manifest's extents), in order; readahead waits until they are done.
  void Prefetch(const std::vector<uint32_t>& extents);
  // Blocks until no readahead or list fetch of this layer runs (tests).
  void WaitForBackground();

  // Extent indexes in the order this layer first read them.
  std::vector<uint32_t> AccessOrder() const;
  LayerStats Stats() const;
  LayerRecord& record() { return *record_; }

 private:
  void NoteRead(size_t index, const cache::ChunkCache::Handle& h, uint64_t bytes, double fetch_ms);
  void NoteFetched(uint64_t stored_bytes, size_t index);
  // Readahead for a read that touched extents [first, last].
  void ReadAhead(size_t first, size_t last);
  // What the live streams' windows allow, ra_mu_ held: the extents to ask
  // the cache for, each already counted in ra_running_.
  std::vector<size_t> PickLocked();
  // Asks the cache for picked extents with ra_mu_ released (a request may
  // open files, submit disk reads or wait for a worker: readers must not
  // queue behind it for the stream bookkeeping); a pick the cache did not
  // start (cached, or on its way) gives its slot back for the next picks.
  void StartReadAhead(std::vector<size_t> picks);
  void FetchDone(uint64_t stored_bytes, size_t index, bool list);

  struct Stream {
    size_t next = 0;     // the extent after the last one read
    size_t window = 0;   // extents to keep fetched ahead of `next`
    size_t issued = 0;   // readahead has been asked up to here (exclusive)
    uint64_t used = 0;   // when a read last continued it (steady ms)
    size_t run = 0;      // dense steps in a row (nothing before them left unread)
    uint32_t holes = 0;  // bit k: extent next-1-k was skipped and not read yet (k < 4)
  };

  const Digest128 digest_;
  const cache::Manifest manifest_;
  const std::shared_ptr<cache::ObjectStore> store_;
  cache::ChunkCache& cache_;
  cache::ChunkCache::Handle meta_;

  std::unique_ptr<LayerRecord> record_;  // the counters, the extents read and their order

  std::mutex ra_mu_;                      // guards the readahead state below
  std::condition_variable ra_cv_;
  std::vector<Stream> streams_;
  size_t ra_running_ = 0;                 // readahead fetches picked or started, not ended
  size_t list_running_ = 0;               // access-list fetches asked for or started, not ended
};

}  // namespace strata::lazyfs
