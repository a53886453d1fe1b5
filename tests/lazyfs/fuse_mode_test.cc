// System tests of lazyfs's fuse mode (TreeFs: strata's own EROFS reader
// behind FUSE), held against the kernel mode's EROFS mounts of the same
// layers and against the trees they were built from.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <random>
#include <thread>

#include "cache/catalog.h"
#include "common/erofs/format.h"
#include "common/erofs/reader.h"
#include "common/fs.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "lazyfs/daemon.h"
#include "tests/lazyfs/lazyfs_fixture.h"
#include "tests/testing/test_util.h"
#include "tests/testing/tree.h"

namespace strata::lazyfs {
namespace {

using nlohmann::json;
using testing::RandomBytes;

void PutLe16(std::string& image, uint64_t offset, uint16_t v) {
  for (int i = 0; i < 2; ++i) image.at(offset + i) = static_cast<char>(v >> (8 * i));
}
void PutLe32(std::string& image, uint64_t offset, uint32_t v) {
  for (int i = 0; i < 4; ++i) image.at(offset + i) = static_cast<char>(v >> (8 * i));
}

// The root filesystem scripts/bench-rootfs makes for the benchmarks.
constexpr const char* kBenchRootfs = "/var/cache/strata/bench/debian-bookworm-python";

// `ls -lainUR` run inside `root`: names in directory order, inode numbers,
// modes, link counts, numeric owners, sizes and device numbers, full mtimes.
std::string Listing(const std::string& root) {
  auto r = RunCommand({.argv = {"ls", "-lainUR", "--time-style=full-iso", "."}, .cwd = root});
  if (!r.ok()) return "ls failed: " + r.status().ToString();
  return r->out + r->err + r->Describe();
}

// The first differing lines of two texts; empty when they are equal.
std::vector<std::string> DiffLines(const std::string& want, const std::string& got, size_t max = 10) {
  std::vector<std::string> a = Split(want, '\n'), b = Split(got, '\n'), out;
  for (size_t i = 0; i < std::max(a.size(), b.size()) && out.size() < max; ++i) {
    std::string x = i < a.size() ? a[i] : "<none>", y = i < b.size() ? b[i] : "<none>";
    if (x != y) out.push_back(StrCat("line ", i + 1, ":\n  ", x, "\n  ", y));
  }
  return out;
}

// What SnapshotTree leaves out and both modes must still agree on: inode
// numbers, block counts, block sizes.
std::vector<std::string> DiffStats(const std::string& kernel_root, const std::string& fuse_root,
                                   const testing::TreeSnapshot& paths, size_t max = 20) {
  std::vector<std::string> out;
  for (const auto& [rel, info] : paths) {
    struct stat k{}, f{};
    std::string kp = rel == "." ? kernel_root : kernel_root + "/" + rel;
    std::string fp = rel == "." ? fuse_root : fuse_root + "/" + rel;
    if (::lstat(kp.c_str(), &k) != 0 || ::lstat(fp.c_str(), &f) != 0) {
      out.push_back("lstat failed: " + Quote(rel));
    } else if (k.st_ino != f.st_ino || k.st_blocks != f.st_blocks || k.st_blksize != f.st_blksize ||
               k.st_nlink != f.st_nlink || k.st_size != f.st_size) {
      out.push_back(StrCat(Quote(rel), ": kernel ino ", k.st_ino, " blocks ", k.st_blocks, " blksize ", k.st_blksize,
                           " nlink ", k.st_nlink, " size ", k.st_size, "; fuse ino ", f.st_ino, " blocks ",
                           f.st_blocks, " blksize ", f.st_blksize, " nlink ", f.st_nlink, " size ", f.st_size));
    }
    if (out.size() >= max) break;
  }
  return out;
}

class FuseModeTest : public LazyfsTest {
 protected:
  // Mounts `ref` in both modes and holds them against each other and
  // against `src`: everything SnapshotTree sees, inode numbers, block
  // counts, directory order (ls -U) and statfs.
  void ExpectModesAgree(const std::string& src, const std::string& ref,
                        const testing::SnapshotOptions& options = {}) {
    const std::string kmnt = dir_.Sub("kernel"), fmnt = dir_.Sub("fuse");
    ASSERT_OK_AND_ASSIGN(auto k, daemon_->MountAt(ref, store_url_, kmnt, false, MountMode::kKernel));
    ASSERT_OK_AND_ASSIGN(auto f, daemon_->MountAt(ref, store_url_, fmnt, false, MountMode::kFuse));
    EXPECT_EQ(k.digest, f.digest);
    EXPECT_NE(k.path, f.path);
    ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(src, options));
    ASSERT_OK_AND_ASSIGN(auto kernel, testing::SnapshotTree(kmnt, options));
    ASSERT_OK_AND_ASSIGN(auto fuse, testing::SnapshotTree(fmnt, options));
    auto d1 = testing::DiffTrees(want, kernel);
    EXPECT_TRUE(d1.empty()) << "source vs kernel mode:\n" << Join(d1, "\n");
    auto d2 = testing::DiffTrees(want, fuse);
    EXPECT_TRUE(d2.empty()) << "source vs fuse mode:\n" << Join(d2, "\n");
    auto d3 = testing::DiffTrees(kernel, fuse);
    EXPECT_TRUE(d3.empty()) << "kernel mode vs fuse mode:\n" << Join(d3, "\n");
    auto d4 = DiffStats(kmnt, fmnt, kernel);
    EXPECT_TRUE(d4.empty()) << "kernel mode vs fuse mode:\n" << Join(d4, "\n");
    auto d5 = DiffLines(Listing(kmnt), Listing(fmnt));
    EXPECT_TRUE(d5.empty()) << "ls -lainUR, kernel mode vs fuse mode:\n" << Join(d5, "\n");
    struct statvfs ks{}, fs{};
    ASSERT_EQ(::statvfs(kmnt.c_str(), &ks), 0);
    ASSERT_EQ(::statvfs(fmnt.c_str(), &fs), 0);
    EXPECT_EQ(ks.f_bsize, fs.f_bsize);
    EXPECT_EQ(ks.f_blocks, fs.f_blocks);
    EXPECT_EQ(ks.f_files, fs.f_files);
    EXPECT_EQ(ks.f_ffree, fs.f_ffree);
    EXPECT_EQ(ks.f_namemax, fs.f_namemax);
    json stats = daemon_->Stats("");
    ASSERT_EQ(stats["layers"].size(), 2u);
    std::set<std::string> modes;
    for (const auto& l : stats["layers"]) modes.insert(l["mode"].get<std::string>());
    EXPECT_EQ(modes, (std::set<std::string>{"kernel", "fuse"}));
    EXPECT_OK(daemon_->UnmountAt(kmnt));
    EXPECT_OK(daemon_->UnmountAt(fmnt));
  }

  // Publishes a copy of the built layer whose metadata image `patch`
  // changed; returns its digest.
  Digest128 PublishPatched(const layerctl::BuiltLayer& built, const std::string& name,
                           const std::function<void(std::string&)>& patch) {
    const std::string dir = dir_.Sub("patched-" + name);
    EXPECT_OK(MakeDirs(dir));
    auto meta = ReadFileToString(JoinPath(built.dir, layerctl::kMetaFile));
    EXPECT_TRUE(meta.ok());
    patch(*meta);
    // Keep the superblock checksum right, so the damage is met past it.
    const uint64_t sb = erofs::kSuperOffset;
    const uint32_t compat = static_cast<uint8_t>((*meta)[sb + 8]) | static_cast<uint8_t>((*meta)[sb + 9]) << 8;
    if (compat & erofs::kCompatSbChecksum) {
      const uint64_t block = uint64_t{1} << static_cast<uint8_t>((*meta)[sb + offsetof(erofs::SuperBlock, blkszbits)]);
      PutLe32(*meta, sb + offsetof(erofs::SuperBlock, checksum), 0);
      PutLe32(*meta, sb + offsetof(erofs::SuperBlock, checksum),
              erofs::Crc32c(~0u, std::string_view(*meta).substr(sb, block > sb ? block - sb : block)));
    }
    EXPECT_OK(WriteFileAtomic(JoinPath(dir, layerctl::kMetaFile), *meta, false));
    EXPECT_EQ(::link(JoinPath(built.dir, layerctl::kBlobFile).c_str(), JoinPath(dir, layerctl::kBlobFile).c_str()), 0);
    layerctl::BuiltLayer patched = built;
    patched.dir = dir;
    patched.manifest.meta_hash = HashBytes(*meta);
    patched.manifest.meta_size = meta->size();
    patched.digest = patched.manifest.Digest();
    EXPECT_OK(layerctl::Push(patched, *catalog_, cache::LayerRef{name, "1"}).status());
    return patched.digest;
  }
};

TEST_F(FuseModeTest, ARichTreeIsTheSameInBothModesAndAsTheSource) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src));
  Publish(src, "rich");
  StartDaemon(Options());
  ExpectModesAgree(src, "rich:1");
}

// Busybox and the host's python3.11 with its standard library and the
// shared libraries it and its extension modules load: a small, offline
// stand-in for a real root filesystem.
Status MakePythonRoot(const std::string& root) {
  auto copy = [&](std::vector<std::string> args) -> Status {
    args.insert(args.begin(), "cp");
    args.push_back(root);
    // From /: cp --parents -a sets the copied parents' attributes by their
    // relative names.
    return RunChecked({.argv = args, .cwd = "/"}, "copy into the python root").status();
  };
  STRATA_RETURN_IF_ERROR(copy({"-L", "--parents", "/bin/busybox", "/usr/bin/python3.11"}));
  STRATA_RETURN_IF_ERROR(copy({"-a", "--parents", "/usr/lib/python3.11", "/etc/python3.11"}));
  if (::symlink("busybox", (root + "/bin/sh").c_str()) != 0) return ErrnoError(errno, "symlink sh");
  if (::symlink("python3.11", (root + "/usr/bin/python3").c_str()) != 0) return ErrnoError(errno, "symlink python3");
  // Every library python3.11 and its lib-dynload modules need, at the
  // path the loader looks for it.
  STRATA_ASSIGN_OR_RETURN(auto modules, RunChecked({.argv = {"sh", "-c",
      "ldd /usr/bin/python3.11 /usr/lib/python3.11/lib-dynload/*.so | awk '/=> \\// {print $3} /^\\t\\/lib/ {print $1}' | sort -u"}},
      "ldd"));
  std::vector<std::string> libs = {"-L", "--parents"};
  for (const auto& line : Split(modules.out, '\n')) {
    if (!line.empty()) libs.push_back(line);
  }
  if (libs.size() < 4) return Error(EINVAL, "ldd found too few libraries:\n" + modules.out);
  return copy(libs);
}

constexpr const char* kPythonImport = "import json, email, http.client, sqlite3; print(json.dumps([1, 'ok']))";

TEST_F(FuseModeTest, PythonRunsFromASmallRootFilesystemInFuseModeAndBothModesAgree) {
  for (const char* path : {"/bin/busybox", "/usr/bin/python3.11", "/usr/lib/python3.11/json/__init__.py"}) {
    if (::access(path, R_OK) != 0) GTEST_SKIP() << "needs " << path << " (busybox-static, python3: scripts/setup)";
  }
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(MakePythonRoot(src));
  Publish(src, "python");
  StartDaemon(Options());
  ExpectModesAgree(src, "python:1");

  // Cold: a fresh daemon and an empty cache.
  daemon_.reset();
  ASSERT_OK(RemoveTree(dir_.Sub("cache")));
  StartDaemon(Options());
  const std::string mnt = dir_.Sub("py");
  ASSERT_OK(daemon_->MountAt("python:1", store_url_, mnt, false, MountMode::kFuse).status());
  auto run = RunCommand({.argv = {"chroot", mnt, "/usr/bin/python3", "-c", kPythonImport}, .timeout = 60s});
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out, "[1, \"ok\"]\n");
  auto shell = RunCommand({.argv = {"chroot", mnt, "/bin/sh", "-c", "echo $((6 * 7))"}, .timeout = 60s});
  ASSERT_TRUE(shell.ok());
  EXPECT_EQ(shell->out, "42\n") << shell->err;
  // The import read a small part of the image, through the cache.
  json l = daemon_->Stats(mnt)["layers"][0];
  EXPECT_EQ(l["mode"], "fuse");
  EXPECT_GT(l["bytes_fetched"].get<uint64_t>(), 0u);
  EXPECT_LT(l["blob_fetched_percent"].get<double>(), 50.0);
  ASSERT_OK(daemon_->UnmountAt(mnt));
}

TEST_F(FuseModeTest, ADebianRootFilesystemIsTheSameInBothModesAndAsTheSource) {
  const char* env = std::getenv("STRATA_BENCH_ROOTFS");
  const std::string rootfs = env && *env ? env : kBenchRootfs;
  if (::access((rootfs + "/usr/bin/python3").c_str(), F_OK) != 0) {
    GTEST_SKIP() << "no Debian root filesystem at " << rootfs
                 << " (scripts/bench-rootfs makes one; the small python root above covers this offline)";
  }
  Publish(rootfs, "debian");
  StartDaemon(Options());
  ExpectModesAgree(rootfs, "debian:1");
  const std::string mnt = dir_.Sub("deb");
  ASSERT_OK(daemon_->MountAt("debian:1", store_url_, mnt, false, MountMode::kFuse).status());
  auto run = RunCommand({.argv = {"chroot", mnt, "python3", "-c", kPythonImport}, .timeout = 120s});
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->out, "[1, \"ok\"]\n") << run->err;
  ASSERT_OK(daemon_->UnmountAt(mnt));
}

TEST_F(FuseModeTest, ManyThreadsReadingListingAndStatingAgreeWithOneThread) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src, {.large_sparse_file = false}));
  layerctl::BuiltLayer layer = Publish(src, "many");
  ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(src));

  // One thread, cold.
  StartDaemon(Options());
  store_->SetDelay(2ms);
  ASSERT_OK(daemon_->MountAt("many:1", store_url_, dir_.Sub("one"), false, MountMode::kFuse).status());
  ASSERT_OK_AND_ASSIGN(auto one, testing::SnapshotTree(dir_.Sub("one")));
  auto d = testing::DiffTrees(want, one);
  EXPECT_TRUE(d.empty()) << Join(d, "\n");
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("one")));
  daemon_.reset();

  // Many threads at once on a fresh mount and an empty cache: every
  // answer is the one thread's.
  ASSERT_OK(RemoveTree(dir_.Sub("cache")));
  StartDaemon(Options());
  store_->ResetCounts();
  const std::string mnt = dir_.Sub("many");
  ASSERT_OK(daemon_->MountAt("many:1", store_url_, mnt, false, MountMode::kFuse).status());
  constexpr int kWalkers = 12, kReaders = 6, kListers = 4;
  std::vector<Result<testing::TreeSnapshot>> walks(kWalkers, Error(EINVAL, "not run"));
  std::vector<std::string> listings(kListers);
  std::atomic<int> bad_reads{0}, reads{0};
  std::vector<std::string> files;
  for (const auto& [rel, info] : want) {
    if (S_ISREG(info.mode) && info.size > 0) files.push_back(rel);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kWalkers; ++i) threads.emplace_back([&, i] { walks[i] = testing::SnapshotTree(mnt); });
  for (int i = 0; i < kListers; ++i) threads.emplace_back([&, i] { listings[i] = Listing(mnt); });
  for (int i = 0; i < kReaders; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(i);
      std::vector<char> a(70000), b(70000);
      for (int n = 0; n < 150; ++n) {
        const std::string& rel = files[rng() % files.size()];
        auto fa = OpenFile(mnt + "/" + rel, O_RDONLY);
        auto fb = OpenFile(src + "/" + rel, O_RDONLY);
        if (!fa.ok() || !fb.ok()) {
          ++bad_reads;
          continue;
        }
        const uint64_t off = rng() % (want.at(rel).size + 1);
        const size_t len = rng() % a.size();
        auto ra = PreadFull(fa->get(), std::span<char>(a.data(), len), off);
        auto rb = PreadFull(fb->get(), std::span<char>(b.data(), len), off);
        ++reads;
        if (!ra.ok() || !rb.ok() || *ra != *rb || std::memcmp(a.data(), b.data(), *ra) != 0) ++bad_reads;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kWalkers; ++i) {
    ASSERT_TRUE(walks[i].ok()) << walks[i].status().ToString();
    auto diff = testing::DiffTrees(one, *walks[i]);
    EXPECT_TRUE(diff.empty()) << "walker " << i << ":\n" << Join(diff, "\n");
  }
  const std::string listing = Listing(mnt);  // one thread, after the storm
  for (int i = 0; i < kListers; ++i) {
    auto diff = DiffLines(listing, listings[i]);
    EXPECT_TRUE(diff.empty()) << "lister " << i << ":\n" << Join(diff, "\n");
  }
  EXPECT_EQ(bad_reads.load(), 0);
  EXPECT_EQ(reads.load(), kReaders * 150);
  // However many readers wanted a chunk, the store was asked once.
  for (const auto& e : layer.manifest.extents) EXPECT_LE(store_->GetsOf(cache::ChunkKey(e.hash)), 1) << e.hash.Hex();
  EXPECT_EQ(daemon_->Stats(mnt)["layers"][0]["read_errors"], 0);
  ASSERT_OK(daemon_->UnmountAt(mnt));
}

TEST_F(FuseModeTest, StatsRecordingAndPrefetchWorkAsInKernelMode) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  for (int i = 0; i < 20; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/f", i), RandomBytes(200000, i)));
  ASSERT_OK(WriteFileAtomic(src + "/small", "just this\n"));
  layerctl::BuiltLayer layer = Publish(src, "rec");
  StartDaemon(Options());
  store_->ResetCounts();
  const std::string mnt = dir_.Sub("mnt");
  ASSERT_OK(daemon_->MountAt("rec:1", store_url_, mnt, true, MountMode::kFuse).status());
  // Listing and stat-ing everything needs metadata only.
  ASSERT_OK(RunChecked({.argv = {"find", mnt, "-ls"}}, "find").status());
  int data_gets = 0;
  for (const auto& e : layer.manifest.extents) data_gets += store_->GetsOf(cache::ChunkKey(e.hash));
  EXPECT_EQ(data_gets, 0);
  ASSERT_OK_AND_ASSIGN(std::string small, ReadFileToString(mnt + "/small"));
  EXPECT_EQ(small, "just this\n");
  json l = daemon_->Stats(mnt)["layers"][0];
  EXPECT_EQ(l["mode"], "fuse");
  EXPECT_EQ(l["chunks_fetched"], 1);
  EXPECT_EQ(l["bytes_fetched"], 10);
  ASSERT_OK(ReadFileToString(mnt + "/f7").status());
  ASSERT_OK(ReadFileToString(mnt + "/f3").status());
  ASSERT_OK(daemon_->UnmountAt(mnt));
  daemon_.reset();

  ASSERT_OK_AND_ASSIGN(auto list, catalog_->GetAccessList(layer.digest));
  ASSERT_EQ(list.size(), 3u);
  auto name_of = [&](uint32_t i) { return layer.manifest.extents[i].hash; };
  EXPECT_EQ(name_of(list[1]), HashBytes(RandomBytes(200000, 7)));
  EXPECT_EQ(name_of(list[2]), HashBytes(RandomBytes(200000, 3)));

  // A fresh node prefetches them at the next fuse-mode mount.
  ASSERT_OK(RemoveTree(dir_.Sub("cache")));
  StartDaemon(Options());
  store_->ResetCounts();
  ASSERT_OK(daemon_->MountAt("rec:1", store_url_, mnt, false, MountMode::kFuse).status());
  for (int i = 0; i < 100 && store_->GetsOf(cache::ChunkKey(name_of(list[2]))) == 0; ++i) std::this_thread::sleep_for(50ms);
  for (uint32_t i : list) EXPECT_EQ(store_->GetsOf(cache::ChunkKey(name_of(i))), 1);
  ASSERT_OK(daemon_->UnmountAt(mnt));
}

TEST_F(FuseModeTest, SlowDownOrCorruptStoresGiveEioNeverHangsOrBadBytes) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(WriteFileAtomic(src + "/a", RandomBytes(300000, 1)));
  ASSERT_OK(WriteFileAtomic(src + "/b", RandomBytes(300000, 2)));
  ASSERT_OK(WriteFileAtomic(src + "/c", RandomBytes(300000, 3)));
  Publish(src, "faulty");
  DaemonOptions o = Options();
  o.fetch_deadline = 1s;
  StartDaemon(o);
  const std::string mnt = dir_.Sub("mnt");
  ASSERT_OK(daemon_->MountAt("faulty:1", store_url_, mnt, false, MountMode::kFuse).status());
  store_->SetDelay(5s);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ReadFileToString(mnt + "/a").status().code(), EIO);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  store_->SetDelay(0ms);
  store_->SetDown(true);
  EXPECT_EQ(ReadFileToString(mnt + "/b").status().code(), EIO);
  store_->SetDown(false);
  store_->SetCorrupt(true);
  EXPECT_EQ(ReadFileToString(mnt + "/c").status().code(), EIO);
  store_->SetCorrupt(false);
  // Nothing bad was cached, by the daemon or by the kernel. (The slow
  // fetch of a's chunk is still on its way for a few seconds; readers
  // join it and time out until it lands.)
  for (auto [name, seed] : {std::pair{"b", 2}, {"c", 3}, {"a", 1}}) {
    auto got = ReadFileToString(mnt + "/" + name);
    for (int i = 0; i < 20 && !got.ok(); ++i) got = ReadFileToString(mnt + "/" + name);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, RandomBytes(300000, seed)) << name;
  }
  ASSERT_OK(daemon_->UnmountAt(mnt));
}

TEST_F(FuseModeTest, ACorruptImageGivesEioForTheDamagedInodesOnly) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src + "/dir"));
  ASSERT_OK(WriteFileAtomic(src + "/good", RandomBytes(100000, 1)));
  ASSERT_OK(WriteFileAtomic(src + "/badmode", "mode"));
  ASSERT_OK(WriteFileAtomic(src + "/badchunk", RandomBytes(200000, 2)));
  ASSERT_OK(WriteFileAtomic(src + "/dir/inner", "inner"));
  layerctl::BuiltLayer built = Publish(src, "healthy");
  ASSERT_OK_AND_ASSIGN(auto meta_source, erofs::FileSource(JoinPath(built.dir, layerctl::kMetaFile)));
  ASSERT_OK_AND_ASSIGN(auto image, erofs::Image::Open(meta_source));
  ASSERT_OK_AND_ASSIGN(erofs::Inode badmode, image->LookupPath("/badmode"));
  ASSERT_OK_AND_ASSIGN(erofs::Inode badchunk, image->LookupPath("/badchunk"));
  ASSERT_EQ(badchunk.layout, erofs::DataLayout::kChunkBased);
  Digest128 digest = PublishPatched(built, "corrupt", [&](std::string& meta) {
    // A mode with no file type; a first chunk far beyond the blob.
    PutLe16(meta, badmode.meta_offset + offsetof(erofs::InodeCompact, i_mode), 0);
    const uint64_t unit = badchunk.chunk_indexes ? sizeof(erofs::ChunkIndex) : erofs::kBlockMapEntrySize;
    const uint64_t table = (badchunk.meta_offset + badchunk.inode_size + badchunk.xattr_size + unit - 1) / unit * unit;
    PutLe32(meta, table + (badchunk.chunk_indexes ? offsetof(erofs::ChunkIndex, startblk_lo) : 0),
                            0x7ffffff0);
  });
  StartDaemon(Options());
  const std::string mnt = dir_.Sub("mnt");
  ASSERT_OK_AND_ASSIGN(auto h, daemon_->MountAt("corrupt:1", store_url_, mnt, false, MountMode::kFuse));
  EXPECT_EQ(h.digest, digest);
  struct stat st;
  EXPECT_NE(::lstat((mnt + "/badmode").c_str(), &st), 0);
  EXPECT_EQ(errno, EIO);
  EXPECT_EQ(ReadFileToString(mnt + "/badchunk").status().code(), EIO);
  // The names are all listed, and the rest of the tree reads fine.
  ASSERT_OK_AND_ASSIGN(auto ls, RunChecked({.argv = {"ls", "-a", mnt}}, "ls"));
  EXPECT_EQ(ls.out, ".\n..\nbadchunk\nbadmode\ndir\ngood\n");
  ASSERT_OK_AND_ASSIGN(std::string good, ReadFileToString(mnt + "/good"));
  EXPECT_EQ(good, RandomBytes(100000, 1));
  ASSERT_OK_AND_ASSIGN(std::string inner, ReadFileToString(mnt + "/dir/inner"));
  EXPECT_EQ(inner, "inner");
  ASSERT_OK(daemon_->UnmountAt(mnt));
}

// Walks a tree the way a curious program would — list, lstat, xattrs,
// readlink, read (at most 64 MiB a file) — catching every OSError, and
// prints the errno names it met. Directories are entered once each.
constexpr const char* kWalker = R"(
import collections, errno, os, stat, sys
root = sys.argv[1]
codes = collections.Counter()
seen = set()
stack = [root]
entries = 0
def note(e):
    codes[errno.errorcode.get(e.errno, str(e.errno))] += 1
while stack and entries < 100000:
    d = stack.pop()
    try:
        names = os.listdir(d)
    except OSError as e:
        note(e)
        continue
    for name in names:
        entries += 1
        p = os.path.join(d, name)
        try:
            st = os.lstat(p)
        except OSError as e:
            note(e)
            continue
        try:
            for x in os.listxattr(p, follow_symlinks=False):
                try:
                    os.getxattr(p, x, follow_symlinks=False)
                except OSError as e:
                    note(e)
        except OSError as e:
            note(e)
        if stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                stack.append(p)
        elif stat.S_ISLNK(st.st_mode):
            try:
                os.readlink(p)
            except OSError as e:
                note(e)
        elif stat.S_ISREG(st.st_mode):
            try:
                with open(p, 'rb') as f:
                    left = 64 << 20
                    while left > 0:
                        b = f.read(1 << 20)
                        if not b:
                            break
                        left -= len(b)
            except OSError as e:
                note(e)
print(entries, ' '.join('%s=%d' % kv for kv in sorted(codes.items())))
)";

TEST_F(FuseModeTest, DamagedMetadataNeverCrashesOrHangsTheDaemon) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src, {.large_sparse_file = false, .wide_directory = false}));
  layerctl::BuiltLayer built = Publish(src, "healthy");
  StartDaemon(Options());
  int mounted = 0, with_eio = 0;
  constexpr int kVariants = 30;
  for (int v = 0; v < kVariants; ++v) {
    SCOPED_TRACE(StrCat("variant ", v));
    std::mt19937_64 rng(1000 + v);
    const std::string name = StrCat("damaged-", v);
    PublishPatched(built, name, [&](std::string& meta) {
      // Flip bytes past the superblock: inodes, directories, xattrs.
      const uint64_t first = erofs::kSuperOffset + sizeof(erofs::SuperBlock);
      for (int i = 0; i < 12; ++i) meta[first + rng() % (meta.size() - first)] ^= static_cast<char>(1 + rng() % 255);
    });
    const std::string mnt = dir_.Sub("mnt-" + name);
    auto h = daemon_->MountAt(name + ":1", store_url_, mnt, false, MountMode::kFuse);
    if (!h.ok()) continue;  // refused at open: the root inode itself is damaged
    ++mounted;
    auto walk = RunCommand({.argv = {"python3", "-c", kWalker, mnt}, .timeout = 120s});
    ASSERT_TRUE(walk.ok()) << walk.status().ToString();
    EXPECT_FALSE(walk->timed_out) << "the walk hung";
    EXPECT_EQ(walk->exit_code, 0) << walk->err;
    if (walk->out.find("EIO=") != std::string::npos) ++with_eio;
    EXPECT_TRUE(daemon_->Stats("").is_object());
    ASSERT_OK(daemon_->UnmountAt(mnt));
  }
  EXPECT_GT(mounted, kVariants / 2);
  EXPECT_GT(with_eio, 0);  // the damage was met, and answered with EIO
  // The daemon still serves a healthy layer.
  ASSERT_OK(daemon_->MountAt("healthy:1", store_url_, dir_.Sub("healthy"), false, MountMode::kFuse).status());
  ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(src));
  ASSERT_OK_AND_ASSIGN(auto got, testing::SnapshotTree(dir_.Sub("healthy")));
  auto diff = testing::DiffTrees(want, got);
  EXPECT_TRUE(diff.empty()) << Join(diff, "\n");
  ASSERT_OK(daemon_->UnmountAt(dir_.Sub("healthy")));
}

TEST_F(FuseModeTest, CommandLineMountsInFuseMode) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(WriteFileAtomic(src + "/hello", "hello\n"));
  Publish(src, "cli");
  const std::string socket = dir_.Sub("cli.sock");
  auto lazyfs = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {Tool(), "--socket", socket});
    return RunCommand({.argv = args, .env = {"STRATA_STORE=" + store_url_, "STRATA_CACHE=" + dir_.Sub("cli-cache")}});
  };
  ASSERT_OK_AND_ASSIGN(auto bad, lazyfs({"mount", "cli:1", dir_.Sub("m0"), "--mode", "magic"}));
  EXPECT_NE(bad.exit_code, 0);
  ASSERT_OK_AND_ASSIGN(auto mounted, lazyfs({"mount", "cli:1", dir_.Sub("m1"), "--mode", "fuse"}));
  ASSERT_EQ(mounted.exit_code, 0) << mounted.err;
  ASSERT_OK_AND_ASSIGN(std::string hello, ReadFileToString(dir_.Sub("m1/hello")));
  EXPECT_EQ(hello, "hello\n");
  ASSERT_OK_AND_ASSIGN(auto stats, lazyfs({"stats", dir_.Sub("m1"), "--json"}));
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  auto j = json::parse(stats.out);
  EXPECT_EQ(j["layers"][0]["mode"], "fuse");
  EXPECT_EQ(j["layers"][0]["bytes_fetched"], 6);
  ASSERT_OK_AND_ASSIGN(auto human, lazyfs({"stats"}));
  EXPECT_NE(human.out.find("fuse mode"), std::string::npos) << human.out;
  // The mount is FUSE (not EROFS), read-only.
  struct statvfs sv{};
  ASSERT_EQ(::statvfs(dir_.Sub("m1").c_str(), &sv), 0);
  EXPECT_TRUE(sv.f_flag & ST_RDONLY);
  EXPECT_EQ(::open(dir_.Sub("m1/hello").c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EROFS);
  ASSERT_OK_AND_ASSIGN(auto unmounted, lazyfs({"umount", dir_.Sub("m1")}));
  EXPECT_EQ(unmounted.exit_code, 0) << unmounted.err;
  // SIGTERM: the daemon unmounts everything and exits.
  pid_t pid = j["pid"].get<pid_t>();
  ASSERT_OK_AND_ASSIGN(auto again, lazyfs({"mount", "cli:1", dir_.Sub("m2"), "--mode", "fuse"}));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  for (int i = 0; i < 200 && ::kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_NE(::kill(pid, 0), 0);
  EXPECT_FALSE(IsMountPoint(dir_.Sub("m2")));
}

}  // namespace
}  // namespace strata::lazyfs
