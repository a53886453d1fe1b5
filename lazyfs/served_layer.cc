// ServedLayer: blob offsets to extents to cached chunks.
#include "lazyfs/served_layer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <vector>

#include "common/strings.h"

namespace strata::lazyfs {
namespace {
// Readahead (served_layer.h has the why).
constexpr size_t kStreams = 8;          // sequential readers tracked per layer
constexpr size_t kMaxGap = 4;           // extents a continuing read may skip
constexpr size_t kRunToOpen = 2;        // dense steps in a row that open a window
constexpr size_t kLate = 4;             // extents behind a stream's end whose reads may still come
constexpr uint32_t kLateMask = (1u << kLate) - 1;
constexpr size_t kStartWindow = 2;      // extents, when a stream's window opens
constexpr size_t kMaxWindow = 64;       // extents
constexpr uint64_t kMaxAhead = 32 << 20;  // blob bytes ahead of the reader
constexpr size_t kLayerRunning = 8;     // readahead fetches per layer at once
constexpr auto kStreamIdle = std::chrono::seconds(2);

uint64_t NowMs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}
}  // namespace

ServedLayer::ServedLayer(Digest128 digest, cache::Manifest manifest, std::shared_ptr<cache::ObjectStore> store,
                         cache::ChunkCache& cache, std::unique_ptr<LayerRecord> record)
    : digest_(digest),
      manifest_(std::move(manifest)),
      store_(std::move(store)),
      cache_(cache),
      record_(std::move(record)) {
  if (!record_) {
    auto anonymous = LayerRecord::Open("", digest_, static_cast<uint32_t>(manifest_.extents.size()));
    if (!anonymous.ok()) throw std::bad_alloc();
    record_ = std::move(*anonymous);
  }
}

Status ServedLayer::Load() {
  auto h = cache_.Get(manifest_.meta_hash, store_, manifest_.meta_size);
  if (!h.ok()) return h.status().Annotate(StrCat("load metadata image of layer ", digest_.Hex()));
  if (h->size() != manifest_.meta_size) {
    return Error(EBADMSG, StrCat("layer ", digest_.Hex(), ": metadata image is ", h->size(), " bytes, manifest says ",
                                 manifest_.meta_size));
  }
  if (!record_->restored()) record_->Set(LayerRecord::kMetaBytesFetched, h->fetched_bytes());
  meta_ = std::move(*h);
  return OkStatus();
}

Result<size_t> ServedLayer::ReadMeta(uint64_t offset, std::span<char> out) {
  auto n = meta_.Read(offset, out);
  if (!n.ok()) record_->Add(LayerRecord::kReadErrors, 1);
  else cache_.DropWhenIdle(manifest_.meta_hash);
  return n;
}

void ServedLayer::NoteRead(size_t index, const cache::ChunkCache::Handle& h, uint64_t bytes, double fetch_ms) {
  if (h.fetched()) {
    NoteFetched(h.fetched_bytes(), index);
    record_->AddLatency(fetch_ms);
  } else {
    record_->Add(LayerRecord::kBytesFromCache, bytes);
  }
  if (record_->Touch(static_cast<uint32_t>(index))) {
    record_->Add(LayerRecord::kExtentsTouched, 1);
    record_->Add(LayerRecord::kBytesTouched, manifest_.extents[index].length);
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
  // The extents this read touches, [i, last]: readahead starts before the
  // read waits for its own.
  if (i < extents.size() && extents[i].offset < end) {
    size_t last = static_cast<size_t>(
        std::partition_point(extents.begin() + static_cast<ptrdiff_t>(i), extents.end(),
                             [&](const cache::Extent& e) { return e.offset < end; }) -
        extents.begin()) - 1;
    ReadAhead(i, last);
  }
  while (offset < end) {
    if (i < extents.size() && extents[i].offset <= offset) {
      const cache::Extent& e = extents[i];
      size_t want = static_cast<size_t>(std::min(end, e.offset + e.length) - offset);
      auto start = std::chrono::steady_clock::now();
      auto h = cache_.Get(e.hash, store_, e.length);
      if (!h.ok()) {
        record_->Add(LayerRecord::kReadErrors, 1);
        return h.status().Annotate(StrCat("layer ", digest_.Hex(), ": blob offset ", offset));
      }
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      auto n = h->Read(offset - e.offset, out.subspan(done, want));
      if (!n.ok() || *n != want) {
        record_->Add(LayerRecord::kReadErrors, 1);
        if (!n.ok()) return n.status();
        return Error(EIO, StrCat("layer ", digest_.Hex(), ": chunk ", e.hash.Hex(), " is shorter than its extent"));
      }
      NoteRead(i, *h, want, ms);
      cache_.DropWhenIdle(e.hash);  // the kernel caches what it read
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

void ServedLayer::NoteFetched(uint64_t stored_bytes, size_t index) {
  if (!stored_bytes) return;  // failed: a reader that needs it will say so
  record_->Add(LayerRecord::kBytesFetched, stored_bytes);
  record_->Add(LayerRecord::kChunkBytesFetched, manifest_.extents[index].length);
  record_->Add(LayerRecord::kChunksFetched, 1);
}

void ServedLayer::FetchDone(uint64_t stored_bytes, size_t index, bool list) {
  NoteFetched(stored_bytes, index);
  std::vector<size_t> picks;
  {
    std::lock_guard lock(ra_mu_);
    if (list) {
      --list_running_;
      if (stored_bytes) record_->Add(LayerRecord::kListFetches, 1);
    } else {
      --ra_running_;
      if (stored_bytes) record_->Add(LayerRecord::kReadaheadFetches, 1);
    }
    picks = PickLocked();
    ra_cv_.notify_all();
  }
  StartReadAhead(std::move(picks));
}

void ServedLayer::Prefetch(const std::vector<uint32_t>& list) {
  std::weak_ptr<ServedLayer> weak = weak_from_this();
  std::vector<uint32_t> valid;
  for (uint32_t i : list) {
    if (i < manifest_.extents.size()) valid.push_back(i);
  }
  // Counted before they are asked for: a fetch may end (FetchDone) before
  // Prefetch returns. Readahead waits meanwhile, as it does for the list.
  {
    std::lock_guard lock(ra_mu_);
    list_running_ += valid.size();
  }
  // Extents on the node's disk are read into memory after the loop, on a
  // worker: the caller is a mount, and a long list's reads queued at once
  // would hold its other looks at the disk behind them.
  std::vector<Digest128> on_disk;
  size_t not_started = 0;
  for (uint32_t i : valid) {
    const cache::Extent& e = manifest_.extents[i];
    if (!cache_.Prefetch(
            e.hash, store_, e.length,
            [weak, i](uint64_t bytes) {
              if (auto self = weak.lock()) self->FetchDone(bytes, i, /*list=*/true);
            },
            &on_disk)) {
      ++not_started;
    }
  }
  cache_.ReadAhead(std::move(on_disk));
  std::vector<size_t> picks;
  {
    std::lock_guard lock(ra_mu_);
    list_running_ -= not_started;
    ra_cv_.notify_all();
    picks = PickLocked();  // (none while any of the list is still on its way)
  }
  StartReadAhead(std::move(picks));
}

void ServedLayer::ReadAhead(size_t first, size_t last) {
  std::vector<size_t> picks;
  std::unique_lock lock(ra_mu_);
  const uint64_t now = NowMs();
  Stream* stream = nullptr;
  for (auto& s : streams_) {
    if (first + kLate >= s.next && first <= s.next + kMaxGap) {
      stream = &s;
      break;
    }
  }
  if (stream) {
    // Dense: nothing between the stream's start and its end is left unread,
    // but for the last kLate extents, whose reads may still come (readers
    // side by side, requests answered out of order).
    bool dense = false;
    if (last + 1 > stream->next) {  // a step onto new extents
      const size_t d = last + 1 - stream->next;
      // Skipped extents that fall more than kLate behind the new end stay
      // skipped: the reader hops (an import reading some of a directory's
      // files), it does not walk. Its window closes until it walks again.
      bool hopped = d >= kLate ? stream->holes != 0 : (stream->holes >> (kLate - d)) != 0;
      uint32_t holes = d >= kLate ? 0 : (stream->holes << d) & kLateMask;
      for (size_t e = stream->next; e < first; ++e) {
        if (last - e < kLate) holes |= 1u << (last - e);
        else hopped = true;
      }
      stream->next = last + 1;
      stream->holes = holes;
      if (hopped) {
        stream->run = 0;
        stream->window = 0;
      }
      dense = holes == 0;
    } else {  // a late read, which may fill what a step skipped
      const uint32_t before = stream->holes;
      for (size_t e = first; e <= last; ++e) {
        const size_t k = stream->next - 1 - e;
        if (k < kLate) stream->holes &= ~(1u << k);
      }
      dense = before != 0 && stream->holes == 0;
    }
    if (dense && ++stream->run >= kRunToOpen) {
      stream->window = stream->window ? std::min(stream->window * 2, kMaxWindow) : kStartWindow;
    }
    stream->used = now;
  } else {
    // A new reader, or one that jumped: a stream of its own, replacing the
    // one idle longest. One read is not a pattern, nor is one step: no
    // window until it has stepped twice onto the next extents.
    if (streams_.size() < kStreams) {
      streams_.emplace_back();
      stream = &streams_.back();
    } else {
      stream = &*std::min_element(streams_.begin(), streams_.end(),
                                  [](const Stream& a, const Stream& b) { return a.used < b.used; });
    }
    *stream = Stream{last + 1, 0, last + 1, now, 0, 0};
  }
  picks = PickLocked();
  lock.unlock();
  StartReadAhead(std::move(picks));
}

std::vector<size_t> ServedLayer::PickLocked() {
  std::vector<size_t> picks;
  if (list_running_ > 0) return picks;
  const auto& extents = manifest_.extents;
  const uint64_t now = NowMs();
  const uint64_t idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(kStreamIdle).count();
  for (auto& s : streams_) {
    if (ra_running_ >= kLayerRunning) break;
    if (s.window == 0 || s.next >= extents.size() || now - s.used > idle_ms) continue;
    const size_t end = std::min(extents.size(), s.next + s.window);
    const uint64_t limit = extents[s.next].offset + kMaxAhead;
    size_t i = std::max(s.issued, s.next);
    for (; i < end && ra_running_ < kLayerRunning && extents[i].offset < limit; ++i) {
      if (record_->Touched(static_cast<uint32_t>(i))) continue;  // read already: cached
      picks.push_back(i);
      ++ra_running_;
    }
    s.issued = i;
  }
  return picks;
}

void ServedLayer::StartReadAhead(std::vector<size_t> picks) {
  const auto& extents = manifest_.extents;
  std::weak_ptr<ServedLayer> weak = weak_from_this();
  while (!picks.empty()) {
    size_t not_started = 0;
    for (size_t i : picks) {
      if (!cache_.Prefetch(extents[i].hash, store_, extents[i].length, [weak, i](uint64_t bytes) {
            if (auto self = weak.lock()) self->FetchDone(bytes, i, /*list=*/false);
          })) {
        ++not_started;
      }
    }
    std::lock_guard lock(ra_mu_);
    ra_running_ -= not_started;
    ra_cv_.notify_all();
    // The slots given back go to the windows' next extents.
    picks = not_started ? PickLocked() : std::vector<size_t>{};
  }
}

void ServedLayer::WaitForBackground() {
  std::unique_lock lock(ra_mu_);
  ra_cv_.wait(lock, [&] { return ra_running_ == 0 && list_running_ == 0; });
}

std::vector<uint32_t> ServedLayer::AccessOrder() const { return record_->AccessOrder(); }

LayerStats ServedLayer::Stats() const {
  LayerStats s;
  s.meta_bytes = manifest_.meta_size;
  s.blob_bytes = manifest_.blob_size;
  s.image_bytes = s.meta_bytes + s.blob_bytes;
  s.stored_bytes = manifest_.StoredBytes();
  const LayerRecord& r = *record_;
  s.meta_bytes_fetched = r.Get(LayerRecord::kMetaBytesFetched);
  s.bytes_fetched = r.Get(LayerRecord::kBytesFetched);
  s.chunk_bytes_fetched = r.Get(LayerRecord::kChunkBytesFetched);
  s.readahead_fetches = r.Get(LayerRecord::kReadaheadFetches);
  s.list_fetches = r.Get(LayerRecord::kListFetches);
  s.bytes_from_cache = r.Get(LayerRecord::kBytesFromCache);
  s.chunks_fetched = r.Get(LayerRecord::kChunksFetched);
  s.extents_touched = r.Get(LayerRecord::kExtentsTouched);
  s.bytes_touched = r.Get(LayerRecord::kBytesTouched);
  s.read_errors = r.Get(LayerRecord::kReadErrors);
  s.blob_fetched_percent = s.blob_bytes ? 100.0 * static_cast<double>(s.bytes_touched) / static_cast<double>(s.blob_bytes) : 0;
  std::vector<double> samples = r.Latencies();
  if (!samples.empty()) {
    std::sort(samples.begin(), samples.end());
    s.fetch_p50_ms = samples[samples.size() / 2];
    s.fetch_p99_ms = samples[std::min(samples.size() - 1, samples.size() * 99 / 100)];
  }
  return s;
}

}  // namespace strata::lazyfs
