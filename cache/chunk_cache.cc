// ChunkCache: content-checked chunks on local disk with an LMDB index.
#include "cache/chunk_cache.h"

#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "cache/chunk_codec.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"

namespace strata::cache {

// A chunk this process can read: from its file in data/, or, between its
// fetch and its file's rename into data/, from the fetched bytes (so the
// readers waiting for it need not wait for the write too). `fd` is set
// before `bytes` is cleared, and never changes after.
struct ChunkCache::OpenChunk {
  UniqueFd fd;
  uint64_t size = 0;
  // Set (after `fd`) once the chunk is in its file: readers then read the
  // file without loading `bytes`, whose atomic load takes a lock.
  std::atomic<bool> on_disk{false};
  // Until then, its checked bytes.
  std::atomic<std::shared_ptr<const std::string>> bytes;
};

struct ChunkCache::Flight {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::shared_ptr<OpenChunk> chunk;
  std::atomic<bool> started{false};  // the first job to run does the fetch
  uint64_t fetched_bytes = 0;  // the stored object's size
  FetchDone on_done;  // the prefetcher's; run by the job that fetched
  bool background = false;
  bool promoted = false;  // an urgent job was queued for a waiting Get
};

namespace {

// posix_fadvise(WILLNEED) over a whole file. The kernel reads at most the
// larger of the disk's largest request and its readahead window per call
// (often 128-512 KiB), so a chunk of up to 1 MiB is asked for in pieces.
void ReadFileAhead(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return;
  constexpr off_t kPiece = 128 << 10;
  for (off_t off = 0; off < st.st_size; off += kPiece) ::posix_fadvise(fd, off, kPiece, POSIX_FADV_WILLNEED);
}

constexpr const char* kBytesKey = "bytes";
constexpr const char* kBootKey = "boot_id";
constexpr const char* kSyncedKey = "synced_at";
constexpr auto kTouchFlushInterval = std::chrono::seconds(1);
constexpr auto kSyncInterval = std::chrono::seconds(30);
constexpr uint64_t kHighWaterPercent = 95;
constexpr uint64_t kLowWaterPercent = 90;

uint64_t NowMs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

uint64_t NowMicros() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::string IdKey(const Digest128& id) {
  uint8_t b[16];
  id.ToBytes(b);
  return std::string(reinterpret_cast<char*>(b), 16);
}

Digest128 IdFromKey(std::string_view k) { return Digest128::FromBytes(reinterpret_cast<const uint8_t*>(k.data())); }

std::string U64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

uint64_t ReadU64(std::string_view s, size_t at = 0) {
  uint64_t v = 0;
  if (s.size() >= at + 8) std::memcpy(&v, s.data() + at, 8);
  return v;
}

// Index value: size, last use.
std::string EntryValue(uint64_t size, uint64_t atime) { return U64(size) + U64(atime); }

// LRU key: big-endian last use, then the id, so keys sort oldest first.
std::string LruKey(uint64_t atime, const Digest128& id) {
  uint64_t be = htobe64(atime);
  std::string k(reinterpret_cast<char*>(&be), 8);
  return k + IdKey(id);
}

bool ProcessAlive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

Result<Digest128> HashFile(const std::string& path, uint64_t* size) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  Hasher h;
  std::vector<char> buf(1 << 20);
  uint64_t off = 0;
  while (true) {
    auto n = PreadFull(fd.get(), buf, off);
    if (!n.ok()) return n.status().Annotate(StrCat("read ", path));
    if (*n == 0) break;
    h.Update(std::span<const char>(buf.data(), *n));
    off += *n;
  }
  *size = off;
  return h.Finish();
}

}  // namespace

uint64_t ChunkCache::Handle::size() const { return chunk_ ? chunk_->size : 0; }

Result<size_t> ChunkCache::Handle::Read(uint64_t offset, std::span<char> out) const {
  if (!chunk_) return Error(EINVAL, "read of an empty chunk handle");
  if (offset >= chunk_->size) return size_t{0};
  size_t want = static_cast<size_t>(std::min<uint64_t>(out.size(), chunk_->size - offset));
  if (!chunk_->on_disk.load(std::memory_order_acquire)) {
    if (auto bytes = chunk_->bytes.load()) {
      std::memcpy(out.data(), bytes->data() + offset, want);
      return want;
    }
    // (cleared after `on_disk` was set: the file is there)
  }
  return PreadFull(chunk_->fd.get(), out.first(want), offset);
}

ChunkCache::ChunkCache(const ChunkCacheOptions& options) : options_(options) {}

Result<std::unique_ptr<ChunkCache>> ChunkCache::Open(const ChunkCacheOptions& options) {
  if (options.dir.empty()) return Error(EINVAL, "open chunk cache: no directory given");
  std::unique_ptr<ChunkCache> cache(new ChunkCache(options));
  Status s = cache->Init();
  if (!s.ok()) return s.Annotate(StrCat("open chunk cache ", options.dir));
  return cache;
}

std::string ChunkCache::DataPath(const Digest128& id) const {
  std::string hex = id.Hex();
  return StrCat(options_.dir, "/data/", hex.substr(0, 2), "/", hex);
}

Status ChunkCache::OpenIndex() {
  LmdbEnv::Options o;
  o.map_size = options_.map_size;
  // The index is rebuilt from data/ when it is damaged, so it need not be
  // synced on every commit; SyncToDisk() flushes it with the chunk files.
  o.flags = MDB_NOSYNC;
  STRATA_ASSIGN_OR_RETURN(env_, LmdbEnv::Open(options_.dir + "/index", o));
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  STRATA_ASSIGN_OR_RETURN(chunks_db_, txn.OpenDb("chunks", MDB_CREATE));
  STRATA_ASSIGN_OR_RETURN(lru_db_, txn.OpenDb("lru", MDB_CREATE));
  STRATA_ASSIGN_OR_RETURN(meta_db_, txn.OpenDb("meta", MDB_CREATE));
  return txn.Commit();
}

Status ChunkCache::Init() {
  for (const char* sub : {"", "/data", "/tmp", "/index"}) {
    STRATA_RETURN_IF_ERROR(MakeDirs(options_.dir + sub));
  }
  STRATA_ASSIGN_OR_RETURN(lock_fd_, OpenFile(options_.dir + "/lock", O_RDWR | O_CREAT, 0644));
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) == 0) {
    // Nobody else has the directory open: reconcile it before use.
    bool rebuilt = false;
    Status s = Recover(&rebuilt);
    if (!s.ok()) return s.Annotate("recover");
    if (rebuilt) STRATA_LOG(kWarn) << "chunk cache " << options_.dir << ": index was damaged and has been rebuilt";
    if (::flock(lock_fd_.get(), LOCK_SH) != 0) return ErrnoError(errno, "lock " + options_.dir + "/lock");
  } else {
    if (errno != EWOULDBLOCK) return ErrnoError(errno, "lock " + options_.dir + "/lock");
    // Another process has it open (or is recovering it): wait, then join.
    if (::flock(lock_fd_.get(), LOCK_SH) != 0) return ErrnoError(errno, "lock " + options_.dir + "/lock");
    STRATA_RETURN_IF_ERROR(OpenIndex());
  }
  pool_ = std::make_unique<ThreadPool>(std::max<size_t>(1, options_.fetch_threads),
                                       std::min(options_.max_background, std::max<size_t>(1, options_.fetch_threads - 1)));
  maintainer_ = std::thread([this] { Maintain(); });
  return OkStatus();
}

Status ChunkCache::Recover(bool* rebuilt) {
  // 1. Temporary files of writers that are gone.
  if (DIR* dir = ::opendir((options_.dir + "/tmp").c_str())) {
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      auto parts = Split(name, '.');
      pid_t pid = parts.size() == 3 ? static_cast<pid_t>(std::atoll(parts[1].c_str())) : 0;
      if (!ProcessAlive(pid) || pid == getpid()) ::unlinkat(::dirfd(dir), e->d_name, 0);
    }
    ::closedir(dir);
  }

  // 2. The index, rebuilt from scratch when LMDB cannot read it.
  Status s = OpenIndex();
  if (s.ok()) s = Reconcile(false);
  if (s.ok()) return OkStatus();
  STRATA_LOG(kWarn) << "chunk cache " << options_.dir << ": " << s.ToString() << "; rebuilding the index";
  env_ = LmdbEnv();
  STRATA_RETURN_IF_ERROR(RemoveTree(options_.dir + "/index"));
  STRATA_RETURN_IF_ERROR(MakeDirs(options_.dir + "/index"));
  STRATA_RETURN_IF_ERROR(OpenIndex());
  *rebuilt = true;
  return Reconcile(true);
}

// Makes the index describe exactly the chunk files in data/.
Status ChunkCache::Reconcile(bool rebuilt) {
  // 3. After a reboot, chunks written since the last sync may be torn.
  std::string boot = BootId();
  uint64_t synced_at = 0;
  bool rebooted = false;
  {
    STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, true));
    auto stored_boot = txn.Get(meta_db_, kBootKey);
    auto synced = txn.Get(meta_db_, kSyncedKey);
    if (synced.ok()) synced_at = ReadU64(*synced);
    rebooted = stored_boot.ok() ? *stored_boot != boot : rebuilt;
  }
  const uint64_t suspect_after_us = synced_at > 2'000'000 ? synced_at - 2'000'000 : 0;

  // 4. What data/ really holds.
  struct Found {
    uint64_t size;
    uint64_t mtime_us;
  };
  std::unordered_map<Digest128, Found, Digest128Hash> found;
  const std::string data_dir = options_.dir + "/data";
  if (DIR* top = ::opendir(data_dir.c_str())) {
    std::vector<std::string> subdirs;
    while (dirent* e = ::readdir(top)) {
      if (e->d_name[0] != '.') subdirs.push_back(e->d_name);
    }
    ::closedir(top);
    for (const auto& sub : subdirs) {
      const std::string sub_path = data_dir + "/" + sub;
      DIR* dir = ::opendir(sub_path.c_str());
      if (!dir) continue;
      std::vector<std::string> names;
      while (dirent* e = ::readdir(dir)) {
        if (e->d_name[0] != '.') names.push_back(e->d_name);
      }
      ::closedir(dir);
      for (const auto& name : names) {
        const std::string path = sub_path + "/" + name;
        auto id = Digest128::FromHex(name);
        struct stat st;
        if (!id || name.substr(0, 2) != sub || ::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
          ::unlink(path.c_str());  // not ours
          continue;
        }
        uint64_t mtime_us = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1'000'000 +
                            static_cast<uint64_t>(st.st_mtim.tv_nsec) / 1000;
        if (rebooted && mtime_us >= suspect_after_us) {
          uint64_t size = 0;
          auto h = HashFile(path, &size);
          if (!h.ok() || *h != *id) {
            STRATA_LOG(kWarn) << "chunk cache " << options_.dir << ": dropping chunk " << name
                              << " written before an unclean reboot: content does not match its name";
            ::unlink(path.c_str());
            continue;
          }
        }
        found[*id] = {static_cast<uint64_t>(st.st_size), mtime_us};
      }
    }
  }

  // 5. Make the index say exactly that.
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  std::vector<std::pair<std::string, std::string>> stale;  // (chunk key, lru key)
  std::unordered_set<Digest128, Digest128Hash> indexed;
  {
    STRATA_ASSIGN_OR_RETURN(LmdbCursor cursor, LmdbCursor::Open(txn, chunks_db_));
    std::string_view k, v;
    while (true) {
      STRATA_ASSIGN_OR_RETURN(bool more, cursor.Next(&k, &v));
      if (!more) break;
      if (k.size() != 16) {
        stale.emplace_back(std::string(k), "");
        continue;
      }
      Digest128 id = IdFromKey(k);
      auto it = found.find(id);
      if (it == found.end() || it->second.size != ReadU64(v, 0)) {
        stale.emplace_back(std::string(k), LruKey(ReadU64(v, 8), id));
        if (it != found.end()) found.erase(it);  // size disagrees: re-adopt below with the real size
      } else {
        indexed.insert(id);
      }
    }
  }
  for (const auto& [ck, lk] : stale) {
    STRATA_RETURN_IF_ERROR(txn.Del(chunks_db_, ck));
    if (!lk.empty()) STRATA_RETURN_IF_ERROR(txn.Del(lru_db_, lk));
  }
  uint64_t total = 0;
  for (const auto& [id, f] : found) {
    total += f.size;
    if (indexed.count(id)) continue;
    STRATA_RETURN_IF_ERROR(txn.Put(chunks_db_, IdKey(id), EntryValue(f.size, f.mtime_us)));
    STRATA_RETURN_IF_ERROR(txn.Put(lru_db_, LruKey(f.mtime_us, id), ""));
  }
  STRATA_RETURN_IF_ERROR(txn.Put(meta_db_, kBytesKey, U64(total)));
  STRATA_RETURN_IF_ERROR(txn.Put(meta_db_, kBootKey, boot));
  STRATA_RETURN_IF_ERROR(txn.Commit());
  if (options_.capacity_bytes && total > options_.capacity_bytes) {
    STRATA_RETURN_IF_ERROR(EvictTo(options_.capacity_bytes / 100 * kLowWaterPercent));
  }
  return SyncToDisk();
}

ChunkCache::~ChunkCache() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;  // completions that run while the pool drains start nothing
  }
  pool_.reset();  // no fetch runs past this point
  {
    std::lock_guard lock(maintain_mu_);
    stopping_ = true;
  }
  maintain_cv_.notify_all();
  if (maintainer_.joinable()) maintainer_.join();
  if (env_.get()) {
    Flush().IgnoreError();
    SyncToDisk().IgnoreError();
  }
}

std::shared_ptr<ChunkCache::OpenChunk> ChunkCache::OpenCached(const Digest128& id) {
  int fd = ::open(DataPath(id).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  auto chunk = std::make_shared<OpenChunk>();
  chunk->fd.reset(fd);
  chunk->on_disk.store(true, std::memory_order_relaxed);  // (published with the chunk)
  struct stat st;
  if (::fstat(fd, &st) != 0) return nullptr;
  chunk->size = static_cast<uint64_t>(st.st_size);
  return chunk;
}

void ChunkCache::Touch(const Digest128& id) { touched_[id] = NowMicros(); }

Result<ChunkCache::Handle> ChunkCache::Get(const Digest128& id, const std::shared_ptr<ObjectStore>& store,
                                           uint64_t size) {
  {
    std::lock_guard lock(mu_);
    if (auto it = open_.find(id); it != open_.end()) {
      ++stats_.hits;
      Touch(id);
      return Handle(it->second);
    }
  }
  if (auto chunk = OpenCached(id)) {
    std::lock_guard lock(mu_);
    auto [it, inserted] = open_.emplace(id, chunk);
    if (open_.size() > options_.max_open_files) {
      // Drop descriptors nobody holds, down to three quarters of the limit.
      for (auto o = open_.begin(); o != open_.end() && open_.size() > options_.max_open_files * 3 / 4;) {
        if (o->second.use_count() == 1 && o->first != id) o = open_.erase(o);
        else ++o;
      }
    }
    ++stats_.hits;
    Touch(id);
    return Handle(it->second);
  }
  bool leader = false;
  std::shared_ptr<Flight> flight = StartFetch(id, store, size, /*background=*/false, &leader);
  std::unique_lock lock(flight->mu);
  if (!flight->cv.wait_for(lock, options_.fetch_deadline, [&] { return flight->done; })) {
    lock.unlock();
    std::lock_guard stats_lock(mu_);
    ++stats_.timeouts;
    return Error(ETIMEDOUT, StrCat("fetch chunk ", id.Hex(), " from ", store->url(), ": no answer within ",
                                   std::chrono::duration_cast<std::chrono::milliseconds>(options_.fetch_deadline).count(),
                                   " ms"));
  }
  if (!flight->status.ok()) return flight->status;
  return leader ? Handle(flight->chunk, flight->fetched_bytes) : Handle(flight->chunk);
}

std::shared_ptr<ChunkCache::Flight> ChunkCache::StartFetch(const Digest128& id,
                                                           const std::shared_ptr<ObjectStore>& store, uint64_t size,
                                                           bool background, bool* leader, FetchDone on_done) {
  std::shared_ptr<Flight> flight;
  bool submit = false;
  {
    std::lock_guard lock(mu_);
    if (closing_) {
      // The pool is draining (a prefetch's completion asked for more).
      flight = std::make_shared<Flight>();
      flight->done = true;
      flight->status = Error(ECANCELED, StrCat("fetch chunk ", id.Hex(), ": the chunk cache is closing"));
      return flight;
    }
    auto it = inflight_.find(id);
    if (it != inflight_.end()) {
      flight = it->second;
      if (!background) {
        ++stats_.joined;
        // A waiting reader must not queue behind prefetches: add an urgent job.
        if (flight->background && !flight->promoted && !flight->started.load()) {
          flight->promoted = true;
          submit = true;
        }
      }
    } else if (auto done = open_.find(id); done != open_.end()) {
      // Another fetch finished between the caller's look into the cache and
      // now (it put the chunk in open_ as it left inflight_, under mu_).
      flight = std::make_shared<Flight>();
      flight->done = true;
      flight->chunk = done->second;
      if (!background) ++stats_.hits;
      Touch(id);
      return flight;
    } else {
      flight = std::make_shared<Flight>();
      flight->background = background;
      flight->on_done = std::move(on_done);
      inflight_.emplace(id, flight);
      *leader = true;
      submit = true;
      if (background) ++stats_.prefetches;
      else ++stats_.misses;
    }
    if (submit) ++jobs_;  // with the flight, so WaitForFetches() sees both or neither
  }
  if (submit) {
    // A promotion (a Get joining a queued prefetch) is never background.
    auto priority = background ? ThreadPool::Priority::kBackground : ThreadPool::Priority::kUrgent;
    pool_->Submit(
        [this, id, size, store = std::shared_ptr<ObjectStore>(store), flight]() mutable {
          FetchDone callback;
          uint64_t fetched = 0;
          if (RunFetch(id, *store, size, flight)) {
            callback = std::move(flight->on_done);
            std::lock_guard lock(flight->mu);
            if (flight->status.ok()) fetched = flight->fetched_bytes;
          }
          // Let go of the flight (and the chunk it holds) before counting the
          // job as done, so WaitForFetches() means nothing is pinned by us.
          flight.reset();
          store.reset();
          if (callback) callback(fetched);
          std::lock_guard lock(mu_);
          if (--jobs_ == 0) idle_cv_.notify_all();
        },
        priority);
  }
  return flight;
}

bool ChunkCache::RunFetch(const Digest128& id, ObjectStore& store, uint64_t size,
                          const std::shared_ptr<Flight>& flight) {
  if (flight->started.exchange(true)) return false;  // the other job of a promoted flight ran
  Status status;
  std::shared_ptr<OpenChunk> chunk;
  std::shared_ptr<const std::string> bytes;
  bool corrupt = false, compressed = false;
  uint64_t fetched = 0, decoded = 0;
  auto raw = GetChunk(store, id, size);
  if (!raw.ok()) {
    status = std::move(raw).status();
    corrupt = status.code() == EBADMSG;
    STRATA_LOG(kWarn) << status.ToString();
  } else {
    fetched = raw->stored_size;
    compressed = raw->compressed;
    decoded = raw->bytes.size();
    bytes = std::make_shared<const std::string>(std::move(raw->bytes));
    chunk = std::make_shared<OpenChunk>();
    chunk->size = decoded;
    chunk->bytes.store(bytes);
  }
  // The waiters get the checked bytes now; the cache file is written after.
  {
    std::lock_guard lock(mu_);
    inflight_.erase(id);
    ++stats_.fetches;
    stats_.bytes_fetched += fetched;
    stats_.bytes_decoded += decoded;
    if (compressed) ++stats_.compressed;
    if (!status.ok()) ++stats_.fetch_errors;
    if (corrupt) ++stats_.corrupt;
    if (chunk) {
      open_[id] = chunk;
      Touch(id);
    }
  }
  {
    std::lock_guard lock(flight->mu);
    flight->done = true;
    flight->status = status;
    flight->chunk = chunk;
    flight->fetched_bytes = fetched;
  }
  flight->cv.notify_all();
  if (!status.ok()) return true;

  MakeRoom(decoded);
  auto file = Insert(id, *bytes);
  if (file.ok()) {
    chunk->fd = std::move((*file)->fd);
    chunk->on_disk.store(true, std::memory_order_release);
    chunk->bytes.store(nullptr);  // readers holding `bytes` keep them until done
  } else {
    // Served, but not cached: the next reader fetches it again.
    STRATA_LOG(kWarn) << file.status().Annotate(StrCat("cache chunk ", id.Hex())).ToString();
    std::lock_guard lock(mu_);
    if (auto it = open_.find(id); it != open_.end() && it->second == chunk) open_.erase(it);
    return true;
  }
  chunk.reset();  // the waiters hold it now; do not pin it through the eviction below

  // Above the high-water mark, evict down to the low-water mark now, after
  // the waiters have their chunk, so most inserts find room ready.
  if (options_.capacity_bytes) {
    auto usage = Usage();
    if (usage.ok() && usage->bytes > options_.capacity_bytes / 100 * kHighWaterPercent) {
      Status s = EvictTo(options_.capacity_bytes / 100 * kLowWaterPercent);
      if (!s.ok()) STRATA_LOG(kWarn) << "chunk cache " << options_.dir << ": evict: " << s.ToString();
    }
  }
  return true;
}

void ChunkCache::MakeRoom(uint64_t incoming) {
  if (!options_.capacity_bytes) return;
  auto usage = Usage();
  if (!usage.ok() || usage->bytes + incoming <= options_.capacity_bytes) return;
  uint64_t room = incoming + options_.capacity_bytes / 100;
  Status s = EvictTo(options_.capacity_bytes > room ? options_.capacity_bytes - room : 0);
  if (!s.ok()) STRATA_LOG(kWarn) << "chunk cache " << options_.dir << ": evict: " << s.ToString();
}

Result<std::shared_ptr<ChunkCache::OpenChunk>> ChunkCache::Insert(const Digest128& id, std::string_view data) {
  const std::string hex = id.Hex();
  const std::string tmp = StrCat(options_.dir, "/tmp/", hex, ".", getpid(), ".", tmp_counter_.fetch_add(1));
  auto chunk = std::make_shared<OpenChunk>();
  chunk->size = data.size();
  {
    STRATA_ASSIGN_OR_RETURN(chunk->fd, OpenFile(tmp, O_RDWR | O_CREAT | O_EXCL, 0644));
    Status s = WriteFull(chunk->fd.get(), data);
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s.Annotate(StrCat("write ", tmp));
    }
  }
  const std::string final_path = DataPath(id);
  // The rename happens inside the write transaction: LMDB's writer lock
  // orders it against evictions in other processes.
  auto txn = LmdbTxn::Begin(env_, false);
  if (!txn.ok()) {
    ::unlink(tmp.c_str());
    return txn.status();
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    Status s;
    if (errno == ENOENT) s = MakeDirs(Dirname(final_path));
    if (s.ok() && ::rename(tmp.c_str(), final_path.c_str()) != 0) s = ErrnoError(errno, StrCat("rename into ", final_path));
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
  }
  const uint64_t now = NowMicros();
  STRATA_ASSIGN_OR_RETURN(bool inserted, txn->Put(chunks_db_, IdKey(id), EntryValue(data.size(), now), MDB_NOOVERWRITE));
  if (inserted) {
    STRATA_RETURN_IF_ERROR(txn->Put(lru_db_, LruKey(now, id), ""));
    auto bytes = txn->Get(meta_db_, kBytesKey);
    uint64_t total = (bytes.ok() ? ReadU64(*bytes) : 0) + data.size();
    STRATA_RETURN_IF_ERROR(txn->Put(meta_db_, kBytesKey, U64(total)));
  }
  STRATA_RETURN_IF_ERROR(txn->Commit());
  return chunk;
}

bool ChunkCache::Pinned(const Digest128& id) {
  std::lock_guard lock(mu_);
  if (inflight_.count(id) || touched_.count(id)) return true;
  auto it = open_.find(id);
  return it != open_.end() && it->second.use_count() > 1;
}

Status ChunkCache::EvictTo(uint64_t target_bytes) {
  // One eviction at a time per process; across processes LMDB's writer lock orders them.
  static std::mutex evict_mu;
  std::lock_guard evict_lock(evict_mu);
  STRATA_RETURN_IF_ERROR(Flush());
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  auto bytes = txn.Get(meta_db_, kBytesKey);
  uint64_t total = bytes.ok() ? ReadU64(*bytes) : 0;
  if (total <= target_bytes) return OkStatus();

  struct Victim {
    std::string lru_key;
    Digest128 id;
    uint64_t size;
  };
  std::vector<Victim> victims;
  {
    STRATA_ASSIGN_OR_RETURN(LmdbCursor cursor, LmdbCursor::Open(txn, lru_db_));
    std::string_view k, v;
    uint64_t remaining = total;
    while (remaining > target_bytes) {
      STRATA_ASSIGN_OR_RETURN(bool more, cursor.Next(&k, &v));
      if (!more) break;
      if (k.size() != 24) continue;
      Digest128 id = IdFromKey(k.substr(8));
      if (Pinned(id)) continue;
      auto entry = txn.Get(chunks_db_, IdKey(id));
      uint64_t size = entry.ok() ? ReadU64(*entry, 0) : 0;
      victims.push_back({std::string(k), id, size});
      remaining -= std::min(remaining, size);
    }
  }
  uint64_t evicted_bytes = 0;
  for (const auto& v : victims) {
    STRATA_RETURN_IF_ERROR(txn.Del(lru_db_, v.lru_key));
    STRATA_RETURN_IF_ERROR(txn.Del(chunks_db_, IdKey(v.id)));
    if (::unlink(DataPath(v.id).c_str()) != 0 && errno != ENOENT) {
      return ErrnoError(errno, StrCat("evict ", DataPath(v.id)));
    }
    evicted_bytes += v.size;
  }
  total -= std::min(total, evicted_bytes);
  STRATA_RETURN_IF_ERROR(txn.Put(meta_db_, kBytesKey, U64(total)));
  STRATA_RETURN_IF_ERROR(txn.Commit());
  std::lock_guard lock(mu_);
  for (const auto& v : victims) {
    auto it = open_.find(v.id);
    if (it != open_.end() && it->second.use_count() == 1) open_.erase(it);
  }
  stats_.evictions += victims.size();
  stats_.bytes_evicted += evicted_bytes;
  return OkStatus();
}

Status ChunkCache::Flush() {
  std::unordered_map<Digest128, uint64_t, Digest128Hash> touched;
  {
    std::lock_guard lock(mu_);
    touched.swap(touched_);
  }
  if (touched.empty()) return OkStatus();
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  for (const auto& [id, atime] : touched) {
    auto entry = txn.Get(chunks_db_, IdKey(id));
    if (!entry.ok()) continue;  // evicted meanwhile, or by another process
    uint64_t size = ReadU64(*entry, 0), old = ReadU64(*entry, 8);
    if (atime <= old) continue;
    STRATA_RETURN_IF_ERROR(txn.Del(lru_db_, LruKey(old, id)));
    STRATA_RETURN_IF_ERROR(txn.Put(lru_db_, LruKey(atime, id), ""));
    STRATA_RETURN_IF_ERROR(txn.Put(chunks_db_, IdKey(id), EntryValue(size, atime)));
  }
  return txn.Commit();
}

Status ChunkCache::SyncToDisk() {
  const uint64_t started = NowMicros();
  UniqueFd fd(::open((options_.dir + "/data").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd || ::syncfs(fd.get()) != 0) return ErrnoError(errno, "syncfs " + options_.dir);
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  STRATA_RETURN_IF_ERROR(txn.Put(meta_db_, kSyncedKey, U64(started)));
  STRATA_RETURN_IF_ERROR(txn.Commit());
  return env_.Sync();
}

void ChunkCache::Maintain() {
  auto next_sync = std::chrono::steady_clock::now() + kSyncInterval;
  std::unique_lock lock(maintain_mu_);
  while (!stopping_) {
    maintain_cv_.wait_for(lock, kTouchFlushInterval);
    if (stopping_) break;
    lock.unlock();
    DropServedPages();
    Status s = Flush();
    if (s.ok() && std::chrono::steady_clock::now() >= next_sync) {
      s = SyncToDisk();
      next_sync = std::chrono::steady_clock::now() + kSyncInterval;
    }
    if (!s.ok()) STRATA_LOG(kWarn) << "chunk cache " << options_.dir << ": " << s.ToString();
    lock.lock();
  }
}

void ChunkCache::DropWhenIdle(const Digest128& id) {
  std::lock_guard lock(served_mu_);
  served_[id] = {NowMs(), false};
}

void ChunkCache::DropServedPages() {
  const uint64_t idle_ms =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(options_.served_idle).count());
  std::vector<std::pair<Digest128, bool>> due;  // id, written back already
  {
    std::lock_guard lock(served_mu_);
    const uint64_t now = NowMs();  // under the lock: no entry is newer
    for (auto it = served_.begin(); it != served_.end();) {
      if (it->second.last_ms + idle_ms > now) {
        ++it;
        continue;
      }
      due.emplace_back(it->first, it->second.written_back);
      if (it->second.written_back) {
        it = served_.erase(it);
      } else {
        it->second = {now, true};
        ++it;
      }
    }
  }
  // Dirty pages cannot be dropped: first start their writeback, then, a
  // pass later, wait for whatever of it is left (this thread only) and drop
  // the clean pages. A chunk evicted meanwhile has no file.
  for (const auto& [id, written_back] : due) {
    UniqueFd fd(::open(DataPath(id).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) continue;
    if (written_back) {
      ::sync_file_range(fd.get(), 0, 0,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
    } else {
      ::sync_file_range(fd.get(), 0, 0, SYNC_FILE_RANGE_WRITE);
    }
  }
}

Result<size_t> ChunkCache::Read(const Digest128& id, const std::shared_ptr<ObjectStore>& store, uint64_t offset,
                                std::span<char> out) {
  STRATA_ASSIGN_OR_RETURN(Handle h, Get(id, store));
  return h.Read(offset, out);
}

bool ChunkCache::Prefetch(const Digest128& id, const std::shared_ptr<ObjectStore>& store, uint64_t size,
                          FetchDone done, std::vector<Digest128>* on_disk) {
  std::shared_ptr<OpenChunk> open;
  {
    std::lock_guard lock(mu_);
    if (closing_ || inflight_.count(id)) return false;
    if (auto it = open_.find(id); it != open_.end()) open = it->second;
  }
  // Cached on disk: nothing to fetch, but a reader is on its way (a walk's
  // readahead, an access list), so the file is read into memory ahead of it
  // rather than a read at a time when each request comes. (A chunk open
  // here too: its pages were dropped once it was served, DropWhenIdle.)
  if (open && !open->on_disk.load(std::memory_order_acquire)) return false;  // its bytes are in memory
  if (on_disk) {
    if (!open && ::access(DataPath(id).c_str(), F_OK) != 0) return StartBackgroundFetch(id, store, size, std::move(done));
    on_disk->push_back(id);
    return false;
  }
  return !ReadAheadOnDisk(id, open) && StartBackgroundFetch(id, store, size, std::move(done));
}

bool ChunkCache::ReadAheadOnDisk(const Digest128& id, const std::shared_ptr<OpenChunk>& open) {
  UniqueFd opened;
  int fd = -1;
  if (open) {
    if (open->on_disk.load(std::memory_order_acquire)) fd = open->fd.get();
  } else if ((opened = UniqueFd(::open(DataPath(id).c_str(), O_RDONLY | O_CLOEXEC)))) {
    fd = opened.get();
  }
  if (fd < 0) return false;
  ReadFileAhead(fd);
  std::lock_guard lock(mu_);
  ++stats_.disk_readaheads;
  return true;
}

bool ChunkCache::StartBackgroundFetch(const Digest128& id, const std::shared_ptr<ObjectStore>& store, uint64_t size,
                                      FetchDone done) {
  bool leader = false;
  StartFetch(id, store, size, /*background=*/true, &leader, std::move(done));
  return leader;
}

void ChunkCache::ReadAhead(std::vector<Digest128> ids, size_t from) {
  if (from >= ids.size()) return;
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    ++jobs_;
  }
  // A slice per job, the rest queued again behind it: a long list holds a
  // background worker for a slice's reads at a time, not for all of them.
  constexpr size_t kSlice = 64;
  pool_->Submit(
      [this, ids = std::move(ids), from]() mutable {
        const size_t end = std::min(ids.size(), from + kSlice);
        for (size_t k = from; k < end; ++k) {
          std::shared_ptr<OpenChunk> open;
          {
            std::lock_guard lock(mu_);
            if (closing_) break;
            if (auto it = open_.find(ids[k]); it != open_.end()) open = it->second;
          }
          ReadAheadOnDisk(ids[k], open);  // (evicted meanwhile, or its bytes in memory: nothing to read)
        }
        ReadAhead(std::move(ids), end);  // (counts its job before this one ends)
        std::lock_guard lock(mu_);
        if (--jobs_ == 0) idle_cv_.notify_all();
      },
      ThreadPool::Priority::kBackground);
}

bool ChunkCache::Contains(const Digest128& id) {
  {
    std::lock_guard lock(mu_);
    if (open_.count(id)) return true;
  }
  return ::access(DataPath(id).c_str(), F_OK) == 0;
}

ChunkCacheStats ChunkCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

Result<ChunkCacheUsage> ChunkCache::Usage() {
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, true));
  ChunkCacheUsage usage;
  usage.capacity = options_.capacity_bytes;
  auto bytes = txn.Get(meta_db_, kBytesKey);
  usage.bytes = bytes.ok() ? ReadU64(*bytes) : 0;
  MDB_stat st;
  if (int rc = mdb_stat(txn.get(), chunks_db_, &st); rc != 0) return LmdbError(rc, "stat chunk index");
  usage.chunks = st.ms_entries;
  return usage;
}

Status ChunkCache::Trim(uint64_t target_bytes) { return EvictTo(target_bytes); }

void ChunkCache::WaitForFetches() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return jobs_ == 0; });
}

Result<VerifyReport> ChunkCache::Verify() {
  VerifyReport report;
  std::vector<std::pair<Digest128, uint64_t>> entries;  // id, indexed size
  {
    STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, true));
    STRATA_ASSIGN_OR_RETURN(LmdbCursor cursor, LmdbCursor::Open(txn, chunks_db_));
    std::string_view k, v;
    while (true) {
      STRATA_ASSIGN_OR_RETURN(bool more, cursor.Next(&k, &v));
      if (!more) break;
      if (k.size() == 16) entries.emplace_back(IdFromKey(k), ReadU64(v, 0));
    }
  }
  std::vector<Digest128> bad;
  for (const auto& [id, size] : entries) {
    uint64_t actual_size = 0;
    auto h = HashFile(DataPath(id), &actual_size);
    ++report.checked;
    if (!h.ok()) {
      ++report.missing;
      bad.push_back(id);
    } else if (*h != id || actual_size != size) {
      ++report.corrupt;
      STRATA_LOG(kWarn) << "chunk cache " << options_.dir << ": chunk " << id.Hex() << " is corrupt; removed";
      bad.push_back(id);
    } else {
      report.bytes += actual_size;
    }
  }
  if (!bad.empty()) {
    STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
    auto bytes = txn.Get(meta_db_, kBytesKey);
    uint64_t total = bytes.ok() ? ReadU64(*bytes) : 0;
    for (const auto& id : bad) {
      auto entry = txn.Get(chunks_db_, IdKey(id));
      if (!entry.ok()) continue;
      total -= std::min(total, ReadU64(*entry, 0));
      STRATA_RETURN_IF_ERROR(txn.Del(lru_db_, LruKey(ReadU64(*entry, 8), id)));
      STRATA_RETURN_IF_ERROR(txn.Del(chunks_db_, IdKey(id)));
      ::unlink(DataPath(id).c_str());
    }
    STRATA_RETURN_IF_ERROR(txn.Put(meta_db_, kBytesKey, U64(total)));
    STRATA_RETURN_IF_ERROR(txn.Commit());
    std::lock_guard lock(mu_);
    for (const auto& id : bad) open_.erase(id);
  }
  return report;
}

}  // namespace strata::cache
