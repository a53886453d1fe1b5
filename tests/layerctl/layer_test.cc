// System tests of layers: build, kernel mount, publish, pull, verify, gc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "layerctl/builder.h"
#include "layerctl/gc.h"
#include "layerctl/inspect.h"
#include "layerctl/publish.h"
#include "tests/layerctl/image_check.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/test_util.h"
#include "tests/testing/tree.h"

namespace strata::layerctl {
namespace {

using testing::MakeTempDir;
using testing::RandomBytes;

class LayerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: owners, devices, trusted.* xattrs and mounts";
    auto store = cache::OpenStore("file://" + dir_.Sub("store"));
    ASSERT_TRUE(store.ok());
    inner_ = *store;
    store_ = std::make_shared<testing::FaultyStore>(inner_);
    catalog_ = std::make_unique<cache::Catalog>(store_);
  }

  Result<BuiltLayer> Build(const std::string& src, const std::string& out, std::string name = "test") {
    return BuildLayer({.source = src, .output_dir = out, .name = std::move(name)});
  }

  // Mounts a layer directory with the kernel's EROFS driver as a file-backed
  // mount (mount(2) with device=), the way lazyfs does.
  Result<MountPoint> MountLayer(const std::string& layer_dir, const std::string& at) {
    STRATA_RETURN_IF_ERROR(MakeDirs(at));
    return MountPoint::Mount(JoinPath(layer_dir, kMetaFile), at, "erofs", MS_RDONLY,
                             "device=" + JoinPath(layer_dir, kBlobFile));
  }

  void ExpectSameTree(const std::string& want_root, const std::string& got_root,
                      const testing::SnapshotOptions& options = {}) {
    ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(want_root, options));
    ASSERT_OK_AND_ASSIGN(auto got, testing::SnapshotTree(got_root, options));
    auto diff = testing::DiffTrees(want, got);
    EXPECT_TRUE(diff.empty()) << Join(diff, "\n");
    EXPECT_GT(want.size(), 10u);
  }

  std::string Tool() const { return testing::TestBinaryDir() + "/../../layerctl/layerctl"; }

  TempDir dir_ = MakeTempDir();
  std::shared_ptr<cache::ObjectStore> inner_;
  std::shared_ptr<testing::FaultyStore> store_;
  std::unique_ptr<cache::Catalog> catalog_;
};

TEST_F(LayerTest, KernelMountOfABuiltLayerIsIdenticalToTheSource) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src));
  ASSERT_OK_AND_ASSIGN(BuiltLayer layer, Build(src, dir_.Sub("layer")));
  EXPECT_GT(layer.manifest.extents.size(), 10u);
  EXPECT_GT(layer.manifest.bytes, 4ull << 30);  // the sparse file above 4 GiB
  EXPECT_LT(layer.manifest.blob_size, 64ull << 20);  // holes and zero chunks are not stored
  ASSERT_OK_AND_ASSIGN(MountPoint mnt, MountLayer(dir_.Sub("layer"), dir_.Sub("mnt")));
  ExpectSameTree(src, mnt.target());
  // Our reader and fsck.erofs agree.
  ASSERT_OK(testing::CheckImage(dir_.Sub("layer/meta.img"), dir_.Sub("layer/blob.img"), dir_.path()).status());
}

TEST_F(LayerTest, TarInputNeedsNoRootAndComesFromStdin) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src, {.large_sparse_file = false, .wide_directory = false}));
  ASSERT_OK(RemoveTree(src + "/dev/socket"));  // tar cannot carry sockets
  const std::string tar = dir_.Sub("in.tar");
  ASSERT_OK(RunChecked({.argv = {"tar", "--xattrs", "--xattrs-include=*", "--sparse", "--numeric-owner", "-C", src,
                                 "-cf", tar, "."}},
                       "tar")
                .status());
  ASSERT_OK_AND_ASSIGN(std::string raw, ReadFileToString(tar));
  // An unprivileged builder: owners, devices and trusted.* xattrs are only
  // recorded in the image, never created on a disk.
  ASSERT_OK(MakeDirs(dir_.Sub("nobody")));
  ASSERT_OK(RunChecked({.argv = {"chown", "nobody", dir_.Sub("nobody")}}, "chown").status());
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_OK_AND_ASSIGN(auto r, RunCommand({.argv = {"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                                    Tool(), "--store", "file://" + dir_.Sub("nobody/store"), "build",
                                                    "-", "-o", dir_.Sub("nobody/layer"), "--name", "test"},
                                           .stdin_data = raw}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_OK_AND_ASSIGN(BuiltLayer layer, OpenLayerDir(dir_.Sub("nobody/layer")));
  EXPECT_EQ(layer.manifest.source, HashBytes(raw).Hex());
  ASSERT_OK_AND_ASSIGN(MountPoint mnt, MountLayer(dir_.Sub("nobody/layer"), dir_.Sub("mnt")));
  ExpectSameTree(src, mnt.target());
  // The same archive from a file gives the same layer.
  ASSERT_OK_AND_ASSIGN(BuiltLayer from_file, Build(tar, dir_.Sub("from-file")));
  EXPECT_EQ(from_file.digest, layer.digest);
}

TEST_F(LayerTest, TarInputGivesTheSameTree) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src, {.large_sparse_file = false}));
  ASSERT_OK(RemoveTree(src + "/dev/socket"));  // tar cannot carry sockets
  for (const char* compress : {"", "--zstd", "--gzip"}) {
    SCOPED_TRACE(compress);
    std::string tar = dir_.Sub(StrCat("in", compress, ".tar"));
    std::vector<std::string> argv = {"tar", "--xattrs", "--xattrs-include=*", "--sparse", "--numeric-owner",
                                     "-C", src, "-cf", tar, "."};
    if (*compress) argv.insert(argv.begin() + 1, compress);
    ASSERT_OK(RunChecked({.argv = argv}, "tar").status());
    std::string out = dir_.Sub(StrCat("layer", compress));
    ASSERT_OK_AND_ASSIGN(BuiltLayer layer, Build(tar, out));
    ASSERT_OK_AND_ASSIGN(std::string raw, ReadFileToString(tar));
    EXPECT_EQ(layer.manifest.source, HashBytes(raw).Hex());
    ASSERT_OK_AND_ASSIGN(MountPoint mnt, MountLayer(out, dir_.Sub(StrCat("mnt", compress))));
    ExpectSameTree(src, mnt.target());
    EXPECT_NE(::access(JoinPath(out, ".staging").c_str(), F_OK), 0);
  }
}

TEST_F(LayerTest, TheSameTreeGivesTheSameDigest) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src, {.large_sparse_file = false}));
  ASSERT_OK_AND_ASSIGN(BuiltLayer a, Build(src, dir_.Sub("a")));
  ASSERT_OK_AND_ASSIGN(BuiltLayer b, Build(src, dir_.Sub("b")));
  EXPECT_EQ(a.digest, b.digest);
  // A copy elsewhere (other inode numbers, other creation order) too.
  ASSERT_OK(RunChecked({.argv = {"cp", "-a", src, dir_.Sub("copy")}}, "cp").status());
  ASSERT_OK_AND_ASSIGN(BuiltLayer c, Build(dir_.Sub("copy"), dir_.Sub("c")));
  EXPECT_EQ(a.digest, c.digest);
  ASSERT_OK_AND_ASSIGN(std::string meta_a, ReadFileToString(dir_.Sub("a/meta.img")));
  ASSERT_OK_AND_ASSIGN(std::string meta_c, ReadFileToString(dir_.Sub("c/meta.img")));
  EXPECT_EQ(meta_a, meta_c);
  // And a change of one mtime changes it.
  ASSERT_OK(RunChecked({.argv = {"touch", "-d", "2001-01-01", dir_.Sub("copy/files/size-100")}}, "touch").status());
  ASSERT_OK_AND_ASSIGN(BuiltLayer d, Build(dir_.Sub("copy"), dir_.Sub("d")));
  EXPECT_NE(a.digest, d.digest);
}

TEST_F(LayerTest, PushPullRoundTripAndDedup) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  for (int i = 0; i < 20; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/file-", i), RandomBytes(700 << 10, i)));
  ASSERT_OK(WriteFileAtomic(src + "/changes", RandomBytes(1 << 20, 100)));
  ASSERT_OK_AND_ASSIGN(BuiltLayer v1, Build(src, dir_.Sub("v1")));
  ASSERT_OK_AND_ASSIGN(PushReport first, Push(v1, *catalog_, cache::LayerRef{"app", "1"}));
  EXPECT_EQ(first.digest, v1.digest);
  EXPECT_EQ(first.bytes_uploaded, v1.manifest.StoredBytes());
  EXPECT_EQ(first.chunks_present, 0u);

  // Pushing again sends nothing.
  ASSERT_OK_AND_ASSIGN(PushReport again, Push(v1, *catalog_, cache::LayerRef{"app", "1"}));
  EXPECT_EQ(again.bytes_uploaded, 0u);

  // Version 2: one 1 MB file changed. Only its extent and the metadata move.
  ASSERT_OK(WriteFileAtomic(src + "/changes", RandomBytes(1 << 20, 101)));
  ASSERT_OK(RunChecked({.argv = {"touch", "-d", "2020-01-01", src, src + "/changes"}}, "touch").status());
  ASSERT_OK_AND_ASSIGN(BuiltLayer v2, Build(src, dir_.Sub("v2")));
  ASSERT_OK_AND_ASSIGN(PushReport second, Push(v2, *catalog_, cache::LayerRef{"app", "2"}));
  EXPECT_EQ(second.bytes_uploaded, (1u << 20) + v2.manifest.meta_size);
  EXPECT_EQ(second.bytes_present, v2.manifest.StoredBytes() - second.bytes_uploaded);

  ASSERT_OK_AND_ASSIGN(Digest128 resolved, catalog_->Resolve("app:2"));
  EXPECT_EQ(resolved, v2.digest);
  ASSERT_OK_AND_ASSIGN(PullReport pulled, Pull(*catalog_, resolved, dir_.Sub("pulled")));
  for (const char* f : {kMetaFile, kBlobFile, kManifestFile}) {
    ASSERT_OK_AND_ASSIGN(std::string want, ReadFileToString(dir_.Sub(std::string("v2/") + f)));
    ASSERT_OK_AND_ASSIGN(std::string got, ReadFileToString(dir_.Sub(std::string("pulled/") + f)));
    EXPECT_TRUE(want == got) << f;
  }
  ASSERT_OK_AND_ASSIGN(MountPoint mnt, MountLayer(dir_.Sub("pulled"), dir_.Sub("mnt")));
  ExpectSameTree(src, mnt.target());
}

// Small files' chunks side by side share extents; where a group ends
// depends on its members' names, so a changed small file renames its own
// group (and at most the next), not the groups after it, and a mount reads
// every file back.
TEST_F(LayerTest, SmallFilesShareExtentsAndAChangeRenamesOnlyItsGroup) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src + "/small"));
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) {
    ASSERT_OK(WriteFileAtomic(src + StrCat("/small/f", 1000 + i), RandomBytes(1 + rng() % 6000, i)));
  }
  ASSERT_OK(WriteFileAtomic(src + "/large", RandomBytes((2 << 20) + 5000, 1000)));
  ASSERT_OK(WriteFileAtomic(src + "/medium", RandomBytes(70 << 10, 1001)));  // over half a group: alone
  ASSERT_OK(RunChecked({.argv = {"touch", "-d", "2020-01-01", src + "/small"}}, "touch").status());

  ASSERT_OK_AND_ASSIGN(BuiltLayer alone, BuildLayer({.source = src, .output_dir = dir_.Sub("alone"), .group_size = 0}));
  EXPECT_EQ(alone.manifest.extents.size(), 400u + 3 + 1);  // the large file is 3 chunks
  ASSERT_OK_AND_ASSIGN(BuiltLayer v1, Build(src, dir_.Sub("v1")));
  const auto& extents = v1.manifest.extents;
  EXPECT_LT(extents.size(), 120u);
  EXPECT_GT(extents.size(), 4u + 400 / 64);
  std::set<Digest128> v1_names;
  ASSERT_OK_AND_ASSIGN(UniqueFd blob, OpenFile(v1.dir + "/" + kBlobFile, O_RDONLY));
  for (const auto& e : extents) {
    v1_names.insert(e.hash);
    EXPECT_TRUE(e.length <= kDefaultGroupSize || e.length == 1u << 20) << e.length;
    std::string bytes(e.length, '\0');
    ASSERT_OK(PreadFull(blob.get(), bytes, e.offset).status());
    EXPECT_EQ(HashBytes(bytes), e.hash);
  }
  // A chunk of half a group or more is never grouped: it keeps its name.
  for (const auto& e : alone.manifest.extents) {
    if (e.length >= kDefaultGroupSize / 2) {
      EXPECT_TRUE(v1_names.count(e.hash)) << e.length;
    }
  }

  // One small file in the middle changes and grows by a block or more, so
  // every chunk after it moves (its directory's mtime stays).
  ASSERT_OK(WriteFileAtomic(src + "/small/f1200", RandomBytes(9000, 5000)));
  ASSERT_OK(RunChecked({.argv = {"touch", "-d", "2020-01-01", src + "/small"}}, "touch").status());
  ASSERT_OK_AND_ASSIGN(BuiltLayer v2, Build(src, dir_.Sub("v2")));
  std::set<Digest128> v2_names;
  for (const auto& e : v2.manifest.extents) v2_names.insert(e.hash);
  size_t renamed = 0;
  for (const auto& e : extents) renamed += !v2_names.count(e.hash);
  EXPECT_GE(renamed, 1u);
  EXPECT_LE(renamed, 2u);

  ASSERT_OK_AND_ASSIGN(MountPoint mnt, MountLayer(v2.dir, dir_.Sub("mnt")));
  ExpectSameTree(src, mnt.target());
}

TEST_F(LayerTest, AFailedPushLeavesTheTagAndResumes) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  for (int i = 0; i < 30; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/f", i), RandomBytes(100 << 10, i)));
  ASSERT_OK_AND_ASSIGN(BuiltLayer v1, Build(src, dir_.Sub("v1")));
  ASSERT_OK(Push(v1, *catalog_, cache::LayerRef{"app", "1"}).status());
  ASSERT_OK(WriteFileAtomic(src + "/f0", RandomBytes(100 << 10, 999)));
  for (int i = 30; i < 60; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/f", i), RandomBytes(100 << 10, i)));
  ASSERT_OK_AND_ASSIGN(BuiltLayer v2, Build(src, dir_.Sub("v2")));

  store_->FailPutsAfter(10, ENOSPC);  // the disk fills half-way
  auto failed = Push(v2, *catalog_, cache::LayerRef{"app", "1"});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), ENOSPC);
  EXPECT_NE(failed.status().ToString().find("push layer " + v2.digest.Hex()), std::string::npos);
  ASSERT_OK_AND_ASSIGN(Digest128 still, catalog_->Resolve("app:1"));
  EXPECT_EQ(still, v1.digest);
  ASSERT_OK_AND_ASSIGN(bool manifest, catalog_->HasManifest(v2.digest));
  EXPECT_FALSE(manifest);

  store_->FailPutsAfter(-1);
  ASSERT_OK_AND_ASSIGN(PushReport resumed, Push(v2, *catalog_, cache::LayerRef{"app", "1"}));
  EXPECT_GE(resumed.chunks_present, 10u + 29u);  // what the failed push sent, and v1's
  ASSERT_OK_AND_ASSIGN(Digest128 now, catalog_->Resolve("app:1"));
  EXPECT_EQ(now, v2.digest);
}

TEST_F(LayerTest, KilledPushesNeverPublishHalfALayer) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  for (int i = 0; i < 200; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/f", i), RandomBytes(64 << 10, i)));
  const std::string store_url = "file://" + dir_.Sub("killstore");
  ASSERT_OK(MakeDirs(dir_.Sub("tmp")));  // a killed build's staging stays inside the test's directory
  std::mt19937 rng(7);
  for (int round = 0; round < 6; ++round) {
    ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Start({.argv = {Tool(), "--store", store_url, "build", src, "--tag", "k:1"},
                                                                .env = {"TMPDIR=" + dir_.Sub("tmp")}}));
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 250));
    p.Kill(SIGKILL);
    ASSERT_OK(p.Wait().status());
    ASSERT_OK_AND_ASSIGN(auto store, cache::OpenStore(store_url));
    cache::Catalog catalog(store);
    auto tag = catalog.Resolve("k:1");
    if (!tag.ok()) {
      EXPECT_EQ(tag.status().code(), ENOENT);
      continue;
    }
    ASSERT_OK_AND_ASSIGN(LayerVerifyReport report, Verify(catalog, *tag));
    EXPECT_TRUE(report.ok()) << Join(report.problems, "\n");
  }
  // Finishing the job publishes a sound layer.
  ASSERT_OK(RunChecked({.argv = {Tool(), "--store", store_url, "build", src, "--tag", "k:1"}}, "build").status());
  ASSERT_OK_AND_ASSIGN(auto store, cache::OpenStore(store_url));
  cache::Catalog catalog(store);
  ASSERT_OK_AND_ASSIGN(Digest128 d, catalog.Resolve("k:1"));
  ASSERT_OK_AND_ASSIGN(LayerVerifyReport report, Verify(catalog, d));
  EXPECT_TRUE(report.ok());
}

TEST_F(LayerTest, VerifyFindsACorruptChunk) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(WriteFileAtomic(src + "/a", RandomBytes(300000, 1)));
  ASSERT_OK(WriteFileAtomic(src + "/b", RandomBytes(300000, 2)));
  ASSERT_OK_AND_ASSIGN(BuiltLayer layer, Build(src, dir_.Sub("layer")));
  ASSERT_OK(Push(layer, *catalog_, cache::LayerRef{"v", "1"}).status());
  ASSERT_OK_AND_ASSIGN(LayerVerifyReport good, Verify(*catalog_, layer.digest));
  EXPECT_TRUE(good.ok()) << Join(good.problems, "\n");
  EXPECT_EQ(good.chunks, 3u);
  const auto& victim = layer.manifest.extents[0].hash;
  ASSERT_OK(inner_->Put(cache::ChunkKey(victim), std::string(300000, 'x')));
  ASSERT_OK_AND_ASSIGN(LayerVerifyReport bad, Verify(*catalog_, layer.digest));
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_NE(bad.problems[0].find(victim.Hex()), std::string::npos);
  auto pulled = Pull(*catalog_, layer.digest, dir_.Sub("pulled"));
  EXPECT_EQ(pulled.status().code(), EBADMSG);
}

TEST_F(LayerTest, ChunksAreCompressedByTheStoresDefaultAndMixedStoresWork) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  std::string text;
  for (int i = 0; text.size() < 600000; ++i) text += StrCat("def f", i, "(x):\n    return x * ", i, "\n");
  ASSERT_OK(WriteFileAtomic(src + "/code.py", text));
  ASSERT_OK(WriteFileAtomic(src + "/random.bin", RandomBytes(400000, 3)));
  ASSERT_OK_AND_ASSIGN(BuiltLayer v1, Build(src, dir_.Sub("v1")));
  // Version 1 raw, by flag.
  ASSERT_OK_AND_ASSIGN(PushReport raw,
                       Push(v1, *catalog_, cache::LayerRef{"mix", "1"}, {.compression = cache::Compression{false, 0}}));
  EXPECT_EQ(raw.chunks_compressed, 0u);
  EXPECT_EQ(raw.bytes_sent, raw.bytes_uploaded);

  // The store's default: zstd:5 from settings.json.
  ASSERT_OK_AND_ASSIGN(cache::StoreSettings settings, catalog_->GetSettings());
  EXPECT_EQ(settings.compression, (cache::Compression{true, 1}));  // none written yet: the default
  ASSERT_OK(catalog_->PutSettings({cache::Compression{true, 5}}));
  ASSERT_OK_AND_ASSIGN(settings, catalog_->GetSettings());
  EXPECT_EQ(settings.compression.ToString(), "zstd:5");

  // Version 2: the text changed, the random file not. Its new chunks go
  // compressed; the raw chunk it shares with version 1 stays as it is.
  ASSERT_OK(WriteFileAtomic(src + "/code.py", text + "# v2\n"));
  ASSERT_OK_AND_ASSIGN(BuiltLayer v2, Build(src, dir_.Sub("v2")));
  ASSERT_OK_AND_ASSIGN(PushReport packed, Push(v2, *catalog_, cache::LayerRef{"mix", "2"}));
  EXPECT_EQ(packed.compression.ToString(), "zstd:5");
  EXPECT_GE(packed.chunks_compressed, 1u);
  EXPECT_LT(packed.bytes_sent, packed.bytes_uploaded / 2);
  EXPECT_GE(packed.chunks_present, 1u);

  for (const BuiltLayer* layer : {&v1, &v2}) {
    ASSERT_OK_AND_ASSIGN(LayerVerifyReport report, Verify(*catalog_, layer->digest));
    EXPECT_TRUE(report.ok()) << Join(report.problems, "\n");
    EXPECT_EQ(report.bytes, layer->manifest.StoredBytes());
    if (layer == &v2) {
      EXPECT_GE(report.compressed, 1u);
      EXPECT_LT(report.stored_bytes, report.bytes);
    } else {
      EXPECT_EQ(report.compressed, 0u);
    }
    const std::string out = dir_.Sub(StrCat("pulled-", layer == &v1 ? 1 : 2));
    ASSERT_OK(Pull(*catalog_, layer->digest, out).status());
    for (const char* f : {kMetaFile, kBlobFile}) {
      ASSERT_OK_AND_ASSIGN(std::string want, ReadFileToString(JoinPath(layer->dir, f)));
      ASSERT_OK_AND_ASSIGN(std::string got, ReadFileToString(JoinPath(out, f)));
      EXPECT_TRUE(want == got) << f;
    }
  }

  // A settings object nobody can read is a clear error, and nothing moves.
  ASSERT_OK(inner_->Put(cache::Catalog::kSettingsKey, R"({"compress": "lz4"})"));
  auto refused = Push(v2, *catalog_, cache::LayerRef{"mix", "3"});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().ToString().find("settings.json"), std::string::npos);
  EXPECT_NE(refused.status().ToString().find("lz4"), std::string::npos);
  EXPECT_EQ(catalog_->Resolve("mix:3").status().code(), ENOENT);
}

TEST_F(LayerTest, BadInputIsAClearErrorAndPublishesNothing) {
  auto missing = BuildLayer({.source = dir_.Sub("no-such-source"), .output_dir = dir_.Sub("out")});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().ToString().find("no-such-source"), std::string::npos);
  EXPECT_EQ(catalog_->Resolve("nope:1").status().code(), ENOENT);
  EXPECT_FALSE(catalog_->Resolve("not a ref").ok());

  // A file the builder cannot read (as an unprivileged builder).
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src + "/sub"));
  ASSERT_OK(WriteFileAtomic(src + "/sub/secret", "s"));
  ASSERT_EQ(::chmod((src + "/sub/secret").c_str(), 0), 0);
  ASSERT_OK(MakeDirs(dir_.Sub("out-nobody")));
  ASSERT_OK(RunChecked({.argv = {"chown", "-R", "nobody", dir_.Sub("out-nobody")}}, "chown").status());
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  auto r = RunCommand({.argv = {"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", Tool(), "--store",
                                "file://" + dir_.Sub("out-nobody/store"), "build", src, "-o", dir_.Sub("out-nobody/l")}});
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->exit_code, 0);
  EXPECT_NE(r->err.find("build layer from " + src), std::string::npos) << r->err;
  EXPECT_NE(r->err.find("open " + src + "/sub/secret: Permission denied"), std::string::npos) << r->err;
  EXPECT_NE(::access(dir_.Sub("out-nobody/l/manifest.json").c_str(), F_OK), 0);
  EXPECT_NE(::access(dir_.Sub("out-nobody/l/.blob.tmp").c_str(), F_OK), 0);  // no temporaries left

  // An output directory inside the source would be read while written.
  auto inside = BuildLayer({.source = src, .output_dir = src + "/sub/out"});
  EXPECT_EQ(inside.status().code(), EINVAL);
  EXPECT_NE(inside.status().ToString().find("lies inside the source"), std::string::npos);

  // A store that is down: the tag is not moved.
  ASSERT_OK(MakeDirs(dir_.Sub("ok")));
  ASSERT_OK(WriteFileAtomic(dir_.Sub("ok/f"), "f"));
  ASSERT_OK_AND_ASSIGN(BuiltLayer layer, Build(dir_.Sub("ok"), dir_.Sub("ok-layer")));
  store_->FailPutsAfter(0, ECONNREFUSED);
  EXPECT_EQ(Push(layer, *catalog_, cache::LayerRef{"x", "1"}).status().code(), ECONNREFUSED);
  EXPECT_EQ(catalog_->Resolve("x:1").status().code(), ENOENT);
}

TEST_F(LayerTest, GcKeepsWhatTagsAndLeasesReachAfterTheGracePeriod) {
  auto make = [&](const std::string& name, int seed) -> BuiltLayer {
    std::string src = dir_.Sub("src-" + name);
    EXPECT_OK(MakeDirs(src));
    EXPECT_OK(WriteFileAtomic(src + "/shared", RandomBytes(200000, 1)));
    EXPECT_OK(WriteFileAtomic(src + "/own", RandomBytes(200000, seed)));
    auto built = Build(src, dir_.Sub("layer-" + name), name);
    EXPECT_TRUE(built.ok());
    EXPECT_OK(Push(*built, *catalog_, cache::LayerRef{name, "1"}).status());
    return *built;
  };
  BuiltLayer keep = make("keep", 2), drop = make("drop", 3), leased = make("leased", 4);
  ASSERT_OK(catalog_->DeleteTag("drop", "1"));
  ASSERT_OK(catalog_->DeleteTag("leased", "1"));
  const int64_t now = 2000000000;
  ASSERT_OK(catalog_->PutLease({"node-a", leased.digest, now + 600}));

  // First pass: unreachable objects are only noted.
  ASSERT_OK_AND_ASSIGN(GcReport first, CollectGarbage(*catalog_, {.now = now}));
  EXPECT_EQ(first.deleted, 0u);
  EXPECT_EQ(first.reachable_layers, 2u);
  EXPECT_EQ(first.leased_layers, 1u);
  EXPECT_EQ(first.waiting, 3u);  // drop's manifest, metadata image and own extent
  // A day later: deleted; the lease has expired by then, but it was renewed.
  ASSERT_OK(catalog_->PutLease({"node-a", leased.digest, now + 90000}));
  ASSERT_OK_AND_ASSIGN(GcReport second, CollectGarbage(*catalog_, {.now = now + 86400}));
  EXPECT_EQ(second.deleted, 3u);
  EXPECT_FALSE(*catalog_->HasManifest(drop.digest));
  EXPECT_TRUE(*catalog_->HasManifest(leased.digest));
  EXPECT_TRUE(Verify(*catalog_, keep.digest)->ok());
  EXPECT_TRUE(Verify(*catalog_, leased.digest)->ok());
  // Once the lease lapses, the leased layer goes too (after its own grace).
  ASSERT_OK(CollectGarbage(*catalog_, {.now = now + 100000}).status());
  ASSERT_OK(CollectGarbage(*catalog_, {.now = now + 200000}).status());
  EXPECT_FALSE(*catalog_->HasManifest(leased.digest));
  EXPECT_TRUE(Verify(*catalog_, keep.digest)->ok());
}

TEST_F(LayerTest, InspectFilesListsTheTreeThroughTheReaderWithoutMounting) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(testing::MakeRichTree(src));
  ASSERT_OK_AND_ASSIGN(BuiltLayer layer, Build(src, dir_.Sub("layer"), "rich"));
  ASSERT_OK(Push(layer, *catalog_, cache::LayerRef{"rich", "1"}).status());
  ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(src));
  store_->ResetCounts();
  std::map<std::string, FileEntry> got;
  ASSERT_OK(ListLayerFiles(*catalog_, layer.digest, [&](const FileEntry& f) {
    got[f.path == "/" ? "." : f.path.substr(1)] = f;
    return OkStatus();
  }));
  // The manifest and the metadata image; not one data chunk.
  EXPECT_EQ(store_->gets(), 2);
  ASSERT_EQ(got.size(), want.size());
  int checked_extents = 0, grouped = 0;
  ASSERT_OK_AND_ASSIGN(UniqueFd blob, OpenFile(layer.dir + "/" + kBlobFile, O_RDONLY));
  for (const auto& [rel, w] : want) {
    SCOPED_TRACE(rel);
    ASSERT_TRUE(got.count(rel));
    const FileEntry& f = got[rel];
    EXPECT_EQ(f.inode.mode, w.mode);
    EXPECT_EQ(f.inode.uid, w.uid);
    EXPECT_EQ(f.inode.gid, w.gid);
    EXPECT_EQ(f.inode.mtime * 1000000000 + f.inode.mtime_nsec, w.mtime_ns);
    if (S_ISLNK(w.mode)) {
      EXPECT_EQ(f.link_target, w.link);
    }
    if (S_ISCHR(w.mode) || S_ISBLK(w.mode)) {
      EXPECT_EQ(f.inode.rdev, w.rdev);
    }
    if (!S_ISREG(w.mode)) continue;
    EXPECT_EQ(f.inode.size, w.size);
    // The extents cover the file, and each stored one names the manifest
    // extent holding those bytes of the source, and where in it: the
    // extent's bytes (the blob's, from its offset) hash to its name.
    uint64_t covered = 0;
    ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(src + "/" + rel, O_RDONLY));
    for (const auto& e : f.extents) {
      EXPECT_EQ(e.file_offset, covered);
      covered += e.length;
      if (!e.chunk) continue;
      const cache::Extent* m = layer.manifest.FindExtent(e.blob_offset);
      ASSERT_NE(m, nullptr);
      EXPECT_EQ(*e.chunk, m->hash);
      EXPECT_EQ(e.chunk_offset, e.blob_offset - m->offset);
      std::string object(m->length, '\0'), bytes(e.length, '\0');
      ASSERT_OK(PreadFull(blob.get(), object, m->offset).status());
      EXPECT_EQ(m->hash, HashBytes(object));
      ASSERT_OK(PreadFull(fd.get(), bytes, e.file_offset).status());
      EXPECT_EQ(object.substr(e.chunk_offset, e.length), bytes);
      grouped += e.chunk_offset > 0;
      ++checked_extents;
    }
    EXPECT_EQ(covered, w.size);
  }
  EXPECT_GT(checked_extents, 10);
  EXPECT_GT(grouped, 0);  // small files' chunks side by side share an extent

  // The command line: one line per path, or JSON.
  const std::string store = "file://" + dir_.Sub("store");
  ASSERT_OK_AND_ASSIGN(auto text, RunCommand({.argv = {Tool(), "--store", store, "inspect", "rich:1", "--files"}}));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(Split(text.out, '\n').size(), want.size() + 2);  // a header, and the last newline
  char copy_a[64];
  std::snprintf(copy_a, sizeof copy_a, "- %04o         0:0      2097152    2 /files/copy-a\n", want["files/copy-a"].mode & 07777);
  EXPECT_NE(text.out.find(copy_a), std::string::npos) << text.out.substr(0, 2000);
  EXPECT_NE(text.out.find(" /links/relative -> original\n"), std::string::npos);
  char dev_null[64];  // its mode is what the umask left of 0666
  std::snprintf(dev_null, sizeof dev_null, "c %04o         0:0          1,3    0 /dev/null\n", want["dev/null"].mode & 07777);
  EXPECT_NE(text.out.find(dev_null), std::string::npos) << dev_null;
  ASSERT_OK_AND_ASSIGN(auto js, RunCommand({.argv = {Tool(), "--store", store, "--json", "inspect", "rich:1", "--files"}}));
  ASSERT_EQ(js.exit_code, 0) << js.err;
  auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["files"].size(), want.size());
  // A name that is not UTF-8 is given escaped, and exactly in hex.
  int not_utf8 = 0;
  for (const auto& file : j["files"]) {
    if (!file.contains("path_hex")) continue;
    ++not_utf8;
    auto bytes = HexDecode(file["path_hex"].get<std::string>());
    ASSERT_TRUE(bytes.has_value());
    EXPECT_EQ(file["path"], Quote(std::string(bytes->begin(), bytes->end())));
    EXPECT_TRUE(got.count(std::string(bytes->begin() + 1, bytes->end())));
  }
  EXPECT_EQ(not_utf8, 1);  // names/\xff\xfe binary
}

TEST_F(LayerTest, CommandLine) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(WriteFileAtomic(src + "/hello", "hello\n"));
  const std::string store = "file://" + dir_.Sub("clistore");
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {Tool(), "--store", store});
    return RunCommand({.argv = args});
  };
  ASSERT_OK_AND_ASSIGN(auto built, run({"build", src, "--kind", "toolkit", "--name", "hello", "--tag", "hello:1", "--json"}));
  ASSERT_EQ(built.exit_code, 0) << built.err;
  auto j = nlohmann::json::parse(built.out);
  std::string digest = j["digest"];
  EXPECT_EQ(j["tag"], "hello:1");
  ASSERT_OK_AND_ASSIGN(auto ls, run({"ls"}));
  EXPECT_NE(ls.out.find("hello"), std::string::npos);
  EXPECT_NE(ls.out.find("toolkit"), std::string::npos);
  EXPECT_NE(ls.out.find(digest), std::string::npos);
  ASSERT_OK_AND_ASSIGN(auto tag, run({"tag", "hello:1", "hello:latest"}));
  EXPECT_EQ(tag.exit_code, 0) << tag.err;
  ASSERT_OK_AND_ASSIGN(auto inspect, run({"inspect", "hello:latest", "--json"}));
  EXPECT_EQ(nlohmann::json::parse(inspect.out)["digest"], digest);
  ASSERT_OK_AND_ASSIGN(auto verify, run({"verify", digest}));
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  ASSERT_OK_AND_ASSIGN(auto rm, run({"rm", "hello:latest"}));
  EXPECT_EQ(rm.exit_code, 0);
  ASSERT_OK_AND_ASSIGN(auto unknown, run({"inspect", "hello:latest"}));
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("hello:latest"), std::string::npos);
  for (const char* verb : {"build", "push", "pull", "ls", "inspect", "verify", "tag", "rm", "gc"}) {
    ASSERT_OK_AND_ASSIGN(auto help, RunCommand({.argv = {Tool(), verb, "--help"}}));
    EXPECT_EQ(help.exit_code, 0) << verb;
  }
}

}  // namespace
}  // namespace strata::layerctl
