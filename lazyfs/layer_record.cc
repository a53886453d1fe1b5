// LayerRecord: a served layer's counters and access order in a shared mapping.
#include "lazyfs/layer_record.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::lazyfs {

namespace {
constexpr char kMagic[8] = {'l', 'a', 'z', 'y', 'r', 'e', 'c', '1'};

template <typename T>
std::atomic_ref<T> Atomic(T& value) {
  static_assert(std::atomic_ref<T>::is_always_lock_free, "shared between processes: must be lock-free");
  return std::atomic_ref<T>(value);
}
}  // namespace

struct LayerRecord::Header {
  char magic[8];
  uint64_t digest_high;
  uint64_t digest_low;
  uint32_t extents;
  uint32_t reserved;
  uint64_t counters[16];
  uint64_t order_len;     // slots handed out
  uint64_t latency_next;  // samples written
  float latency[kLatencySamples];
};
static_assert(LayerRecord::kCounters <= 16);

LayerRecord::Header* LayerRecord::header() const { return static_cast<Header*>(map_); }
uint8_t* LayerRecord::touched() const { return static_cast<uint8_t*>(map_) + sizeof(Header); }
uint32_t* LayerRecord::order() const {
  return reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(map_) + order_offset_);
}

Result<std::unique_ptr<LayerRecord>> LayerRecord::Open(const std::string& path, const Digest128& digest,
                                                       uint32_t extents, bool reuse) {
  std::unique_ptr<LayerRecord> r(new LayerRecord());
  r->path_ = path;
  r->extents_ = extents;
  r->order_offset_ = (sizeof(Header) + extents + 7) / 8 * 8;
  r->size_ = r->order_offset_ + size_t{extents} * sizeof(uint32_t);
  const std::string what = StrCat("record of layer ", digest.Hex(), path.empty() ? "" : " at " + path);
  bool fresh = true;
  if (path.empty()) {
    r->map_ = ::mmap(nullptr, r->size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  } else {
    if (!reuse) ::unlink(path.c_str());
    STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDWR | O_CREAT, 0600));
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, StrCat(what, ": stat"));
    if (static_cast<size_t>(st.st_size) == r->size_) {
      Header h;
      if (::pread(fd.get(), &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h) &&
          std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.digest_high == digest.high &&
          h.digest_low == digest.low && h.extents == extents) {
        fresh = false;
      }
    }
    if (fresh && st.st_size != 0) {  // someone else's: a new file, not a truncated one
      ::unlink(path.c_str());
      STRATA_ASSIGN_OR_RETURN(fd, OpenFile(path, O_RDWR | O_CREAT | O_EXCL, 0600));
      if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, StrCat(what, ": stat"));
    }
    // Allocated, not sparse: a full file system is an error here, not a
    // SIGBUS on the read path later.
    if (fresh) {
      int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(r->size_));
      if (err != 0) return ErrnoError(err, StrCat(what, ": allocate it"));
    }
    r->ino_ = st.st_ino;
    r->map_ = ::mmap(nullptr, r->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  }
  if (r->map_ == MAP_FAILED) {
    r->map_ = nullptr;
    return ErrnoError(errno, StrCat(what, ": map it"));
  }
  if (fresh) {
    Header* h = r->header();
    h->digest_high = digest.high;
    h->digest_low = digest.low;
    h->extents = extents;
    std::memcpy(h->magic, kMagic, sizeof kMagic);  // last: a torn start is not taken for a record
  } else {
    r->restored_ = true;
    r->Repair();
  }
  return r;
}

LayerRecord::~LayerRecord() {
  if (map_) ::munmap(map_, size_);
}

void LayerRecord::Repair() {
  // Only this process maps it now: plain accesses.
  Header* h = header();
  std::vector<uint32_t> order_list;
  std::vector<bool> listed(extents_);
  const uint64_t n = std::min<uint64_t>(h->order_len, extents_);
  for (uint64_t s = 0; s < n; ++s) {
    uint32_t v = order()[s];
    if (v == 0 || v > extents_ || listed[v - 1]) continue;
    listed[v - 1] = true;
    order_list.push_back(v - 1);
  }
  for (uint32_t i = 0; i < extents_; ++i) {
    if (touched()[i] && !listed[i]) order_list.push_back(i);
  }
  std::memset(order(), 0, size_t{extents_} * sizeof(uint32_t));
  for (size_t s = 0; s < order_list.size(); ++s) order()[s] = order_list[s] + 1;
  h->order_len = order_list.size();
}

uint64_t LayerRecord::Get(Counter c) const { return Atomic(header()->counters[c]).load(std::memory_order_relaxed); }
void LayerRecord::Add(Counter c, uint64_t n) { Atomic(header()->counters[c]).fetch_add(n, std::memory_order_relaxed); }
void LayerRecord::Set(Counter c, uint64_t n) { Atomic(header()->counters[c]).store(n, std::memory_order_relaxed); }

bool LayerRecord::Touch(uint32_t i) {
  if (i >= extents_ || Atomic(touched()[i]).exchange(1, std::memory_order_relaxed) != 0) return false;
  const uint64_t slot = Atomic(header()->order_len).fetch_add(1, std::memory_order_relaxed);
  if (slot < extents_) Atomic(order()[slot]).store(i + 1, std::memory_order_release);
  return true;
}

bool LayerRecord::Touched(uint32_t i) const {
  return i < extents_ && Atomic(touched()[i]).load(std::memory_order_relaxed) != 0;
}

std::vector<uint32_t> LayerRecord::AccessOrder() const {
  const uint64_t n = std::min<uint64_t>(Atomic(header()->order_len).load(std::memory_order_acquire), extents_);
  std::vector<uint32_t> out;
  out.reserve(n);
  for (uint64_t s = 0; s < n; ++s) {
    uint32_t v = Atomic(order()[s]).load(std::memory_order_acquire);
    if (v != 0) out.push_back(v - 1);  // 0: being written by a reader right now
  }
  return out;
}

void LayerRecord::AddLatency(double ms) {
  const uint64_t slot = Atomic(header()->latency_next).fetch_add(1, std::memory_order_relaxed);
  Atomic(header()->latency[slot % kLatencySamples]).store(static_cast<float>(ms), std::memory_order_relaxed);
}

std::vector<double> LayerRecord::Latencies() const {
  const uint64_t n = std::min<uint64_t>(Atomic(header()->latency_next).load(std::memory_order_relaxed), kLatencySamples);
  std::vector<double> out;
  out.reserve(n);
  for (uint64_t s = 0; s < n; ++s) out.push_back(Atomic(header()->latency[s]).load(std::memory_order_relaxed));
  return out;
}

void LayerRecord::Remove() {
  // Only our file: a later load of the layer may have made its own there.
  struct stat st;
  if (!path_.empty() && ::stat(path_.c_str(), &st) == 0 && st.st_ino == ino_) ::unlink(path_.c_str());
}

}  // namespace strata::lazyfs
