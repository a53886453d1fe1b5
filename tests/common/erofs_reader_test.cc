// The EROFS reader against images mkfs.erofs 1.5 builds from rich trees, in
// every layout it can write, plus hand-patched images for what it cannot
// write (long xattr name prefixes, holes) and for corruption.
#include "common/erofs/reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "common/erofs/format.h"
#include "common/fs.h"
#include "common/strings.h"
#include "tests/common/erofs_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::erofs {
namespace {

using ::testing::HasSubstr;
using testing::BuildRichTree;
using testing::BuildSmallTree;
using testing::BuiltImage;
using testing::CompareImageWithTree;
using testing::CompareOptions;
using testing::FixChecksum;
using testing::GetLe16;
using testing::GetLe32;
using testing::MakeImage;
using testing::OpenImage;
using testing::PutLe16;
using testing::PutLe32;
using testing::PutLe64;
using testing::ReadAll;

#define SKIP_WITHOUT_MKFS() \
  if (!testing::HaveMkfs()) GTEST_SKIP() << "mkfs.erofs not found (Debian: erofs-utils; scripts/setup installs it)"

struct Layout {
  std::string name;
  std::vector<std::string> args;
  bool blobdev = false;
  uint64_t chunk_size = 0;
  std::optional<int64_t> fixed_mtime;
  bool force_owner = false;  // compact inodes cannot hold the tree's large ids
};

void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

// One rich tree for every layout: building it is the slow part.
class ErofsLayoutTest : public ::testing::TestWithParam<Layout> {
 protected:
  static void SetUpTestSuite() {
    if (!testing::HaveMkfs()) return;
    auto dir = TempDir::Create("strata-erofs-tree");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    tree_ = new TempDir(std::move(*dir));
    auto features = BuildRichTree(tree_->Sub("src"));
    ASSERT_TRUE(features.ok()) << features.status().ToString();
    features_ = *features;
  }
  static void TearDownTestSuite() {
    delete tree_;
    tree_ = nullptr;
  }
  static std::vector<std::string> Args(const Layout& layout) {
    std::vector<std::string> args = layout.args;
    if (layout.force_owner) {
      args.push_back("--force-uid=1000");
      args.push_back("--force-gid=2000");
    }
    return args;
  }
  static TempDir* tree_;
  static testing::TreeFeatures features_;
};
TempDir* ErofsLayoutTest::tree_ = nullptr;
testing::TreeFeatures ErofsLayoutTest::features_;

TEST_P(ErofsLayoutTest, ReaderMatchesSourceTree) {
  SKIP_WITHOUT_MKFS();
  ASSERT_NE(tree_, nullptr);
  const Layout& layout = GetParam();
  TempDir out = strata::testing::MakeTempDir();
  ASSERT_OK_AND_ASSIGN(BuiltImage built, MakeImage(tree_->Sub("src"), out.path(), layout.name, Args(layout),
                                                   layout.blobdev));
  ASSERT_OK_AND_ASSIGN(auto image, OpenImage(built));
  const ImageInfo& info = image->info();
  EXPECT_EQ(info.block_size, 4096u);
  EXPECT_TRUE(info.checksum_verified);
  EXPECT_EQ(info.device_blocks.size(), layout.blobdev ? 2u : 1u);
  if (layout.blobdev) {
    // mkfs.erofs 1.5 leaves the device slot's block count at 0.
    EXPECT_EQ(info.device_blocks[1], 0u);
  }

  CompareOptions options;
  options.fixed_mtime = layout.fixed_mtime;
  options.chunk_size = layout.chunk_size;
  if (layout.force_owner) {
    options.forced_uid = 1000;
    options.forced_gid = 2000;
  }
  options.device_paths = {built.meta};
  if (layout.blobdev) options.device_paths.push_back(built.blob);
  CompareImageWithTree(*image, tree_->Sub("src"), options);
}

TEST_P(ErofsLayoutTest, ConcurrentReadsAgree) {
  SKIP_WITHOUT_MKFS();
  ASSERT_NE(tree_, nullptr);
  const Layout& layout = GetParam();
  TempDir out = strata::testing::MakeTempDir();
  ASSERT_OK_AND_ASSIGN(BuiltImage built, MakeImage(tree_->Sub("src"), out.path(), layout.name, Args(layout),
                                                   layout.blobdev));
  ASSERT_OK_AND_ASSIGN(auto image, OpenImage(built));
  ASSERT_OK_AND_ASSIGN(std::string want, ReadFileToString(tree_->Sub("src/files/multi-chunk")));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 200; ++i) {
        auto inode = image->LookupPath(i % 2 ? "/files/multi-chunk" : "/wide/entry-00007-padding-padding");
        if (!inode.ok()) {
          ++failures;
          continue;
        }
        if (inode->size != want.size()) continue;
        uint64_t off = rng() % want.size();
        std::string buf(rng() % 300000 + 1, '\0');
        auto n = image->Read(*inode, off, std::span<char>(buf));
        if (!n.ok() || std::string_view(buf.data(), *n) != std::string_view(want).substr(off, *n)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ErofsLayoutTest,
    ::testing::Values(
        Layout{"inline", {}},
        Layout{"plain", {"-Enoinline_data"}},
        Layout{"compact", {"-Eforce-inode-compact"}, false, 0, std::nullopt, true},
        Layout{"extended", {"-Eforce-inode-extended"}},
        Layout{"fixed_time", {"-T1234567890", "-U", "6a0c2f4e-1b2d-4c3e-8f90-123456789abc"}, false, 0, 1234567890},
        Layout{"chunk4k_blockmap", {"--chunksize=4096"}, false, 4096},
        Layout{"chunk64k_indexes", {"--chunksize=65536", "-Eforce-chunk-indexes"}, false, 65536},
        Layout{"chunk64k_blob", {"--chunksize=65536"}, true, 65536},
        Layout{"chunk1m_blob", {"--chunksize=1048576"}, true, 1 << 20},
        Layout{"chunk4k_blob_compact", {"--chunksize=4096", "-Eforce-inode-compact", "-T1700000000"}, true, 4096,
               1700000000, true},
        Layout{"chunk1m_blob_extended_plain", {"--chunksize=1048576", "-Eforce-inode-extended", "-Enoinline_data"},
               true, 1 << 20}),
    [](const ::testing::TestParamInfo<Layout>& p) { return p.param.name; });

// Builds a small tree and images from it; patches work on the bytes.
class ErofsSmallImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveMkfs()) GTEST_SKIP() << "mkfs.erofs not found (Debian: erofs-utils)";
    ASSERT_OK(BuildSmallTree(dir_.Sub("src")));
  }
  std::string Src() const { return dir_.Sub("src"); }

  // The image as bytes, built with `args`.
  std::string Build(const std::vector<std::string>& args, const std::string& name = "small") {
    auto built = MakeImage(Src(), dir_.path(), name, args, false);
    EXPECT_TRUE(built.ok()) << built.status().ToString();
    return built.ok() ? ReadAll(built->meta) : std::string();
  }

  // The bytes with the superblock checksum recomputed, as a patch tool
  // would leave them (inodes may share block 0 with the superblock).
  static std::string Fixed(std::string bytes) {
    FixChecksum(bytes);
    return bytes;
  }
  static Status OpenStatus(const std::string& bytes) { return Image::Open(MemorySource(Fixed(bytes))).status(); }

  // Walks the whole image, reading everything; returns the first error.
  static Status WalkAll(const Image& image) {
    return image.Walk([&](const std::string&, const Inode& inode) -> Status {
      STRATA_RETURN_IF_ERROR(image.ListXattrs(inode).status());
      if (inode.type == FileType::kSymlink) STRATA_RETURN_IF_ERROR(image.ReadLink(inode).status());
      if (inode.type == FileType::kRegular) {
        STRATA_RETURN_IF_ERROR(image.MapFile(inode).status());
        std::string buf(std::min<uint64_t>(inode.size, 1 << 20), '\0');
        STRATA_RETURN_IF_ERROR(image.Read(inode, 0, std::span<char>(buf)).status());
      }
      return OkStatus();
    });
  }

  TempDir dir_ = strata::testing::MakeTempDir();
};

constexpr uint64_t kSb = kSuperOffset;

// Opens patched bytes (checksum fixed) into `var` or fails the test.
#define OPEN_PATCHED(var, bytes) ASSERT_OK_AND_ASSIGN(auto var, Image::Open(MemorySource(Fixed(bytes))))

TEST_F(ErofsSmallImageTest, InfoReportsTheSuperblock) {
  std::string bytes = Build({"-T1600000000", "-U", "01234567-89ab-cdef-0123-456789abcdef"});
  OPEN_PATCHED(image, bytes);
  const ImageInfo& info = image->info();
  EXPECT_EQ(info.uuid, "01234567-89ab-cdef-0123-456789abcdef");
  EXPECT_EQ(info.build_time, 1600000000u);
  EXPECT_EQ(info.inode_count, 10u);  // root, dir, dir/inner, file, link, packed, x0..x3
  EXPECT_EQ(info.device_blocks, std::vector<uint64_t>{bytes.size() / 4096});
  EXPECT_TRUE(info.checksum_verified);
  ASSERT_OK_AND_ASSIGN(Inode root, image->Root());
  EXPECT_EQ(root.nid, info.root_nid);
  EXPECT_EQ(root.type, FileType::kDirectory);
}

TEST_F(ErofsSmallImageTest, LookupPathAndErrors) {
  OPEN_PATCHED(image, Build({}));
  ASSERT_OK_AND_ASSIGN(Inode inner, image->LookupPath("/dir/inner"));
  EXPECT_EQ(inner.type, FileType::kRegular);
  ASSERT_OK_AND_ASSIGN(Inode same, image->LookupPath("dir//inner"));
  EXPECT_EQ(same.nid, inner.nid);
  EXPECT_EQ(image->LookupPath("/dir/missing").status().code(), ENOENT);
  EXPECT_EQ(image->LookupPath("/file/below").status().code(), ENOTDIR);
  ASSERT_OK_AND_ASSIGN(Inode root, image->Root());
  EXPECT_EQ(image->Lookup(root, std::string(256, 'a')).status().code(), ENAMETOOLONG);
  EXPECT_EQ(image->Lookup(root, "").status().code(), EINVAL);
  EXPECT_EQ(image->ReadDir(inner).status().code(), ENOTDIR);
  EXPECT_EQ(image->ReadLink(inner).status().code(), EINVAL);
  EXPECT_EQ(image->Read(root, 0, std::span<char>()).status().code(), EISDIR);
  EXPECT_EQ(image->MapFile(root).status().code(), EINVAL);
  EXPECT_EQ(image->GetInode(1ULL << 40).status().code(), EUCLEAN);
}

TEST_F(ErofsSmallImageTest, LongXattrNamePrefixes) {
  ASSERT_OK_AND_ASSIGN(BuiltImage built, testing::MakeLongPrefixImage(Src(), dir_.path()));
  OPEN_PATCHED(image, ReadAll(built.meta));
  EXPECT_EQ(image->info().xattr_prefix_count, 2u);
  EXPECT_TRUE(image->info().feature_incompat & kIncompatXattrPrefixes);
  ASSERT_OK_AND_ASSIGN(Inode x0, image->LookupPath("/x0"));
  ASSERT_OK_AND_ASSIGN(auto xattrs, image->ListXattrs(x0));
  std::map<std::string, std::string> got;
  for (const auto& x : xattrs) got[x.name] = x.value;
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"trusted.overlay.p1", "v1"},
                                                     {"user.long.prefix.shared", "same on every x file"}}));
  ASSERT_OK_AND_ASSIGN(std::string v, image->GetXattr(x0, "trusted.overlay.p1"));
  EXPECT_EQ(v, "v1");
  EXPECT_EQ(image->GetXattr(x0, "user.p1").status().code(), ENODATA);
  ASSERT_OK_AND_ASSIGN(Inode x3, image->LookupPath("/x3"));
  ASSERT_OK_AND_ASSIGN(std::string shared, image->GetXattr(x3, "user.long.prefix.shared"));
  EXPECT_EQ(shared, "same on every x file");
  EXPECT_OK(WalkAll(*image));
}

TEST_F(ErofsSmallImageTest, LongXattrNamePrefixesInThePackedInode) {
  ASSERT_OK_AND_ASSIGN(BuiltImage built, testing::MakePackedPrefixImage(Src(), dir_.path()));
  OPEN_PATCHED(image, ReadAll(built.meta));
  EXPECT_TRUE(image->info().feature_incompat & kIncompatFragments);
  ASSERT_OK_AND_ASSIGN(Inode x0, image->LookupPath("/x0"));
  ASSERT_OK_AND_ASSIGN(std::string v, image->GetXattr(x0, "trusted.overlay.p1"));
  EXPECT_EQ(v, "v1");
  ASSERT_OK_AND_ASSIGN(std::string shared, image->GetXattr(x0, "user.long.prefix.shared"));
  EXPECT_EQ(shared, "same on every x file");

  // A packed inode that is compressed names the feature.
  std::string bytes = ReadAll(built.meta);
  ASSERT_OK_AND_ASSIGN(Inode packed, image->GetInode(image->info().packed_nid));
  uint16_t format = GetLe16(bytes, packed.meta_offset);
  PutLe16(bytes, packed.meta_offset, static_cast<uint16_t>((format & ~0x0e) | (kLayoutCompressedFull << 1)));
  Status s = OpenStatus(bytes);
  EXPECT_EQ(s.code(), ENOTSUP);
  EXPECT_THAT(s.ToString(), HasSubstr("compression (fragments in packed inode"));
}

TEST_F(ErofsSmallImageTest, BadLongPrefixTableIsRefused) {
  ASSERT_OK_AND_ASSIGN(BuiltImage built, testing::MakeLongPrefixImage(Src(), dir_.path()));
  const std::string good = ReadAll(built.meta);
  const uint64_t table = uint64_t{GetLe32(good, kSb + offsetof(SuperBlock, xattr_prefix_start))} * 4;
  {
    std::string bytes = good;
    PutLe16(bytes, table, 0);  // zero-length entry
    Status s = OpenStatus(bytes);
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("long xattr name prefix 0 has length 0"));
  }
  {
    std::string bytes = good;
    bytes[table + 2] = 9;  // unknown base index
    EXPECT_THAT(OpenStatus(bytes).ToString(), HasSubstr("unknown base name index 9"));
  }
  {
    std::string bytes = good;
    PutLe32(bytes, kSb + offsetof(SuperBlock, xattr_prefix_start), static_cast<uint32_t>(bytes.size() / 4 - 1));
    PutLe16(bytes, bytes.size() - 4, 200);  // runs past the end
    FixChecksum(bytes);
    Status s = OpenStatus(bytes);
    EXPECT_EQ(s.code(), EUCLEAN) << s.ToString();
  }
  {
    // An entry naming prefix 5 of 2.
    std::string bytes = good;
    bytes[kSb + offsetof(SuperBlock, xattr_prefix_count)] = 1;
    FixChecksum(bytes);
    OPEN_PATCHED(image, bytes);
    ASSERT_OK_AND_ASSIGN(Inode x0, image->LookupPath("/x0"));
    Status s = image->ListXattrs(x0).status();
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("uses long name prefix 1, the image has 1"));
  }
}

TEST_F(ErofsSmallImageTest, ChunkHolesReadAsZeros) {
  for (bool blobdev : {false, true}) {
    SCOPED_TRACE(blobdev ? "chunk indexes on a blob" : "block map");
    ASSERT_OK_AND_ASSIGN(BuiltImage built, testing::MakeChunkHoleImage(Src(), dir_.path(), blobdev));
    ASSERT_OK_AND_ASSIGN(auto image, OpenImage(built));
    ASSERT_OK_AND_ASSIGN(Inode file, image->LookupPath("/file"));
    ASSERT_OK_AND_ASSIGN(std::string want, ReadFileToString(Src() + "/file"));
    ASSERT_EQ(want.size(), 20000u);
    want.replace(4096, 4096, 4096, '\0');
    std::string got(want.size(), 'x');
    ASSERT_OK_AND_ASSIGN(size_t n, image->Read(file, 0, std::span<char>(got)));
    EXPECT_EQ(n, want.size());
    EXPECT_TRUE(got == want);
    ASSERT_OK_AND_ASSIGN(auto extents, image->MapFile(file));
    ASSERT_EQ(extents.size(), 5u);  // 20000 bytes in 4 KiB chunks
    EXPECT_TRUE(extents[1].hole);
    EXPECT_EQ(extents[1].file_offset, 4096u);
    EXPECT_EQ(extents[1].length, 4096u);
    EXPECT_FALSE(extents[0].hole);
    EXPECT_EQ(extents[0].device, blobdev ? 1u : 0u);
    EXPECT_EQ(extents[4].length, 20000u - 4 * 4096);
  }
}

TEST_F(ErofsSmallImageTest, FlatPlainNullAddressIsAHole) {
  std::string bytes = Build({"-Enoinline_data"});
  OPEN_PATCHED(image, bytes);
  ASSERT_OK_AND_ASSIGN(Inode file, image->LookupPath("/file"));
  ASSERT_EQ(file.layout, DataLayout::kFlatPlain);
  PutLe32(bytes, file.meta_offset + 16, kNullAddr);  // i_u of a compact or extended inode
  FixChecksum(bytes);
  OPEN_PATCHED(image2, bytes);
  ASSERT_OK_AND_ASSIGN(file, image2->LookupPath("/file"));
  std::string got(file.size, 'x');
  ASSERT_OK_AND_ASSIGN(size_t n, image2->Read(file, 0, std::span<char>(got)));
  EXPECT_EQ(n, file.size);
  EXPECT_EQ(got, std::string(file.size, '\0'));
  ASSERT_OK_AND_ASSIGN(auto extents, image2->MapFile(file));
  ASSERT_EQ(extents.size(), 1u);
  EXPECT_TRUE(extents[0].hole);
}

TEST_F(ErofsSmallImageTest, MetadataOnlyOpenMapsButDoesNotReadBlobData) {
  auto built = MakeImage(Src(), dir_.path(), "blob", {"--chunksize=4096"}, true);
  ASSERT_OK(built.status());
  ASSERT_OK_AND_ASSIGN(auto meta, FileSource(built->meta));
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(meta));
  ASSERT_OK_AND_ASSIGN(Inode file, image->LookupPath("/file"));
  ASSERT_OK_AND_ASSIGN(auto extents, image->MapFile(file));
  ASSERT_EQ(extents.size(), 5u);
  for (const auto& e : extents) EXPECT_EQ(e.device, 1u);
  std::string buf(100, '\0');
  Status s = image->Read(file, 0, std::span<char>(buf)).status();
  EXPECT_EQ(s.code(), ENXIO);
  EXPECT_THAT(s.ToString(), HasSubstr("device 1, which was not given"));
  EXPECT_THAT(s.ToString(), HasSubstr(StrCat("inode ", file.nid, ":")));
  // Symlinks and directories live in the metadata image and still read.
  ASSERT_OK_AND_ASSIGN(Inode link, image->LookupPath("/link"));
  ASSERT_OK_AND_ASSIGN(std::string target, image->ReadLink(link));
  EXPECT_EQ(target, "dir/inner");

  // Wrong device lists are refused.
  ASSERT_OK_AND_ASSIGN(auto blob, FileSource(built->blob));
  EXPECT_EQ(Image::Open(meta, {blob, blob}).status().code(), EINVAL);
  // mkfs.erofs 1.5 records 0 blocks for the blob, so the blob's own size
  // bounds it: a short blob opens, and reads past its end fail cleanly.
  ASSERT_OK_AND_ASSIGN(auto short_image, Image::Open(meta, {MemorySource("short")}));
  Status past = short_image->Read(file, 0, std::span<char>(buf)).status();
  EXPECT_EQ(past.code(), EUCLEAN);
  EXPECT_THAT(past.ToString(), HasSubstr("beyond device 1"));
}

TEST_F(ErofsSmallImageTest, RefusesBadMagicTruncationAndChecksums) {
  const std::string good = Build({});
  EXPECT_OK(OpenStatus(good));
  {
    std::string bytes = good;
    bytes[kSb] ^= 0x55;
    Status s = OpenStatus(bytes);
    EXPECT_EQ(s.code(), EINVAL);
    EXPECT_THAT(s.ToString(), HasSubstr("not an erofs image: magic"));
  }
  {
    Status s = OpenStatus(good.substr(0, 1000));
    EXPECT_EQ(s.code(), EINVAL);
    EXPECT_THAT(s.ToString(), HasSubstr("too small"));
  }
  {
    Status s = OpenStatus(good.substr(0, good.size() - 4096));
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("image is truncated"));
  }
  {
    std::string bytes = good;
    bytes[kSb + offsetof(SuperBlock, volume_name)] = 'X';  // the checksum is left stale
    Status s = Image::Open(MemorySource(bytes)).status();
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("superblock checksum"));
  }
  {
    std::string bytes = good;
    bytes[kSb + offsetof(SuperBlock, blkszbits)] = 30;
    FixChecksum(bytes);
    EXPECT_EQ(OpenStatus(bytes).code(), ENOTSUP);
  }
  {
    std::string bytes = good;
    bytes[kSb + offsetof(SuperBlock, dirblkbits)] = 1;
    FixChecksum(bytes);
    EXPECT_THAT(OpenStatus(bytes).ToString(), HasSubstr("directory blocks"));
  }
}

TEST_F(ErofsSmallImageTest, RefusesFeaturesByName) {
  const std::string good = Build({});
  auto with_incompat = [&](uint32_t bits) {
    std::string bytes = good;
    PutLe32(bytes, kSb + offsetof(SuperBlock, feature_incompat),
            GetLe32(bytes, kSb + offsetof(SuperBlock, feature_incompat)) | bits);
    FixChecksum(bytes);
    return OpenStatus(bytes);
  };
  struct { uint32_t bit; const char* name; } cases[] = {
      {0x10000, "unknown incompatible feature bits 0x10000"},
      {0x80000000, "unknown incompatible feature bits 0x80000000"},
      {kIncompatZeroPadding, "compression (lz4_0padding)"},
      {kIncompatComprCfgs, "compression (compr_cfgs/big_pcluster)"},
      {kIncompatZtailpacking, "compression (ztailpacking)"},
      {kIncompatFragments, "compression (fragments/dedupe)"},
      {kIncompat48Bit, "48bit"},
      {kIncompatMetabox, "metabox"},
  };
  for (const auto& c : cases) {
    Status s = with_incompat(c.bit);
    EXPECT_EQ(s.code(), ENOTSUP) << c.name;
    EXPECT_THAT(s.ToString(), HasSubstr(c.name));
  }
  // Unknown compat bits are fine.
  std::string bytes = good;
  PutLe32(bytes, kSb + offsetof(SuperBlock, feature_compat),
          GetLe32(bytes, kSb + offsetof(SuperBlock, feature_compat)) | 0x40000000);
  FixChecksum(bytes);
  EXPECT_OK(OpenStatus(bytes));
}

TEST_F(ErofsSmallImageTest, RefusesCompressedImages) {
  for (const char* alg : {"-zlz4", "-zlz4hc"}) {
    std::string bytes = Build({alg}, StrCat("z", alg + 2));
    Status s = OpenStatus(bytes);
    EXPECT_EQ(s.code(), ENOTSUP) << alg;
    EXPECT_THAT(s.ToString(), HasSubstr("compression")) << alg;
  }
  // A compressed inode in an image without the feature bits is refused
  // when it is read, by name.
  std::string bytes = Build({});
  OPEN_PATCHED(image, bytes);
  ASSERT_OK_AND_ASSIGN(Inode file, image->LookupPath("/file"));
  uint16_t format = GetLe16(bytes, file.meta_offset);
  PutLe16(bytes, file.meta_offset, static_cast<uint16_t>((format & ~0x0e) | (kLayoutCompressedCompact << 1)));
  OPEN_PATCHED(image2, bytes);
  Status s = image2->LookupPath("/file").status();
  EXPECT_EQ(s.code(), ENOTSUP);
  EXPECT_THAT(s.ToString(), HasSubstr("compressed data (layout 3) is not supported"));
}

TEST_F(ErofsSmallImageTest, RefusesCorruptInodes) {
  const std::string good = Build({"-Eforce-inode-extended"});
  OPEN_PATCHED(image, good);
  ASSERT_OK_AND_ASSIGN(Inode file, image->LookupPath("/file"));
  ASSERT_OK_AND_ASSIGN(Inode inner, image->LookupPath("/dir/inner"));
  ASSERT_OK_AND_ASSIGN(Inode link, image->LookupPath("/link"));
  ASSERT_TRUE(file.extended);

  auto status_of = [&](const std::string& bytes, uint64_t nid) -> Status {
    auto patched = Image::Open(MemorySource(Fixed(bytes)));
    if (!patched.ok()) return patched.status();
    return (*patched)->GetInode(nid).status();
  };
  {
    std::string bytes = good;
    PutLe16(bytes, file.meta_offset, static_cast<uint16_t>(GetLe16(bytes, file.meta_offset) | 0x40));
    Status s = status_of(bytes, file.nid);
    EXPECT_EQ(s.code(), ENOTSUP);
    EXPECT_THAT(s.ToString(), HasSubstr(StrCat("inode ", file.nid, ": unknown i_format bits 0x40")));
  }
  {
    std::string bytes = good;
    PutLe16(bytes, file.meta_offset, static_cast<uint16_t>((GetLe16(bytes, file.meta_offset) & ~0x0e) | (5 << 1)));
    EXPECT_THAT(status_of(bytes, file.nid).ToString(), HasSubstr("unknown data layout 5"));
  }
  {
    std::string bytes = good;
    PutLe16(bytes, file.meta_offset + 4, 0);  // i_mode
    Status s = status_of(bytes, file.nid);
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("bad file mode"));
  }
  {
    std::string bytes = good;
    PutLe64(bytes, inner.meta_offset + 8, 4095);  // an inline tail that crosses a block
    Status s = status_of(bytes, inner.nid);
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("crosses a block boundary"));
  }
  {
    std::string bytes = good;
    PutLe64(bytes, inner.meta_offset + 8, 1ULL << 63);
    EXPECT_THAT(status_of(bytes, inner.nid).ToString(), HasSubstr("is out of range"));
  }
  {
    std::string bytes = good;
    PutLe64(bytes, link.meta_offset + 8, 5000);
    Status s = status_of(bytes, link.nid);
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("symlink target of 5000 bytes"));
  }
  {
    std::string bytes = good;
    PutLe16(bytes, file.meta_offset + 2, 0xFFFF);  // i_xattr_icount
    Status s = status_of(bytes, file.nid);
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("inline xattrs run past the end"));
  }
  {
    // A flat file whose blocks lie beyond the image.
    std::string plain = Build({"-Enoinline_data", "-Eforce-inode-extended"}, "plain");
    OPEN_PATCHED(pimage, plain);
    ASSERT_OK_AND_ASSIGN(Inode pfile, pimage->LookupPath("/file"));
    PutLe32(plain, pfile.meta_offset + 16, 99999);
    Status s = status_of(plain, pfile.nid);
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr(StrCat("inode ", pfile.nid, ": data points at block 99999 beyond device 0")));
  }
  {
    // The root is not a directory.
    std::string bytes = good;
    PutLe16(bytes, kSb + offsetof(SuperBlock, root_nid_2b), static_cast<uint16_t>(file.nid));
    FixChecksum(bytes);
    EXPECT_THAT(OpenStatus(bytes).ToString(), HasSubstr("is a regular file, not a directory"));
    PutLe16(bytes, kSb + offsetof(SuperBlock, root_nid_2b), 0xFFFF);
    FixChecksum(bytes);
    EXPECT_EQ(OpenStatus(bytes).code(), EUCLEAN);
  }
}

TEST_F(ErofsSmallImageTest, RefusesCorruptXattrs) {
  const std::string good = Build({});
  OPEN_PATCHED(image, good);
  ASSERT_OK_AND_ASSIGN(Inode x0, image->LookupPath("/x0"));
  ASSERT_GT(x0.xattr_shared_count, 0u);
  const uint64_t area = x0.meta_offset + x0.inode_size;
  const uint64_t first_inline = area + 12 + 4 * uint64_t{x0.xattr_shared_count};
  {
    std::string bytes = good;
    bytes[first_inline + 1] = 9;
    OPEN_PATCHED(patched, bytes);
    Status s = patched->ListXattrs(x0).status();
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("inline xattr 0 has unknown name index 9"));
  }
  {
    std::string bytes = good;
    PutLe16(bytes, first_inline + 2, 0xFFFF);  // value runs past the area
    OPEN_PATCHED(patched, bytes);
    EXPECT_THAT(patched->ListXattrs(x0).status().ToString(), HasSubstr("runs past its area"));
  }
  {
    std::string bytes = good;
    PutLe32(bytes, area + 12, 0x7FFFFFFF);  // shared id far beyond the image
    OPEN_PATCHED(patched, bytes);
    Status s = patched->ListXattrs(x0).status();
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("shared xattr id 2147483647"));
  }
  {
    std::string bytes = good;
    bytes[area + 4] = static_cast<char>(200);  // shared count beyond the area
    OPEN_PATCHED(patched, bytes);
    Status s = patched->GetInode(x0.nid).status();
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("shared xattr ids do not fit"));
  }
}

TEST_F(ErofsSmallImageTest, RefusesCorruptDirectories) {
  const std::string good = Build({});
  OPEN_PATCHED(image, good);
  ASSERT_OK_AND_ASSIGN(Inode root, image->Root());
  ASSERT_OK_AND_ASSIGN(Inode dir, image->LookupPath("/dir"));
  const uint64_t data = testing::DirDataOffset(*image, root);
  // Entries: ".", "..", "dir", "file", "link", "packed", "x0".."x3".
  const uint32_t names = GetLe16(good, data + 8);
  ASSERT_EQ(names, 10u * 12);
  auto name_at = [&](const std::string& bytes, int i) {
    uint16_t off = GetLe16(bytes, data + 12 * i + 8);
    return std::string_view(bytes).substr(data + off, i < 9 ? GetLe16(bytes, data + 12 * (i + 1) + 8) - off : 2);
  };
  ASSERT_EQ(name_at(good, 2), "dir");
  {
    std::string bytes = good;
    PutLe16(bytes, data + 8, 0);
    OPEN_PATCHED(patched, bytes);
    Status s = patched->ReadDir(root).status();
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("first name offset 0 is invalid"));
  }
  {
    std::string bytes = good;
    PutLe16(bytes, data + 12 * 3 + 8, 4000);  // "file" starts past the block
    OPEN_PATCHED(patched, bytes);
    EXPECT_THAT(patched->ReadDir(root).status().ToString(), HasSubstr("dirent 2 has name bytes"));
  }
  {
    std::string bytes = good;
    bytes[data + GetLe16(good, data + 12 * 2 + 8)] = 'z';  // "dir" -> "zir": out of order
    OPEN_PATCHED(patched, bytes);
    Status s = patched->ReadDir(root).status();
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("out of order"));
  }
  {
    std::string bytes = good;
    bytes[data + GetLe16(good, data + 12 * 2 + 8)] = '/';
    OPEN_PATCHED(patched, bytes);
    EXPECT_THAT(patched->ReadDir(root).status().ToString(), HasSubstr("contains '/' or NUL"));
  }
  {
    std::string bytes = good;
    bytes[data + 12 * 3 + 10] = 9;  // file type
    OPEN_PATCHED(patched, bytes);
    EXPECT_THAT(patched->ReadDir(root).status().ToString(), HasSubstr("bad file type 9"));
  }
  {
    std::string bytes = good;
    bytes[data + 12 * 3 + 10] = kFtDirectory;  // "file" claims to be a directory
    OPEN_PATCHED(patched, bytes);
    EXPECT_THAT(WalkAll(*patched).ToString(), HasSubstr("the directory entry says directory"));
  }
  {
    std::string bytes = good;
    PutLe64(bytes, data + 12 * 3, 1ULL << 40);  // nid far away
    OPEN_PATCHED(patched, bytes);
    Status s = WalkAll(*patched);
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("/file"));
  }
  {
    // /dir's ".." is fine, but make its entry in the root point at the root:
    // a cycle.
    std::string bytes = good;
    PutLe64(bytes, data + 12 * 2, root.nid);
    OPEN_PATCHED(patched, bytes);
    Status s = WalkAll(*patched);
    EXPECT_EQ(s.code(), EUCLEAN);
    EXPECT_THAT(s.ToString(), HasSubstr("reached twice"));
  }
  (void)dir;
}

TEST_F(ErofsSmallImageTest, WalkRefusesDirectoriesSharingBlocks) {
  // Two directories large enough to need a full block each.
  const std::string src = dir_.Sub("two-dirs");
  for (const char* d : {"a", "b"}) {
    ASSERT_OK(MakeDirs(StrCat(src, "/", d)));
    for (int i = 0; i < 200; ++i) {
      ASSERT_OK(WriteFileAtomic(StrCat(src, "/", d, "/entry-", i), "", false));
    }
  }
  ASSERT_OK_AND_ASSIGN(BuiltImage built, MakeImage(src, dir_.path(), "two-dirs", {}, false));
  std::string bytes = ReadAll(built.meta);
  OPEN_PATCHED(image, bytes);
  ASSERT_OK_AND_ASSIGN(Inode a, image->LookupPath("/a"));
  ASSERT_OK_AND_ASSIGN(Inode b, image->LookupPath("/b"));
  ASSERT_GT(a.size, 4096u);
  ASSERT_OK(WalkAll(*image));
  // /b's first block becomes /a's: each directory still reads alone, but a
  // walk would parse that block twice.
  PutLe32(bytes, b.meta_offset + 16, a.start_block);
  OPEN_PATCHED(patched, bytes);
  ASSERT_OK_AND_ASSIGN(Inode shared, patched->LookupPath("/b"));
  EXPECT_EQ(shared.start_block, a.start_block);
  Status s = WalkAll(*patched);
  EXPECT_EQ(s.code(), EUCLEAN);
  EXPECT_THAT(s.ToString(), HasSubstr("also belongs to another directory"));
}

TEST_F(ErofsSmallImageTest, RefusesChunkIndexesBeyondTheirDevice) {
  auto built = MakeImage(Src(), dir_.path(), "blob", {"--chunksize=4096"}, true);
  ASSERT_OK(built.status());
  std::string bytes = ReadAll(built->meta);
  OPEN_PATCHED(image, bytes);
  ASSERT_OK_AND_ASSIGN(Inode file, image->LookupPath("/file"));
  ASSERT_TRUE(file.chunk_indexes);
  const uint64_t table = (file.meta_offset + file.inode_size + file.xattr_size + 7) / 8 * 8;
  PutLe32(bytes, table + 8 * 3 + 4, 99999);
  ASSERT_OK_AND_ASSIGN(auto blob, FileSource(built->blob));
  ASSERT_OK_AND_ASSIGN(auto patched, Image::Open(MemorySource(Fixed(bytes)), {blob}));
  ASSERT_OK_AND_ASSIGN(file, patched->LookupPath("/file"));
  Status s = patched->MapFile(file).status();
  EXPECT_EQ(s.code(), EUCLEAN);
  EXPECT_THAT(s.ToString(), HasSubstr(StrCat("erofs image: inode ", file.nid,
                                             ": chunk index 3 points at block 99999 beyond device 1 (",
                                             blob->size() / 4096, " blocks)")));
  std::string buf(20000, '\0');
  EXPECT_EQ(patched->Read(file, 0, std::span<char>(buf)).status().code(), EUCLEAN);
  // The chunks before the bad one still read.
  ASSERT_OK_AND_ASSIGN(size_t n, patched->Read(file, 0, std::span<char>(buf.data(), 3 * 4096)));
  EXPECT_EQ(n, 3u * 4096);
}

// With STRATA_EROFS_SEED_DIR set, writes the hand-patched images there:
// that is how the committed fuzz seeds in tests/fuzz/seeds/ were made.
TEST_F(ErofsSmallImageTest, WritesPatchedImagesAsFuzzSeedsWhenAsked) {
  const char* out = std::getenv("STRATA_EROFS_SEED_DIR");
  if (out == nullptr) return;
  ASSERT_OK_AND_ASSIGN(BuiltImage prefix, testing::MakeLongPrefixImage(Src(), dir_.path()));
  ASSERT_OK_AND_ASSIGN(BuiltImage packed, testing::MakePackedPrefixImage(Src(), dir_.path()));
  ASSERT_OK_AND_ASSIGN(BuiltImage hole, testing::MakeChunkHoleImage(Src(), dir_.path(), false));
  ASSERT_OK_AND_ASSIGN(BuiltImage hole_blob, testing::MakeChunkHoleImage(Src(), dir_.path(), true));
  ASSERT_OK(WriteFileAtomic(StrCat(out, "/long-prefix.erofs"), ReadAll(prefix.meta), false));
  ASSERT_OK(WriteFileAtomic(StrCat(out, "/packed-prefix.erofs"), ReadAll(packed.meta), false));
  ASSERT_OK(WriteFileAtomic(StrCat(out, "/chunk-hole.erofs"), ReadAll(hole.meta), false));
  ASSERT_OK(WriteFileAtomic(StrCat(out, "/chunk-hole-blob-meta.erofs"), ReadAll(hole_blob.meta), false));
}

// Random damage to the metadata must give errors, never crashes or hangs.
// (The fuzz target does this far more thoroughly under sanitizers.)
TEST_F(ErofsSmallImageTest, SurvivesRandomCorruption) {
  std::vector<std::string> images = {Build({}), Build({"-Enoinline_data"}, "p"),
                                     Build({"--chunksize=4096", "-Eforce-inode-compact"}, "c")};
  std::mt19937_64 rng(7);
  int opened = 0, walked = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes = images[round % images.size()];
    int flips = 1 + static_cast<int>(rng() % 4);
    // Damage the metadata (the first blocks) rather than file data.
    uint64_t span = std::min<uint64_t>(bytes.size(), 3 * 4096);
    for (int f = 0; f < flips; ++f) bytes[rng() % span] ^= static_cast<char>(1 + rng() % 255);
    FixChecksum(bytes);
    auto image = Image::Open(MemorySource(bytes));
    if (!image.ok()) continue;
    ++opened;
    if (WalkAll(**image).ok()) ++walked;
  }
  EXPECT_GT(opened, 100);
  RecordProperty("opened", opened);
  RecordProperty("walked", walked);
}

}  // namespace
}  // namespace strata::erofs
