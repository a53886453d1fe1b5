// scripts/bench layer [ROOTFS]: building and pushing a real root filesystem
// layer, against mkfs.erofs alone (same chunk size and blob device, the
// image layerctl's writer replaces) and `tar c | zstd -1` of the same tree,
// in one run; then a second version with one changed ~1 MiB file pushed to
// the same store. The tree (scripts/bench-rootfs: Debian minbase with
// python3, ~330 MB) is read once beforehand, so every side reads it from
// the page cache; outputs go to local disk.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <stdexcept>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "tests/bench/bench_util.h"

namespace strata::bench {
namespace {


constexpr int kRepeats = 3;

void Run(std::vector<std::string> argv, const std::string& step) {
  Check(RunChecked({.argv = std::move(argv)}, step).status());
}

double Time(const std::function<void()>& f) {
  auto t0 = Clock::now();
  f();
  return Seconds(Clock::now() - t0);
}

double MiB(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

int Main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string rootfs;
  if (argc > 1) {
    rootfs = argv[1];
  } else {
    auto r = Check(RunCommand({.argv = {SelfDir() + "/../../../scripts/bench-rootfs"}, .stderr_mode = StdStream::kInherit}));
    if (!r.success()) Check(Error(EIO, "scripts/bench-rootfs " + r.Describe()));
    rootfs = Split(r.out, '\n')[0];
  }
  TempDir dir = Check(TempDir::Create("strata-bench-layer"));

  // The tree's regular file bytes, read once so every side starts warm.
  uint64_t tree_bytes = 0;
  size_t files = 0;
  std::string near_1m;  // the regular file closest to 1 MiB, changed in version 2
  uint64_t near_1m_size = 0;
  {
    std::string buf(1 << 20, '\0');
    for (const auto& e : fs::recursive_directory_iterator(rootfs)) {
      if (e.is_symlink() || !e.is_regular_file()) continue;
      const uint64_t size = e.file_size();
      tree_bytes += size;
      ++files;
      auto distance = [](uint64_t s) { return s > (1u << 20) ? s - (1u << 20) : (1u << 20) - s; };
      if (near_1m.empty() || distance(size) < distance(near_1m_size)) {
        near_1m = fs::relative(e.path(), rootfs).string();
        near_1m_size = size;
      }
      UniqueFd fd = Check(OpenFile(e.path().string(), O_RDONLY));
      while (::read(fd.get(), buf.data(), buf.size()) > 0) {
      }
    }
  }

  // Alternating repeats; each side writes fresh outputs every time, and
  // nothing is deleted until the end: on a journal-less ext4 (as here)
  // creating files right after deleting thousands makes every create scan
  // the recently deleted inodes.
  std::vector<double> build_s, push_s, raw_push_s, mkfs_s, zstd_s;
  layerctl::PushReport first_push, raw_push;
  std::string store_url;
  layerctl::BuiltLayer v1;
  for (int i = 0; i < kRepeats; ++i) {
    std::fprintf(stderr, "layer_bench: round %d of %d\n", i + 1, kRepeats);
    const std::string out = dir.Sub(StrCat("layer-", i));
    store_url = "file://" + dir.Sub(StrCat("store-", i));
    build_s.push_back(Time([&] { v1 = Check(layerctl::BuildLayer({.source = rootfs, .output_dir = out, .name = "bench"})); }));
    cache::Catalog catalog(Check(cache::OpenStore(store_url)));
    // Both pushes start from the same state: nothing left to write back (the
    // build's blob would otherwise slow the first push's fsyncs), and
    // alternating which goes first.
    cache::Catalog raw_catalog(Check(cache::OpenStore("file://" + dir.Sub(StrCat("raw-store-", i)))));
    auto zstd_push = [&] {
      ::sync();
      push_s.push_back(Time([&] { first_push = Check(layerctl::Push(v1, catalog, cache::LayerRef{"bench", "1"})); }));
    };
    if (i % 2 == 0) zstd_push();
    ::sync();
    raw_push_s.push_back(Time([&] {
      raw_push = Check(layerctl::Push(v1, raw_catalog, cache::LayerRef{"bench", "1"},
                                      {.compression = cache::Compression{false, 0}}));
    }));
    if (i % 2 == 1) zstd_push();

    const std::string mkfs = dir.Sub(StrCat("mkfs-", i));
    Check(MakeDirs(mkfs));
    Check(WriteFileAtomic(mkfs + "/blob.img", "", false));  // erofs-utils 1.5 wants the blob to exist
    mkfs_s.push_back(Time([&] {
      Run({"mkfs.erofs", "--quiet", "--chunksize=1048576", "--blobdev=" + mkfs + "/blob.img", mkfs + "/meta.img", rootfs},
          "mkfs.erofs");
    }));

    const std::string tar = dir.Sub(StrCat("tree-", i, ".tar.zst"));
    zstd_s.push_back(Time([&] {
      Run({"sh", "-c", "tar -C \"$1\" -cf - . | zstd -1 -q -o \"$2\"", "sh", rootfs, tar}, "tar c | zstd -1");
    }));
  }

  // Version 2: a copy of the tree with the file closest to 1 MiB rewritten.
  std::fprintf(stderr, "layer_bench: version 2 (%s changed)\n", near_1m.c_str());
  const std::string v2_tree = dir.Sub("tree-v2");
  Run({"cp", "-a", "--reflink=auto", rootfs, v2_tree}, "copy the tree");
  {
    std::string bytes(near_1m_size, '\0');
    std::mt19937_64 rng(7);
    for (auto& c : bytes) c = static_cast<char>(rng());
    UniqueFd fd = Check(OpenFile(v2_tree + "/" + near_1m, O_WRONLY));  // in place: same inode, mode, owner
    Check(PwriteFull(fd.get(), bytes, 0));
  }
  layerctl::BuiltLayer v2;
  layerctl::PushReport second_push;
  cache::Catalog catalog(Check(cache::OpenStore(store_url)));
  const double v2_build_s =
      Time([&] { v2 = Check(layerctl::BuildLayer({.source = v2_tree, .output_dir = dir.Sub("layer-v2"), .name = "bench"})); });
  const double v2_push_s =
      Time([&] { second_push = Check(layerctl::Push(v2, catalog, cache::LayerRef{"bench", "2"})); });

  const double mib = MiB(tree_bytes);
  const double ours = Median(build_s) + Median(push_s);
  std::printf("tree: %s, %zu files, %.0f MiB of file data; image %.0f MiB (metadata %.1f MiB), %zu extents; "
              "chunk size 1 MiB; median of %d alternating rounds, tree in the page cache\n\n",
              rootfs.c_str(), files, mib, MiB(v1.manifest.meta_size + v1.manifest.blob_size),
              MiB(v1.manifest.meta_size), v1.manifest.extents.size(), kRepeats);
  Table table({"measure", "time", "MiB/s", "layerctl ÷ this", "target"});
  table.Add({"layerctl build + push (file:// store)", Fixed(ours, 2) + " s", Fixed(mib / ours, 0), "1.00", "-"});
  table.Add({"  of which build (EROFS writer, XXH3 per extent)", Fixed(Median(build_s), 2) + " s",
             Fixed(mib / Median(build_s), 0), "-", "-"});
  table.Add({StrCat("  of which push (every chunk uploaded, ", first_push.compression.ToString(), ": ",
                    Fixed(MiB(first_push.bytes_sent), 0), " MiB stored, ",
                    Fixed(static_cast<double>(first_push.bytes_sent) / static_cast<double>(tree_bytes), 2), " of the tree)"),
             Fixed(Median(push_s), 2) + " s", Fixed(mib / Median(push_s), 0), "-", "<= 0.65 of the tree"});
  table.Add({StrCat("  push with --compress none (", Fixed(MiB(raw_push.bytes_sent), 0), " MiB stored)"),
             Fixed(Median(raw_push_s), 2) + " s", Fixed(mib / Median(raw_push_s), 0),
             Fixed(Median(raw_push_s) / Median(push_s), 2), "zstd push no slower: >= 1.0"});
  table.Add({"mkfs.erofs --chunksize=1048576 --blobdev (image only)", Fixed(Median(mkfs_s), 2) + " s",
             Fixed(mib / Median(mkfs_s), 0), Fixed(Median(mkfs_s) / ours, 2), "-"});
  table.Add({"tar c \\| zstd -1 (one thread)", Fixed(Median(zstd_s), 2) + " s", Fixed(mib / Median(zstd_s), 0),
             Fixed(Median(zstd_s) / ours, 2), "-"});
  std::printf("layerctl ÷ this: our throughput as a share of the other command's (above 1: faster)\n");
  table.Print();

  std::printf("\nversion 2: %s (%.2f MiB) rewritten, built and pushed to the same store:\n", near_1m.c_str(),
              MiB(near_1m_size));
  Table again({"push", "build", "push", "chunks uploaded", "bytes uploaded", "already present", "target"});
  again.Add({"version 1 (empty store)", Fixed(Median(build_s), 2) + " s", Fixed(Median(push_s), 2) + " s",
             StrCat(first_push.chunks_uploaded, " of ", first_push.chunks), Fixed(MiB(first_push.bytes_uploaded), 2) + " MiB",
             Fixed(MiB(first_push.bytes_present), 2) + " MiB", "-"});
  again.Add({"version 2 (one file changed)", Fixed(v2_build_s, 2) + " s", Fixed(v2_push_s, 2) + " s",
             StrCat(second_push.chunks_uploaded, " of ", second_push.chunks),
             Fixed(MiB(second_push.bytes_uploaded), 2) + " MiB", Fixed(MiB(second_push.bytes_present), 2) + " MiB",
             "the file's extents + metadata"});
  again.Print();
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return strata::bench::Main(argc, argv); });
}
