// ChunkCache: the node-local cache of content-named chunks.
//
// Layout under the cache directory (docs/formats.md has the reasons):
//   data/<2 hex>/<32 hex>   one file per chunk, its exact (uncompressed) bytes
//   index/                  LMDB: chunk -> (size, last use); LRU order; totals
//   tmp/                    chunks being written, named <hex>.<pid>.<n>
//   lock                    flock: shared while open, exclusive for recovery
//
// Guarantees:
// - A chunk is decoded (cache/chunk_codec.h) and checked against its name
//   (XXH3-128) when fetched; bad bytes are never written to data/ and never
//   returned. Hits are not re-hashed.
// - The readers waiting for a fetch get its checked bytes at once; its file
//   is written after, by the fetching thread (a chunk that cannot be written
//   is still served, and fetched again by the next reader that needs it).
// - Any number of concurrent Get()s of a missing chunk in one process cause
//   one store request; all of them get its result or its error.
// - Several processes may share a directory. A file appears in data/ only
//   by rename after it was written and checked, so `kill -9` at any moment
//   leaves nothing corrupt; the first process to open the directory after
//   everyone closed it reconciles the index with data/ (and re-hashes chunks
//   written since the last sync when the machine rebooted in between).
// - The size cap is kept by evicting least recently used chunks, never one
//   this process is reading (a Handle pins it). Another process's reader
//   keeps its open descriptor valid even when the file is evicted.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>

#include "cache/object_store.h"
#include "common/hash.h"
#include "common/lmdb.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "common/unique_fd.h"
#include "common/units.h"

namespace strata::cache {

struct ChunkCacheOptions {
  std::string dir;
  uint64_t capacity_bytes = uint64_t{10} << 30;  // 0: no cap (tools that only inspect)
  size_t fetch_threads = 32;       // concurrent store requests
  size_t max_background = 4;       // of which prefetches at most
  Duration fetch_deadline = std::chrono::seconds(60);  // longest a Get waits
  size_t max_open_files = 1024;    // descriptors kept open for fast hits
  size_t map_size = size_t{1} << 30;  // LMDB map: ~10 M chunks
  Duration served_idle = std::chrono::seconds(3);  // see DropWhenIdle
};

// Counters of this process since Open().
struct ChunkCacheStats {
  uint64_t hits = 0;            // Get served from data/
  uint64_t misses = 0;          // Get that started a fetch
  uint64_t joined = 0;          // Get that waited for another's fetch
  uint64_t fetches = 0;         // store requests made
  uint64_t fetch_errors = 0;    // store requests that failed
  uint64_t corrupt = 0;         // fetched chunks whose hash did not match
  uint64_t timeouts = 0;        // Get that gave up at the deadline
  uint64_t bytes_fetched = 0;  // of good fetches, as the store holds them (compressed or not)
  uint64_t bytes_decoded = 0;  // the chunks those bytes made
  uint64_t compressed = 0;     // fetched chunks that came as zstd frames
  uint64_t evictions = 0;
  uint64_t bytes_evicted = 0;
  uint64_t prefetches = 0;      // Prefetch calls that started a fetch
  uint64_t disk_readaheads = 0;  // chunks on disk whose files Prefetch or ReadAhead read ahead
};

// Totals of the directory, shared by every process using it.
struct ChunkCacheUsage {
  uint64_t chunks = 0;
  uint64_t bytes = 0;
  uint64_t capacity = 0;
};

struct VerifyReport {
  uint64_t checked = 0;
  uint64_t bytes = 0;
  uint64_t corrupt = 0;   // removed: content did not match the name
  uint64_t missing = 0;   // index entries without a file, dropped
};

class ChunkCache {
 public:
  struct OpenChunk;

  // A pinned chunk: its descriptor stays open and eviction in this process
  // skips it until every Handle of it is gone. Copyable; thread-safe.
  class Handle {
   public:
    Handle() = default;
    uint64_t size() const;
    // Reads up to out.size() bytes at `offset` of the chunk.
    Result<size_t> Read(uint64_t offset, std::span<char> out) const;
    // True when this Get started the store request for the chunk.
    bool fetched() const { return fetched_; }
    // The bytes that request moved (the stored object, compressed or not).
    uint64_t fetched_bytes() const { return fetched_bytes_; }

   private:
    friend class ChunkCache;
    explicit Handle(std::shared_ptr<OpenChunk> c) : chunk_(std::move(c)) {}
    Handle(std::shared_ptr<OpenChunk> c, uint64_t fetched_bytes)
        : chunk_(std::move(c)), fetched_(true), fetched_bytes_(fetched_bytes) {}
    std::shared_ptr<OpenChunk> chunk_;
    bool fetched_ = false;
    uint64_t fetched_bytes_ = 0;
  };

  static Result<std::unique_ptr<ChunkCache>> Open(const ChunkCacheOptions& options);
  ~ChunkCache();
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  // The chunk named `id`, from data/ or fetched from `store` (key
  // ChunkKey(id)), decoded and checked. Waits at most options.fetch_deadline
  // (ETIMEDOUT); a corrupt object is EBADMSG. `size`: the chunk's size when
  // the caller knows it (an extent's length), which bounds what a
  // compressed object may claim to hold; 0 when unknown. Thread-safe.
  Result<Handle> Get(const Digest128& id, const std::shared_ptr<ObjectStore>& store, uint64_t size = 0);
  // Get + Handle::Read.
  Result<size_t> Read(const Digest128& id, const std::shared_ptr<ObjectStore>& store, uint64_t offset,
                      std::span<char> out);
  // Fetches the chunk in the background unless it is cached or on its way;
  // background fetches never take the workers a waiting Get needs. A chunk
  // cached on disk has its file read into memory ahead instead
  // (posix_fadvise(WILLNEED), which may wait while the disk's queue is
  // full), or, with `on_disk`, is added to it for ReadAhead. `done`,
  // when given, runs once the fetch has ended (in a fetch worker, with no
  // lock held) with the bytes it moved (0 when it failed), and only if this
  // call started it; returns whether it did.
  using FetchDone = std::function<void(uint64_t fetched_bytes)>;
  bool Prefetch(const Digest128& id, const std::shared_ptr<ObjectStore>& store, uint64_t size = 0,
                FetchDone done = nullptr, std::vector<Digest128>* on_disk = nullptr);
  // Reads the files of chunks cached on disk into memory, in this order
  // from ids[from], on background workers (64 at a time, each slice queued
  // behind the work before it): for a long list whose caller (a mount) must
  // not wait for the disk.
  void ReadAhead(std::vector<Digest128> ids, size_t from = 0);
  bool Contains(const Digest128& id);
  // The caller has handed the chunk's bytes to a reader that caches them
  // itself (lazyfs: EROFS's or FUSE's page cache): once nobody has read it
  // for options.served_idle (3 s), its file's writeback is started, and as
  // long again later its pages are dropped, so the node does not hold the
  // data twice. (Sooner costs cold reads: the writeback then competes with
  // the fetches, docs/benchmarks.md.)
  void DropWhenIdle(const Digest128& id);

  ChunkCacheStats stats() const;
  Result<ChunkCacheUsage> Usage();
  // Evicts least recently used chunks until at most `target_bytes` remain.
  Status Trim(uint64_t target_bytes);
  // Re-hashes every chunk; removes the corrupt ones and fixes the index.
  Result<VerifyReport> Verify();
  // Writes pending last-use times to the index.
  Status Flush();
  // Blocks until no fetch (nor the cache write and eviction that follow one,
  // nor a disk readahead) runs in this process: for orderly shutdown and for
  // tests that inspect the directory.
  void WaitForFetches();

  const ChunkCacheOptions& options() const { return options_; }

 private:
  struct Flight;
  explicit ChunkCache(const ChunkCacheOptions& options);
  Status Init();
  Status Recover(bool* rebuilt);
  Status Reconcile(bool rebuilt);
  Status OpenIndex();
  std::string DataPath(const Digest128& id) const;
  std::shared_ptr<OpenChunk> OpenCached(const Digest128& id);
  std::shared_ptr<Flight> StartFetch(const Digest128& id, const std::shared_ptr<ObjectStore>& store, uint64_t size,
                                     bool background, bool* leader, FetchDone on_done = nullptr);
  // Reads chunk `id`'s file into memory if it is on disk (`open`: this
  // cache's open chunk of it, if any); returns whether it was.
  bool ReadAheadOnDisk(const Digest128& id, const std::shared_ptr<OpenChunk>& open);
  bool StartBackgroundFetch(const Digest128& id, const std::shared_ptr<ObjectStore>& store, uint64_t size,
                            FetchDone done);
  // False when the flight's other job (a promoted prefetch) did the fetch.
  bool RunFetch(const Digest128& id, ObjectStore& store, uint64_t size, const std::shared_ptr<Flight>& flight);
  Result<std::shared_ptr<OpenChunk>> Insert(const Digest128& id, std::string_view data);
  Status EvictTo(uint64_t target_bytes);
  // Evicts first when `incoming` more bytes would pass the cap.
  void MakeRoom(uint64_t incoming);
  bool Pinned(const Digest128& id);
  void Touch(const Digest128& id);
  void Maintain();
  void DropServedPages();  // the maintainer's part of DropWhenIdle
  Status SyncToDisk();

  const ChunkCacheOptions options_;
  UniqueFd lock_fd_;
  LmdbEnv env_;
  MDB_dbi chunks_db_ = 0, lru_db_ = 0, meta_db_ = 0;

  mutable std::mutex mu_;  // guards the maps below; never held across I/O
  std::unordered_map<Digest128, std::shared_ptr<OpenChunk>, Digest128Hash> open_;
  std::unordered_map<Digest128, std::shared_ptr<Flight>, Digest128Hash> inflight_;
  std::unordered_map<Digest128, uint64_t, Digest128Hash> touched_;  // id -> last use (us)

  std::atomic<bool> evicting_{false};
  std::atomic<uint64_t> tmp_counter_{0};

  bool closing_ = false;   // guarded by mu_: the destructor has begun
  ChunkCacheStats stats_;  // guarded by mu_
  size_t jobs_ = 0;        // fetch and disk readahead jobs queued or running; guarded by mu_
  std::condition_variable idle_cv_;

  struct Served {
    uint64_t last_ms = 0;       // steady clock, of the last DropWhenIdle
    bool written_back = false;  // writeback started; drop on the next pass
  };
  std::mutex served_mu_;
  std::unordered_map<Digest128, Served, Digest128Hash> served_;

  std::mutex maintain_mu_;
  std::condition_variable maintain_cv_;
  bool stopping_ = false;
  std::thread maintainer_;
  std::unique_ptr<ThreadPool> pool_;  // last member: joined first
};

}  // namespace strata::cache
