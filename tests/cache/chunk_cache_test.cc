#include "cache/chunk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cache/chunk_codec.h"
#include "common/fs.h"
#include "common/lmdb.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/test_util.h"

namespace strata::cache {
namespace {

using namespace std::chrono_literals;
using testing::FaultyStore;
using testing::MakeTempDir;
using testing::RandomBytes;

class ChunkCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto inner = OpenStore("file://" + store_dir_.path());
    ASSERT_TRUE(inner.ok());
    inner_ = *inner;
    store_ = std::make_shared<FaultyStore>(inner_);
  }

  // Puts `data` into the store under its content name.
  Digest128 PutChunk(const std::string& data) {
    Digest128 id = HashBytes(data);
    EXPECT_OK(inner_->Put(ChunkKey(id), data));
    return id;
  }

  std::unique_ptr<ChunkCache> OpenCache(ChunkCacheOptions options = {}) {
    options.dir = cache_dir_.path();
    auto cache = ChunkCache::Open(options);
    EXPECT_TRUE(cache.ok()) << cache.status().ToString();
    return cache.ok() ? std::move(*cache) : nullptr;
  }

  std::string ReadAll(ChunkCache& cache, const Digest128& id) {
    auto h = cache.Get(id, store_);
    if (!h.ok()) return "error: " + h.status().ToString();
    std::string out(h->size(), '\0');
    auto n = h->Read(0, out);
    return n.ok() ? out.substr(0, *n) : "error: " + n.status().ToString();
  }

  // Files under data/: count and bytes.
  std::pair<uint64_t, uint64_t> DataFiles() {
    uint64_t files = 0, bytes = 0;
    std::string data = cache_dir_.Sub("data");
    DIR* top = ::opendir(data.c_str());
    if (!top) return {0, 0};
    while (dirent* e = ::readdir(top)) {
      if (e->d_name[0] == '.') continue;
      std::string sub = data + "/" + e->d_name;
      DIR* d = ::opendir(sub.c_str());
      while (d && (e = ::readdir(d))) {
        if (e->d_name[0] == '.') continue;
        struct stat st;
        ::stat((sub + "/" + e->d_name).c_str(), &st);
        ++files;
        bytes += static_cast<uint64_t>(st.st_size);
      }
      if (d) ::closedir(d);
    }
    ::closedir(top);
    return {files, bytes};
  }

  // The index and data/ agree, and every chunk matches its name.
  void ExpectConsistent(ChunkCache& cache) {
    cache.WaitForFetches();
    ASSERT_OK_AND_ASSIGN(VerifyReport report, cache.Verify());
    EXPECT_EQ(report.corrupt, 0u);
    EXPECT_EQ(report.missing, 0u);
    ASSERT_OK_AND_ASSIGN(ChunkCacheUsage usage, cache.Usage());
    auto [files, bytes] = DataFiles();
    EXPECT_EQ(usage.chunks, files);
    EXPECT_EQ(usage.bytes, bytes);
    EXPECT_EQ(report.bytes, bytes);
  }

  TempDir store_dir_ = MakeTempDir();
  TempDir cache_dir_ = MakeTempDir();
  std::shared_ptr<ObjectStore> inner_;
  std::shared_ptr<FaultyStore> store_;
};

TEST_F(ChunkCacheTest, MissFetchesOnceThenHitsSurviveReopen) {
  std::string data = RandomBytes(300000, 1);
  Digest128 id = PutChunk(data);
  {
    auto cache = OpenCache();
    EXPECT_FALSE(cache->Contains(id));
    EXPECT_EQ(ReadAll(*cache, id), data);
    EXPECT_EQ(ReadAll(*cache, id), data);
    EXPECT_EQ(store_->gets(), 1);
    EXPECT_TRUE(cache->Contains(id));
    auto stats = cache->stats();
    EXPECT_EQ(stats.misses, 1u);
    EXPECT_EQ(stats.hits, 1u);
    EXPECT_EQ(stats.bytes_fetched, data.size());
  }
  auto cache = OpenCache();
  EXPECT_EQ(ReadAll(*cache, id), data);
  EXPECT_EQ(store_->gets(), 1);
  ExpectConsistent(*cache);
}

// Readers get a fetched chunk from its checked bytes, before its cache file
// is written; a chunk whose file cannot be written is still served, and
// fetched again by the next reader.
TEST_F(ChunkCacheTest, AChunkItCannotWriteIsServedAndNotKept) {
  std::string data = RandomBytes(200000, 7);
  Digest128 id = PutChunk(data);
  auto cache = OpenCache();
  // data/<2 hex> is a file: the rename into it fails (ENOTDIR).
  const std::string blocker = cache_dir_.Sub("data/" + id.Hex().substr(0, 2));
  ASSERT_OK(WriteFileAtomic(blocker, "not a directory", /*durable=*/false));
  EXPECT_EQ(ReadAll(*cache, id), data);
  cache->WaitForFetches();
  EXPECT_FALSE(cache->Contains(id));
  EXPECT_EQ(ReadAll(*cache, id), data);
  EXPECT_EQ(store_->gets(), 2);
  EXPECT_EQ(cache->stats().fetch_errors, 0u);
  cache->WaitForFetches();
  ASSERT_EQ(::unlink(blocker.c_str()), 0);
  EXPECT_EQ(ReadAll(*cache, id), data);
  EXPECT_EQ(store_->gets(), 3);
  EXPECT_TRUE(cache->Contains(id));
  ExpectConsistent(*cache);
}

TEST_F(ChunkCacheTest, ReadsARangeOfAChunk) {
  std::string data = RandomBytes(100000, 2);
  Digest128 id = PutChunk(data);
  auto cache = OpenCache();
  std::string buf(5000, '\0');
  ASSERT_OK_AND_ASSIGN(size_t n, cache->Read(id, store_, 99000, buf));
  EXPECT_EQ(n, 1000u);
  EXPECT_EQ(buf.substr(0, n), data.substr(99000));
}

TEST_F(ChunkCacheTest, ConcurrentReadersOfAMissingChunkMakeOneRequest) {
  std::string data = RandomBytes(1 << 20, 3);
  Digest128 id = PutChunk(data);
  auto cache = OpenCache();
  store_->CloseGate();
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&] { good += ReadAll(*cache, id) == data; });
  }
  while (cache->stats().joined < 63) std::this_thread::sleep_for(1ms);
  store_->OpenGate();
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 64);
  EXPECT_EQ(store_->gets(), 1);
}

TEST_F(ChunkCacheTest, SixtyFourThreadsSixtyFourChunksSixtyFourRequests) {
  std::vector<Digest128> ids;
  std::vector<std::string> datas;
  for (int i = 0; i < 64; ++i) {
    datas.push_back(RandomBytes(64 << 10, 100 + i));
    ids.push_back(PutChunk(datas.back()));
  }
  ChunkCacheOptions options;
  options.fetch_threads = 64;
  auto cache = OpenCache(options);
  store_->SetDelay(5ms);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 64; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 64; ++i) {
        int c = (i + t) % 64;
        if (ReadAll(*cache, ids[c]) != datas[c]) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(store_->gets(), 64);
}

TEST_F(ChunkCacheTest, CorruptBytesAreNeverCachedOrReturned) {
  std::string data = RandomBytes(50000, 4);
  Digest128 id = PutChunk(data);
  auto cache = OpenCache();
  store_->SetCorrupt(true);
  auto h = cache->Get(id, store_);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), EBADMSG);
  EXPECT_NE(h.status().ToString().find(id.Hex()), std::string::npos);
  EXPECT_NE(h.status().ToString().find(store_dir_.path()), std::string::npos);
  EXPECT_FALSE(cache->Contains(id));
  EXPECT_EQ(DataFiles().first, 0u);
  EXPECT_EQ(cache->stats().corrupt, 1u);

  store_->SetCorrupt(false);
  EXPECT_EQ(ReadAll(*cache, id), data);  // a later read tries again
  ExpectConsistent(*cache);
}

// Compressible bytes: the same line over and over, numbered.
std::string Compressible(size_t n) {
  std::string out;
  for (int i = 0; out.size() < n; ++i) out += StrCat("line ", i, ": the quick brown fox\n");
  out.resize(n);
  return out;
}

TEST_F(ChunkCacheTest, CompressedObjectsAreCachedAsTheirChunks) {
  std::string data = Compressible(300000);
  Digest128 id = HashBytes(data);
  std::string packed = *CompressChunk(data, Compression{});
  ASSERT_OK(inner_->Put(ChunkKey(id), packed));
  std::string raw = RandomBytes(40000, 9);
  Digest128 raw_id = PutChunk(raw);  // a mixed store
  auto cache = OpenCache();
  ASSERT_OK_AND_ASSIGN(ChunkCache::Handle h, cache->Get(id, store_, data.size()));
  EXPECT_TRUE(h.fetched());
  EXPECT_EQ(h.fetched_bytes(), packed.size());
  EXPECT_EQ(h.size(), data.size());
  EXPECT_EQ(ReadAll(*cache, id), data);
  EXPECT_EQ(ReadAll(*cache, raw_id), raw);
  // The cache holds the chunk itself, under its name (written once the
  // readers had it).
  cache->WaitForFetches();
  ASSERT_OK_AND_ASSIGN(std::string file, ReadFileToString(StrCat(cache_dir_.path(), "/data/", id.Hex().substr(0, 2),
                                                                 "/", id.Hex())));
  EXPECT_EQ(file, data);
  ChunkCacheStats st = cache->stats();
  EXPECT_EQ(st.compressed, 1u);
  EXPECT_EQ(st.bytes_fetched, packed.size() + raw.size());
  EXPECT_EQ(st.bytes_decoded, data.size() + raw.size());
  ExpectConsistent(*cache);
}

TEST_F(ChunkCacheTest, ACorruptCompressedObjectIsRefusedAndNeverCached) {
  std::string data = Compressible(200000);
  Digest128 id = HashBytes(data);
  std::string packed = *CompressChunk(data, Compression{});
  packed[packed.size() / 2] ^= 0x01;
  ASSERT_OK(inner_->Put(ChunkKey(id), packed));
  auto cache = OpenCache();
  auto h = cache->Get(id, store_, data.size());
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), EBADMSG);
  EXPECT_NE(h.status().ToString().find(id.Hex()), std::string::npos);
  EXPECT_FALSE(cache->Contains(id));
  EXPECT_EQ(DataFiles().first, 0u);
  EXPECT_EQ(cache->stats().corrupt, 1u);
  // A frame that claims another size than the manifest's is refused too.
  ASSERT_OK(inner_->Put(ChunkKey(id), *CompressChunk(data, Compression{})));
  EXPECT_EQ(cache->Get(id, store_, data.size() - 1).status().code(), EBADMSG);
  EXPECT_EQ(ReadAll(*cache, id), data);
}

// Bytes of `path` in the page cache (cachestat(2), Linux 6.5); -1 when the
// kernel cannot say.
int64_t CachedBytes(const std::string& path) {
  struct {
    uint64_t off, len;
  } range{0, 0};
  struct {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
  } st{};
  // -1: no cachestat(2) here; -2: no such file (a failure, not a skip).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return -2;
  if (::syscall(451 /* cachestat */, fd.get(), &range, &st, 0) != 0) return errno == ENOSYS ? -1 : -2;
  return static_cast<int64_t>(st.nr_cache * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
}

TEST_F(ChunkCacheTest, ServedChunksLeaveThePageCacheOnceIdle) {
  std::string data = RandomBytes(1 << 20, 12);
  Digest128 id = PutChunk(data);
  Digest128 kept = PutChunk(RandomBytes(1 << 20, 13));
  ChunkCacheOptions options;
  options.served_idle = std::chrono::milliseconds(100);
  auto cache = OpenCache(options);
  EXPECT_EQ(ReadAll(*cache, id), data);
  ASSERT_TRUE(ReadAll(*cache, kept).size() == data.size());
  cache->WaitForFetches();  // (readers get the bytes before the file is written)
  const std::string path = StrCat(cache_dir_.path(), "/data/", id.Hex().substr(0, 2), "/", id.Hex());
  const std::string kept_path = StrCat(cache_dir_.path(), "/data/", kept.Hex().substr(0, 2), "/", kept.Hex());
  if (CachedBytes(path) == -1) GTEST_SKIP() << "no cachestat(2) on this kernel";
  EXPECT_GT(CachedBytes(path), 0);  // just written and read
  cache->DropWhenIdle(id);
  for (int i = 0; i < 100 && CachedBytes(path) > 0; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(CachedBytes(path), 0);
  EXPECT_GT(CachedBytes(kept_path), 0);  // nobody said it was served
  // Dropped from memory, not from the cache: it reads back from disk.
  EXPECT_EQ(ReadAll(*cache, id), data);
  EXPECT_EQ(cache->stats().fetches, 2u);
}

TEST_F(ChunkCacheTest, APrefetchOfAChunkOnDiskReadsItsFileIntoMemory) {
  std::string data = RandomBytes(1 << 20, 14);
  Digest128 id = PutChunk(data);
  Digest128 absent = PutChunk(RandomBytes(1 << 16, 15));
  {
    auto writer = OpenCache();
    EXPECT_EQ(ReadAll(*writer, id), data);
    writer->WaitForFetches();
  }
  // The node's cache holds the chunk, its file out of memory (as after a
  // restart, or once served: ServedChunksLeaveThePageCacheOnceIdle).
  const std::string path = StrCat(cache_dir_.path(), "/data/", id.Hex().substr(0, 2), "/", id.Hex());
  if (CachedBytes(path) == -1) GTEST_SKIP() << "no cachestat(2) on this kernel";
  {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd);
    ASSERT_EQ(::fdatasync(fd.get()), 0);
    ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
  }
  ASSERT_EQ(CachedBytes(path), 0);
  auto cache = OpenCache();
  EXPECT_FALSE(cache->Prefetch(id, store_, data.size()));  // nothing to fetch
  for (int i = 0; i < 100 && CachedBytes(path) < static_cast<int64_t>(data.size()); ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(CachedBytes(path), static_cast<int64_t>(data.size()));
  EXPECT_EQ(cache->stats().disk_readaheads, 1u);
  // A chunk the node does not hold is fetched, as before.
  EXPECT_TRUE(cache->Prefetch(absent, store_));
  cache->WaitForFetches();
  EXPECT_EQ(cache->stats().fetches, 1u);
  EXPECT_EQ(cache->stats().disk_readaheads, 1u);
  // A chunk this cache has open (read before), its pages dropped since (as
  // DropWhenIdle does once it was served): read ahead too.
  EXPECT_EQ(ReadAll(*cache, id), data);
  {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd);
    ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
  }
  ASSERT_EQ(CachedBytes(path), 0);
  EXPECT_FALSE(cache->Prefetch(id, store_, data.size()));
  for (int i = 0; i < 100 && CachedBytes(path) < static_cast<int64_t>(data.size()); ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(CachedBytes(path), static_cast<int64_t>(data.size()));
  EXPECT_EQ(cache->stats().disk_readaheads, 2u);
  // For a list, the chunks on disk are named and read ahead later, together.
  {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd);
    ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
  }
  std::vector<Digest128> on_disk;
  EXPECT_FALSE(cache->Prefetch(id, store_, data.size(), nullptr, &on_disk));
  EXPECT_EQ(on_disk, std::vector<Digest128>{id});
  cache->ReadAhead(std::move(on_disk));
  cache->WaitForFetches();
  for (int i = 0; i < 100 && CachedBytes(path) < static_cast<int64_t>(data.size()); ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(CachedBytes(path), static_cast<int64_t>(data.size()));
  EXPECT_EQ(cache->stats().disk_readaheads, 3u);
  EXPECT_EQ(cache->stats().fetches, 1u);
}

TEST_F(ChunkCacheTest, AllWaitersGetTheSameErrorAndTheNextReadRetries) {
  std::string data = RandomBytes(50000, 5);
  Digest128 id = PutChunk(data);
  auto cache = OpenCache();
  store_->CloseGate();
  store_->FailNext(1, ECONNRESET);
  std::vector<std::thread> threads;
  std::vector<int> codes(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto h = cache->Get(id, store_);
      codes[i] = h.ok() ? 0 : h.status().code();
    });
  }
  while (cache->stats().joined < 7) std::this_thread::sleep_for(1ms);
  store_->OpenGate();
  for (auto& t : threads) t.join();
  for (int c : codes) EXPECT_EQ(c, ECONNRESET);
  EXPECT_EQ(store_->gets(), 1);
  EXPECT_EQ(ReadAll(*cache, id), data);
  EXPECT_EQ(store_->gets(), 2);
}

TEST_F(ChunkCacheTest, SlowStoreFailsAtTheDeadlineAndTheFetchStillLands) {
  std::string data = RandomBytes(50000, 6);
  Digest128 id = PutChunk(data);
  ChunkCacheOptions options;
  options.fetch_deadline = 200ms;
  auto cache = OpenCache(options);
  store_->SetDelay(1500ms);
  auto start = std::chrono::steady_clock::now();
  auto h = cache->Get(id, store_);
  auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), ETIMEDOUT);
  EXPECT_LT(waited, 1000ms);
  EXPECT_GE(waited, 200ms);
  // The store answers later; the chunk is cached for the next reader.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!cache->Contains(id) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  store_->SetDelay(0ms);
  EXPECT_EQ(ReadAll(*cache, id), data);
  EXPECT_EQ(store_->gets(), 1);
}

TEST_F(ChunkCacheTest, EvictsLeastRecentlyUsedToStayUnderTheCap) {
  std::vector<Digest128> ids;
  for (int i = 0; i < 30; ++i) ids.push_back(PutChunk(RandomBytes(100 << 10, 200 + i)));
  ChunkCacheOptions options;
  options.capacity_bytes = 1000 << 10;  // ten chunks
  auto cache = OpenCache(options);
  // A reader gets its chunk before the chunk's file is written and room is
  // made for it: wait for that before looking.
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(cache->Get(ids[i], store_).ok());
    cache->WaitForFetches();
  }
  std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(cache->Get(ids[0], store_).ok());  // chunk 0 is now the most recent of the first eight
  for (int i = 8; i < 30; ++i) {
    ASSERT_TRUE(cache->Get(ids[i], store_).ok());
    cache->WaitForFetches();
    ASSERT_OK_AND_ASSIGN(auto usage, cache->Usage());
    EXPECT_LE(usage.bytes, options.capacity_bytes);
    if (i == 10) {
      EXPECT_TRUE(cache->Contains(ids[0])) << "recently used chunk evicted first";
      EXPECT_FALSE(cache->Contains(ids[1]));
    }
  }
  EXPECT_GT(cache->stats().evictions, 0u);
  ExpectConsistent(*cache);
}

TEST_F(ChunkCacheTest, NeverEvictsAChunkSomeoneIsReading) {
  std::string first = RandomBytes(100 << 10, 300);
  Digest128 first_id = PutChunk(first);
  std::vector<Digest128> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(PutChunk(RandomBytes(100 << 10, 301 + i)));
  ChunkCacheOptions options;
  options.capacity_bytes = 500 << 10;
  auto cache = OpenCache(options);
  ASSERT_OK_AND_ASSIGN(ChunkCache::Handle pinned, cache->Get(first_id, store_));
  for (const auto& id : ids) ASSERT_TRUE(cache->Get(id, store_).ok());
  cache->WaitForFetches();
  ASSERT_OK(cache->Trim(0));
  EXPECT_TRUE(cache->Contains(first_id));
  std::string buf(first.size(), '\0');
  ASSERT_OK_AND_ASSIGN(size_t n, pinned.Read(0, buf));
  EXPECT_EQ(buf.substr(0, n), first);
  ASSERT_OK_AND_ASSIGN(auto usage, cache->Usage());
  EXPECT_EQ(usage.chunks, 1u);
  pinned = ChunkCache::Handle();
  ASSERT_OK(cache->Trim(0));
  EXPECT_FALSE(cache->Contains(first_id));
}

TEST_F(ChunkCacheTest, WaitingReadOvertakesQueuedPrefetches) {
  std::vector<Digest128> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(PutChunk(RandomBytes(10000, 400 + i)));
  ChunkCacheOptions options;
  options.fetch_threads = 2;
  options.max_background = 1;
  auto cache = OpenCache(options);
  store_->SetDelay(200ms);
  for (int i = 0; i < 10; ++i) cache->Prefetch(ids[i], store_);
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(cache->Get(ids[11], store_).ok());  // not prefetched
  ASSERT_TRUE(cache->Get(ids[9], store_).ok());   // queued last for prefetch
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms);
}

TEST_F(ChunkCacheTest, VerifyRemovesCorruptChunks) {
  std::string data = RandomBytes(70000, 7);
  Digest128 id = PutChunk(data);
  Digest128 other = PutChunk(RandomBytes(1000, 8));
  {
    auto cache = OpenCache();
    ASSERT_TRUE(cache->Get(id, store_).ok());
    ASSERT_TRUE(cache->Get(other, store_).ok());
  }
  std::string path = cache_dir_.Sub("data/" + id.Hex().substr(0, 2) + "/" + id.Hex());
  std::string bad = data;
  bad[10] ^= 1;
  ASSERT_OK(WriteFileAtomic(path, bad));
  auto cache = OpenCache();
  ASSERT_OK_AND_ASSIGN(VerifyReport report, cache->Verify());
  EXPECT_EQ(report.checked, 2u);
  EXPECT_EQ(report.corrupt, 1u);
  EXPECT_FALSE(cache->Contains(id));
  EXPECT_EQ(ReadAll(*cache, id), data);  // fetched again
  ExpectConsistent(*cache);
}

TEST_F(ChunkCacheTest, AfterARebootChunksWrittenSinceTheLastSyncAreRechecked) {
  std::string recent = RandomBytes(8000, 9), old = RandomBytes(8000, 10);
  Digest128 recent_id = PutChunk(recent), old_id = PutChunk(old);
  {
    auto cache = OpenCache();
    ASSERT_TRUE(cache->Get(recent_id, store_).ok());
    ASSERT_TRUE(cache->Get(old_id, store_).ok());
  }
  // Simulate power loss: the recent chunk's page-cache bytes never reached
  // the disk. The old one was written long before the last sync.
  auto path = [&](const Digest128& id) { return cache_dir_.Sub("data/" + id.Hex().substr(0, 2) + "/" + id.Hex()); };
  std::string torn(recent.size(), '\0');
  ASSERT_OK(WriteFileAtomic(path(recent_id), torn));
  struct timespec times[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path(old_id).c_str(), times, 0), 0);
  {
    ASSERT_OK_AND_ASSIGN(LmdbEnv env, LmdbEnv::Open(cache_dir_.Sub("index"), {}));
    ASSERT_OK_AND_ASSIGN(LmdbTxn txn, LmdbTxn::Begin(env, false));
    ASSERT_OK_AND_ASSIGN(MDB_dbi meta, txn.OpenDb("meta"));
    ASSERT_OK(txn.Put(meta, "boot_id", "a-previous-boot"));
    uint64_t synced = static_cast<uint64_t>(::time(nullptr) - 600) * 1000000;
    ASSERT_OK(txn.Put(meta, "synced_at", std::string(reinterpret_cast<char*>(&synced), 8)));
    ASSERT_OK(txn.Commit());
  }
  auto cache = OpenCache();
  EXPECT_FALSE(cache->Contains(recent_id));
  EXPECT_TRUE(cache->Contains(old_id));
  EXPECT_EQ(ReadAll(*cache, recent_id), recent);
  ExpectConsistent(*cache);
}

TEST_F(ChunkCacheTest, ADamagedIndexIsRebuiltFromTheChunks) {
  std::string data = RandomBytes(20000, 11);
  Digest128 id = PutChunk(data);
  {
    auto cache = OpenCache();
    ASSERT_TRUE(cache->Get(id, store_).ok());
  }
  ASSERT_OK(WriteFileAtomic(cache_dir_.Sub("index/data.mdb"), std::string(100000, 'x')));
  auto cache = OpenCache();
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(ReadAll(*cache, id), data);
  EXPECT_EQ(store_->gets(), 1);
  ExpectConsistent(*cache);
}

TEST_F(ChunkCacheTest, WritersKilledAtRandomLeaveAConsistentCache) {
  for (int i = 0; i < 120; ++i) PutChunk(RandomBytes(1000 + (i * 7919) % 60000, 500 + i));
  const std::string writer = testing::TestBinaryDir() + "/chunk_cache_writer";
  const std::string capacity = std::to_string(1 << 20);  // forces evictions all the time
  std::mt19937 rng(42);
  for (int round = 0; round < 15; ++round) {
    std::vector<Subprocess> writers;
    for (int w = 0; w < 2; ++w) {
      ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Start({.argv = {writer, cache_dir_.path(), "file://" + store_dir_.path(),
                                                                     capacity, std::to_string(round * 2 + w)},
                                                            .stdout_mode = StdStream::kNull}));
      writers.push_back(std::move(p));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 150));
    for (auto& p : writers) p.Kill(SIGKILL);
    for (auto& p : writers) {
      ASSERT_OK_AND_ASSIGN(auto r, p.Wait());
      EXPECT_EQ(r.term_signal, SIGKILL) << r.err;  // it was still running, not failed
    }
  }
  auto cache = OpenCache();
  ExpectConsistent(*cache);
  ASSERT_OK_AND_ASSIGN(auto usage, cache->Usage());
  EXPECT_GT(usage.chunks, 0u);
}

TEST_F(ChunkCacheTest, CachectlReportsVerifiesAndShrinks) {
  for (int i = 0; i < 10; ++i) {
    Digest128 id = PutChunk(RandomBytes(10000, 600 + i));
    auto cache = OpenCache();
    ASSERT_TRUE(cache->Get(id, store_).ok());
  }
  const std::string tool = testing::TestBinaryDir() + "/../../cache/cachectl";
  ASSERT_OK_AND_ASSIGN(auto stats, RunChecked({.argv = {tool, "stats", "--cache", cache_dir_.path(), "--json"}}, "stats"));
  auto j = nlohmann::json::parse(stats.out);
  EXPECT_EQ(j["chunks"], 10);
  EXPECT_EQ(j["bytes"], 100000);
  ASSERT_OK_AND_ASSIGN(auto verify, RunChecked({.argv = {tool, "--cache", cache_dir_.path(), "verify"}}, "verify"));
  EXPECT_NE(verify.out.find("checked 10 chunks"), std::string::npos);
  ASSERT_OK(RunChecked({.argv = {tool, "--cache", cache_dir_.path(), "gc", "--size", "50K"}}, "gc"));
  ASSERT_OK_AND_ASSIGN(stats, RunChecked({.argv = {tool, "--cache", cache_dir_.path(), "stats", "--json"}}, "stats"));
  EXPECT_LE(nlohmann::json::parse(stats.out)["bytes"].get<uint64_t>(), 50u * 1024);
  auto help = RunCommand({.argv = {tool, "gc", "--help"}});
  ASSERT_TRUE(help.ok());
  EXPECT_NE(help->out.find("--size"), std::string::npos);
}

}  // namespace
}  // namespace strata::cache
