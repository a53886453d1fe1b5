// LayerRecord: what a served layer counts and records — its stats, the
// extents read and the order they were first read in (the access list a
// `--record` mount saves) — in memory that outlives the serving process: a
// file in the daemon's state directory (under /run), mapped shared: the
// page cache holds it and writes it back like any file, never in the way
// of a read.
// A process that takes the layer over after a crash maps the same file and
// goes on counting where the dead one stopped; every update is one atomic
// store into the mapping, so nothing is lost at a kill -9 and the read path
// makes no system call for it.
//
// File: a header (magic, digest, extent count, counters, the latency ring),
// one byte per extent (read or not), then the access order: one 32-bit slot
// per extent holding index + 1 (0: reserved, not yet written). A crash
// between marking an extent and writing its slot leaves the mark alone;
// Open() appends such extents at the end and drops empty slots.
#pragma once

#include <atomic>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace strata::lazyfs {

class LayerRecord {
 public:
  enum Counter {
    kBytesFetched,
    kChunkBytesFetched,
    kBytesFromCache,
    kChunksFetched,
    kReadaheadFetches,
    kListFetches,
    kMetaBytesFetched,
    kExtentsTouched,
    kBytesTouched,
    kReadErrors,
    kCounters
  };
  static constexpr size_t kLatencySamples = 4096;

  // Maps the record at `path`: with `reuse`, the one there when it is this
  // layer's (then restored() is true); else a new one (a file mapped by an
  // earlier load is unlinked, never truncated under its mapping). An empty
  // path: anonymous memory that dies with the process.
  static Result<std::unique_ptr<LayerRecord>> Open(const std::string& path, const Digest128& digest, uint32_t extents,
                                                   bool reuse = false);
  ~LayerRecord();
  LayerRecord(const LayerRecord&) = delete;
  LayerRecord& operator=(const LayerRecord&) = delete;

  bool restored() const { return restored_; }
  uint64_t Get(Counter c) const;
  void Add(Counter c, uint64_t n);
  void Set(Counter c, uint64_t n);
  // Marks extent `i` read; true only the first time (it is then appended
  // to the access order).
  bool Touch(uint32_t i);
  bool Touched(uint32_t i) const;
  std::vector<uint32_t> AccessOrder() const;
  // The latest fetch latencies (a ring of kLatencySamples).
  void AddLatency(double ms);
  std::vector<double> Latencies() const;
  // Deletes the file: the layer is no longer served (the mapping stays
  // valid until destruction).
  void Remove();

 private:
  LayerRecord() = default;
  struct Header;
  Header* header() const;
  uint8_t* touched() const;
  uint32_t* order() const;
  void Repair();

  std::string path_;
  ino_t ino_ = 0;
  void* map_ = nullptr;
  size_t size_ = 0;
  uint32_t extents_ = 0;
  size_t order_offset_ = 0;
  bool restored_ = false;
};

}  // namespace strata::lazyfs
