// scripts/bench packdiff: packing an upper directory, against tar | zstd, in one run.
//  1. A 100 MB upper directory of 5,000 files in 400 directories (sizes
//     spread log-uniformly from 1 KiB to 200 KiB; every other file
//     text-like and compressible, the rest random bytes) packed as a diff
//     and published to a fresh file:// store, versus `tar c | zstd -1` of
//     the same directory to a file: time (median of 3, alternating, page
//     cache warm) and size. The file:// store fsyncs every object it
//     stores, so the publish is also set against the tar file fsync-ed,
//     and run again with the store on tmpfs (where fsync costs nothing) to
//     show what the fsyncs cost.
//  2. One file changed on a 200 MB base (2,000 files of 100 KiB, random):
//     the base mounted with the kernel's EROFS, an overlay on it, one file
//     appended to, the upper packed: the diff's size and what it uploads,
//     versus the base rebuilt from the changed tree.
#include <sys/mount.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "packdiff/packdiff.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/test_util.h"

namespace strata::bench {
namespace {


constexpr int kFiles = 5000;
constexpr uint64_t kTotal = 100ull << 20;
constexpr int kReps = 3;

// Compressible bytes: words from a small vocabulary, as source code and
// text files are.
std::string TextBytes(size_t n, uint64_t seed) {
  static const char* const kWords[] = {"int ", "return ", "self", ".value", "(", ")", "{\n", "}\n", "if ",
                                       "for ", "import ", "def ", "const ", "std::", "string", "0x", "= ",
                                       "; ", "//", "name", "data", "path", "\n    ", "error"};
  std::mt19937_64 rng(seed);
  std::string s;
  s.reserve(n + 16);
  while (s.size() < n) s += kWords[rng() % (sizeof kWords / sizeof *kWords)];
  s.resize(n);
  return s;
}

// 5,000 files, ~100 MB, in 50 directories of 7 subdirectories each.
uint64_t MakeUpper(const std::string& root) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> logsize(std::log(1024.0), std::log(200.0 * 1024));
  std::vector<double> sizes(kFiles);
  double sum = 0;
  for (double& s : sizes) sum += (s = std::exp(logsize(rng)));
  uint64_t total = 0;
  for (int i = 0; i < kFiles; ++i) {
    const size_t n = static_cast<size_t>(sizes[static_cast<size_t>(i)] * static_cast<double>(kTotal) / sum);
    const std::string dir = StrCat(root, "/pkg", i % 50, "/sub", i % 7);
    Check(MakeDirs(dir));
    Check(WriteFileAtomic(StrCat(dir, "/file-", i), i % 2 ? strata::testing::RandomBytes(n, static_cast<uint64_t>(i))
                                                           : TextBytes(n, static_cast<uint64_t>(i)),
                          false));
    total += n;
  }
  return total;
}

uint64_t DirBytes(const std::string& dir) {
  auto du = Check(RunChecked({.argv = {"du", "-sb", dir}}, "du"));
  return std::stoull(du.out);
}

// A directory on tmpfs, removed when dropped.
TempDir ShmDir() {
  char path[] = "/dev/shm/strata-bench-XXXXXX";
  if (!::mkdtemp(path)) Check(ErrnoError(errno, "mkdtemp /dev/shm"));
  return TempDir::Adopt(path);
}

std::string MiB(uint64_t bytes) { return Fixed(static_cast<double>(bytes) / (1 << 20), 1) + " MiB"; }
std::string KiB(uint64_t bytes) { return Fixed(static_cast<double>(bytes) / 1024, 1) + " KiB"; }
std::string Ratio(double ours, double theirs, std::string_view what) {
  return Fixed(ours / theirs, 2) + "x the " + std::string(what);
}

// Builds `src` as a base layer and publishes it to `store_dir` as base:1.
layerctl::BuiltLayer PublishBase(const std::string& store_dir, const std::string& src) {
  cache::Catalog catalog(Check(cache::OpenStore("file://" + store_dir)));
  auto built = Check(layerctl::BuildLayer({.source = src, .output_dir = store_dir + "-build", .name = "base"}));
  Check(layerctl::Push(built, catalog, cache::LayerRef{"base", "1"}).status());
  return built;
}

// Markdown cells: a '|' inside one must be escaped.
constexpr const char* kTar = "tar c \\| zstd -1 > file";
constexpr const char* kTarSync = "tar c \\| zstd -1 > file; fsync";

// 1. A 100 MB upper directory of 5,000 files, packed and published, against
//    tar | zstd -1.
void PackALargeUpper(const TempDir& dir, Table& table) {
  const std::string upper = dir.Sub("upper");
  const uint64_t bytes = MakeUpper(upper);
  // The diff's parent: a one-file base, so everything in the upper is new.
  Check(MakeDirs(dir.Sub("tiny-base")));
  Check(WriteFileAtomic(dir.Sub("tiny-base/etc"), "base\n"));
  // The file:// store runs again on tmpfs, where fsync costs nothing.
  const bool have_shm = ::access("/dev/shm", W_OK) == 0;
  std::vector<double> build_s, pack_s, shm_s, tar_s, tar_sync_s;
  packdiff::PackReport report;
  uint64_t tar_bytes = 0;
  Check(RunChecked({.argv = {"sh", "-c", "tar c -C " + upper + " . > /dev/null"}}, "warm the page cache").status());
  auto timed = [](const std::function<void()>& f) {
    ::sync();
    const auto t0 = Clock::now();
    f();
    return Seconds(Clock::now() - t0);
  };
  for (int rep = 0; rep < kReps; ++rep) {
    const std::string store_dir = dir.Sub(StrCat("store-", rep));
    PublishBase(store_dir, dir.Sub("tiny-base"));
    cache::Catalog catalog(Check(cache::OpenStore("file://" + store_dir)));
    build_s.push_back(timed([&] {
      Check(packdiff::PackUpper({.upper = upper, .parents = {"base:1"}, .publish = false}, catalog).status());
    }));
    pack_s.push_back(timed([&] {
      report = Check(packdiff::PackUpper({.upper = upper, .parents = {"base:1"}, .tag = cache::LayerRef{"upper", "1"}},
                                         catalog));
    }));
    if (have_shm) {
      TempDir shm = ShmDir();
      PublishBase(shm.Sub("store"), dir.Sub("tiny-base"));
      cache::Catalog shm_catalog(Check(cache::OpenStore("file://" + shm.Sub("store"))));
      shm_s.push_back(timed([&] {
        Check(packdiff::PackUpper({.upper = upper, .parents = {"base:1"}, .tag = cache::LayerRef{"upper", "1"}},
                                  shm_catalog)
                  .status());
      }));
    }
    const std::string out = dir.Sub(StrCat("upper-", rep, ".tar.zst"));
    tar_s.push_back(timed([&] {
      Check(RunChecked({.argv = {"sh", "-c", "tar c -C " + upper + " . | zstd -1 -q -f -o " + out}}, "tar | zstd")
                .status());
    }));
    tar_sync_s.push_back(timed([&] {
      Check(RunChecked({.argv = {"sh", "-c", "tar c -C " + upper + " . | zstd -1 -q -f -o " + out + " && sync " + out}},
                       "tar | zstd; sync")
                .status());
    }));
    tar_bytes = DirBytes(out);
    Check(RemoveTree(out));
    Check(RemoveTree(store_dir));
    Check(RemoveTree(store_dir + "-build"));
  }
  const double b = Median(build_s), p = Median(pack_s), t = Median(tar_s), ts = Median(tar_sync_s);
  const std::string what = StrCat(MiB(bytes), " in ", kFiles, " files");
  table.Add({"pack only (no publish), " + what, Fixed(b, 2) + " s", kTar, Fixed(t, 2) + " s", Ratio(b, t, "time"),
             "-"});
  table.Add({"pack + publish to file://, " + what, Fixed(p, 2) + " s", kTar, Fixed(t, 2) + " s", Ratio(p, t, "time"),
             "-"});
  table.Add({"pack + publish to file:// (an fsync per object)", Fixed(p, 2) + " s", kTarSync, Fixed(ts, 2) + " s",
             Ratio(p, ts, "time"), "-"});
  if (have_shm) {
    const double m = Median(shm_s);
    table.Add({"pack + publish to file:// on tmpfs (fsync free)", Fixed(m, 2) + " s", kTar, Fixed(t, 2) + " s",
               Ratio(m, t, "time"), "-"});
  }
  table.Add({"layer size (metadata image + blob)", MiB(report.layer_bytes), kTar, MiB(tar_bytes),
             Ratio(static_cast<double>(report.layer_bytes), static_cast<double>(tar_bytes), "size"), "-"});
  table.Add({"uploaded (new chunks + metadata image)", StrCat(MiB(report.push->bytes_uploaded), " in ",
                                                              report.push->chunks_uploaded, " objects"),
             kTar, MiB(tar_bytes),
             Ratio(static_cast<double>(report.push->bytes_uploaded), static_cast<double>(tar_bytes), "size"), "-"});
}

// 2. One file changed on a 200 MB base, through a real overlay.
void OneFileChange(const TempDir& dir, Table& table) {
  const std::string base_src = dir.Sub("base200");
  for (int i = 0; i < 2000; ++i) {
    const std::string d = StrCat(base_src, "/lib", i % 20);
    Check(MakeDirs(d));
    Check(WriteFileAtomic(StrCat(d, "/mod-", i, ".so"),
                          strata::testing::RandomBytes(100 << 10, 1000 + static_cast<uint64_t>(i)), false));
  }
  const std::string store_dir = dir.Sub("store-200");
  layerctl::BuiltLayer base = PublishBase(store_dir, base_src);
  cache::Catalog catalog(Check(cache::OpenStore("file://" + store_dir)));
  const std::string lower = dir.Sub("lower"), merged = dir.Sub("merged"), up = dir.Sub("up"), work = dir.Sub("work");
  for (const auto& d : {lower, merged, up, work}) Check(MakeDirs(d));
  const std::string change = "echo '# patched' >> ";
  {
    MountPoint erofs = Check(MountPoint::Mount(JoinPath(base.dir, layerctl::kMetaFile), lower, "erofs", MS_RDONLY,
                                               "device=" + JoinPath(base.dir, layerctl::kBlobFile)));
    MountPoint overlay = Check(MountPoint::Mount(
        "overlay", merged, "overlay", 0,
        StrCat("lowerdir=", lower, ",upperdir=", up, ",workdir=", work, ",redirect_dir=off,metacopy=off,index=off")));
    Check(RunChecked({.argv = {"sh", "-c", change + merged + "/lib7/mod-1007.so"}}, "change a file").status());
    Check(overlay.Unmount());
    Check(erofs.Unmount());
  }
  packdiff::PackReport one =
      Check(packdiff::PackUpper({.upper = up, .parents = {"base:1"}, .tag = cache::LayerRef{"one", "1"}}, catalog));
  // The baseline: the whole changed tree built as a new image (its
  // unchanged chunks are in the store already, too).
  Check(RunChecked({.argv = {"sh", "-c", change + base_src + "/lib7/mod-1007.so"}}, "change a file").status());
  auto rebuilt = Check(layerctl::BuildLayer({.source = base_src, .output_dir = dir.Sub("rebuilt"), .name = "base"}));
  auto rebuilt_push = Check(layerctl::Push(rebuilt, catalog, cache::LayerRef{"base", "2"}));
  const uint64_t rebuilt_bytes = rebuilt.manifest.meta_size + rebuilt.manifest.blob_size;
  table.Add({"one-file change on a 200 MB base: layer size", KiB(one.layer_bytes), "the changed tree rebuilt",
             MiB(rebuilt_bytes), Fixed(static_cast<double>(one.layer_bytes) / static_cast<double>(rebuilt_bytes), 4),
             "tiny"});
  table.Add({"one-file change on a 200 MB base: uploaded", KiB(one.push->bytes_uploaded), "the changed tree rebuilt",
             KiB(rebuilt_push.bytes_uploaded),
             Fixed(static_cast<double>(one.push->bytes_uploaded) / static_cast<double>(rebuilt_push.bytes_uploaded), 2),
             "-"});
}

}  // namespace
}  // namespace strata::bench

int main() {
  using namespace strata;
  using namespace strata::bench;
  if (::geteuid() != 0) {
    std::fprintf(stderr, "packdiff_bench: needs root (an EROFS and an overlay mount)\n");
    return 1;
  }
  return BenchMain([] {
    TempDir dir = Check(TempDir::Create("strata-bench"));
    Table table({"measure", "strata", "baseline", "baseline figure", "ratio", "target"});
    PackALargeUpper(dir, table);
    OneFileChange(dir, table);
    table.Print();
    return 0;
  });
}
