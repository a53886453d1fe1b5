// ServedLayer: blob offsets to extents to cached chunks.
#include "lazyfs/served_layer.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/strings.h"

namespace strata::lazyfs {
namespace {
constexpr size_t kLatencySamples = 4096;
}

ServedLayer::ServedLayer(Digest128 digest, cache::Manifest manifest, std::shared_ptr<cache::ObjectStore> store,
                         cache::ChunkCache& cache)
    : digest_(digest),
      manifest_(std::move(manifest)),
      store_(std::move(store)),
      cache_(cache),
      touched_(new std::atomic<bool>[manifest_.extents.size()]()) {}

Status ServedLayer::Load() {
  auto h = cache_.Get(manifest_.meta_hash, store_);
  if (!h.ok()) return h.status().Annotate(StrCat("load metadata image of layer ", digest_.Hex()));
  if (h->size() != manifest_.meta_size) {
    return Error(EBADMSG, StrCat("layer ", digest_.Hex(), ": metadata image is ", h->size(), " bytes, manifest says ",
                                 manifest_.meta_size));
  }
  meta_ = std::move(*h);
  return OkStatus();
}

Result<size_t> ServedLayer::ReadMeta(uint64_t offset, std::span<char> out) {
  auto n = meta_.Read(offset, out);
  if (!n.ok()) ++read_errors_;
  return n;
}

void ServedLayer::NoteRead(size_t index, const cache::ChunkCache::Handle& h, uint64_t bytes, double fetch_ms) {
  if (h.fetched()) {
    bytes_fetched_ += h.size();
    ++chunks_fetched_;
    std::lock_guard lock(mu_);
    if (fetch_ms_.size() < kLatencySamples) fetch_ms_.push_back(fetch_ms);
    else fetch_ms_[fetch_ms_next_++ % kLatencySamples] = fetch_ms;
  } else {
    bytes_from_cache_ += bytes;
  }
  if (!touched_[index].exchange(true, std::memory_order_relaxed)) {
    ++extents_touched_;
    bytes_touched_ += manifest_.extents[index].length;
    std::lock_guard lock(mu_);
    access_order_.push_back(static_cast<uint32_t>(index));
  }
}

Result<size_t> ServedLayer::ReadBlob(uint64_t offset, std::span<char> out) {
  const auto& extents = manifest_.extents;
  const uint64_t end = std::min<uint64_t>(manifest_.blob_size, offset + out.size());
  size_t done = 0;
  // Extents are sorted and disjoint, so their ends are sorted too: start at
  // the first one that ends after `offset`.
  size_t i = static_cast<size_t>(
      std::partition_point(extents.begin(), extents.end(),
                           [&](const cache::Extent& e) { return e.offset + e.length <= offset; }) -
      extents.begin());
  while (offset < end) {
    if (i < extents.size() && extents[i].offset <= offset) {
      const cache::Extent& e = extents[i];
      size_t want = static_cast<size_t>(std::min(end, e.offset + e.length) - offset);
      auto start = std::chrono::steady_clock::now();
      auto h = cache_.Get(e.hash, store_);
      if (!h.ok()) {
        ++read_errors_;
        return h.status().Annotate(StrCat("layer ", digest_.Hex(), ": blob offset ", offset));
      }
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      auto n = h->Read(offset - e.offset, out.subspan(done, want));
      if (!n.ok() || *n != want) {
        ++read_errors_;
        if (!n.ok()) return n.status();
        return Error(EIO, StrCat("layer ", digest_.Hex(), ": chunk ", e.hash.Hex(), " is shorter than its extent"));
      }
      NoteRead(i, *h, want, ms);
      done += want;
      offset += want;
      ++i;
    } else {
      // Padding up to the next extent or the end: zeros, never stored.
      uint64_t next = i < extents.size() ? extents[i].offset : manifest_.blob_size;
      size_t zeros = static_cast<size_t>(std::min(end, next) - offset);
      std::memset(out.data() + done, 0, zeros);
      done += zeros;
      offset += zeros;
    }
  }
  return done;
}

void ServedLayer::Prefetch(const std::vector<uint32_t>& list) {
  for (uint32_t i : list) {
    if (i < manifest_.extents.size()) cache_.Prefetch(manifest_.extents[i].hash, store_);
  }
}

std::vector<uint32_t> ServedLayer::AccessOrder() const {
  std::lock_guard lock(mu_);
  return access_order_;
}

LayerStats ServedLayer::Stats() const {
  LayerStats s;
  s.meta_bytes = manifest_.meta_size;
  s.blob_bytes = manifest_.blob_size;
  s.image_bytes = s.meta_bytes + s.blob_bytes;
  s.stored_bytes = manifest_.StoredBytes();
  s.bytes_fetched = bytes_fetched_;
  s.bytes_from_cache = bytes_from_cache_;
  s.chunks_fetched = chunks_fetched_;
  s.extents_touched = extents_touched_;
  s.bytes_touched = bytes_touched_;
  s.read_errors = read_errors_;
  s.blob_fetched_percent = s.blob_bytes ? 100.0 * static_cast<double>(s.bytes_touched) / static_cast<double>(s.blob_bytes) : 0;
  std::vector<double> samples;
  {
    std::lock_guard lock(mu_);
    samples = fetch_ms_;
  }
  if (!samples.empty()) {
    std::sort(samples.begin(), samples.end());
    s.fetch_p50_ms = samples[samples.size() / 2];
    s.fetch_p99_ms = samples[std::min(samples.size() - 1, samples.size() * 99 / 100)];
  }
  return s;
}

}  // namespace strata::lazyfs
