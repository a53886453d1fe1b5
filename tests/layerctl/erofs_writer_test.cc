// The EROFS image writer: every image is read back through strata's reader,
// checked by fsck.erofs and (as root) mounted by the kernel, which must show
// the same tree (tests/layerctl/image_check.h).
#include "common/erofs/writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/erofs/format.h"
#include "common/fs.h"
#include "common/strings.h"
#include "tests/layerctl/image_check.h"
#include "tests/testing/test_util.h"

namespace strata::erofs {
namespace {

using erofs::FileType;
using strata::testing::ContentHash;
using strata::testing::MakeTempDir;
using strata::testing::RandomBytes;

constexpr uint64_t kMiB = 1 << 20;

Attributes Attr(uint32_t mode, uint32_t uid = 0, uint32_t gid = 0, int64_t mtime = 1600000000, uint32_t nsec = 0,
                std::vector<erofs::Xattr> xattrs = {}) {
  return Attributes{
      .mode = mode, .uid = uid, .gid = gid, .mtime = mtime, .mtime_nsec = nsec, .xattrs = std::move(xattrs)};
}

// Hands over `pieces` (offset, bytes) one by one.
DataSource Pieces(std::vector<std::pair<uint64_t, std::string>> pieces) {
  auto state = std::make_shared<std::pair<std::vector<std::pair<uint64_t, std::string>>, size_t>>(std::move(pieces), 0);
  return [state]() -> Result<std::optional<DataPiece>> {
    auto& [list, next] = *state;
    if (next == list.size()) return std::optional<DataPiece>();
    const auto& p = list[next++];
    return std::optional<DataPiece>(DataPiece{p.first, std::span<const char>(p.second.data(), p.second.size())});
  };
}
DataSource Bytes(const std::string& data) { return Pieces({{0, data}}); }
Status AddBytes(ImageWriter& w, std::string_view path, const Attributes& attrs, const std::string& data) {
  return w.AddFile(path, attrs, data.size(), Bytes(data));
}

bool Contains(const Status& s, std::string_view text) { return s.ToString().find(text) != std::string::npos; }

class ErofsWriterTest : public ::testing::Test {
 protected:
  std::unique_ptr<ImageWriter> NewWriter(uint32_t chunk_size = kMiB) {
    auto w = ImageWriter::Create({.chunk_size = chunk_size, .blob_path = blob()});
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(*w) : nullptr;
  }

  // Finishes `w` and checks the image with the reader, fsck.erofs and the
  // kernel.
  Result<testing::CheckedImage> FinishAndCheck(ImageWriter& w, ImageSummary* summary = nullptr) {
    STRATA_ASSIGN_OR_RETURN(ImageSummary s, w.Finish(meta()));
    STRATA_ASSIGN_OR_RETURN(std::string meta_bytes, ReadFileToString(meta()));
    if (s.meta_size != meta_bytes.size() || s.meta_hash != HashBytes(meta_bytes)) {
      return Error(EINVAL, "the summary does not describe the metadata image");
    }
    STRATA_ASSIGN_OR_RETURN(std::string blob_bytes, ReadFileToString(blob()));
    if (s.blob_size != blob_bytes.size()) return Error(EINVAL, "the summary does not give the blob's size");
    // Every extent holds exactly the bytes its hash names; padding is zero.
    uint64_t end = 0;
    for (const auto& e : s.extents) {
      if (e.offset % 4096 || e.offset < end || e.offset + e.length > blob_bytes.size()) {
        return Error(EINVAL, StrCat("extent at ", e.offset, " is misplaced"));
      }
      if (blob_bytes.find_first_not_of('\0', end) < e.offset) return Error(EINVAL, "padding is not zero");
      if (HashBytes(std::string_view(blob_bytes).substr(e.offset, e.length)) != e.hash) {
        return Error(EINVAL, StrCat("extent at ", e.offset, " does not match its hash"));
      }
      end = e.offset + e.length;
    }
    if (blob_bytes.find_first_not_of('\0', end) != std::string::npos)
      return Error(EINVAL, "the blob's tail is not zero");
    if (summary) *summary = s;
    auto checked = testing::CheckImage(meta(), blob(), dir_.path());
    if (checked.ok() && !checked->kernel_checked) {
      std::cerr << "note: not root, so the kernel did not mount this image\n";
    }
    return checked;
  }

  std::string meta() const { return dir_.Sub("meta.img"); }
  std::string blob() const { return dir_.Sub("blob.img"); }

  TempDir dir_ = MakeTempDir();
};

TEST_F(ErofsWriterTest, EveryKindOfEntryRoundTrips) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  const std::string big = RandomBytes(3 * kMiB + 5, 1);
  const std::string cap("\x01\x00\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 20);
  ASSERT_OK(w->AddDirectory("", Attr(0755, 0, 0, 1700000000, 42)));
  ASSERT_OK(w->AddDirectory("dir", Attr(01777, 1000, 1001, 1600000000, 123456789, {{"user.note", "on a dir"}})));
  ASSERT_OK(AddBytes(*w, "dir/small", Attr(04755, 0, 0, 1500000000, 999999999), "hello"));
  ASSERT_OK(w->AddFile("dir/big", Attr(02640, 4000000000u, 4000000001u, -1, 5), big.size(), Bytes(big)));
  ASSERT_OK(w->AddFile("empty", Attr(0), 0, Pieces({})));
  ASSERT_OK(AddBytes(
      *w, "caps", Attr(0755, 0, 0, 1, 0, {{"security.capability", cap}, {"trusted.strata", "t"}, {"user.empty", ""}}),
      "x"));
  ASSERT_OK(w->AddSymlink("dir/link", Attr(0777, 1000, 1000, 1234567890, 1), "../empty"));
  ASSERT_OK(w->AddSymlink("abs", Attr(0777, 0, 0, 0, 0, {{"trusted.on-symlink", "s"}}), "/usr/bin/python3"));
  ASSERT_OK(w->AddSpecial("dev/null", FileType::kCharDevice, Attr(0666), makedev(1, 3)));
  ASSERT_OK(w->AddSpecial("dev/loop", FileType::kBlockDevice, Attr(0660, 0, 6), makedev(7, 300000)));
  ASSERT_OK(w->AddSpecial("dev/largest", FileType::kCharDevice, Attr(0600), makedev(4095, 0xfffff)));
  ASSERT_OK(w->AddSpecial("dev/whiteout", FileType::kCharDevice, Attr(0), makedev(0, 0)));
  ASSERT_OK(w->AddSpecial("fifo", FileType::kFifo, Attr(0620)));
  ASSERT_OK(w->AddSpecial("sock", FileType::kSocket, Attr(0755)));
  ASSERT_OK(w->AddHardlink("dir/small-again", "dir/small"));
  EXPECT_EQ(w->TypeOf("dir/link"), FileType::kSymlink);
  EXPECT_EQ(w->TypeOf("dev"), FileType::kDirectory);
  EXPECT_EQ(w->TypeOf(""), FileType::kDirectory);
  EXPECT_EQ(w->TypeOf("dir/link/x"), std::nullopt);
  EXPECT_EQ(w->TypeOf("nothing"), std::nullopt);

  ImageSummary summary;
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w, &summary));
  const auto& t = checked.tree;
  EXPECT_EQ(t.size(), 16u);
  EXPECT_EQ(summary.inodes, 15u);  // the hardlink adds a name, not an inode
  EXPECT_EQ(summary.file_bytes, big.size() + 5 + 1);
  EXPECT_EQ(summary.extents.size(), 4u + 2u);

  EXPECT_EQ(t.at(".").mode, S_IFDIR | 0755u);
  EXPECT_EQ(t.at(".").mtime_ns, 1700000000000000042);
  EXPECT_EQ(t.at(".").nlink, 4u);  // ".", "..", dir, dev
  EXPECT_EQ(t.at("dir").mode, S_IFDIR | 01777u);
  EXPECT_EQ(t.at("dir").uid, 1000u);
  EXPECT_EQ(t.at("dir").gid, 1001u);
  EXPECT_EQ(t.at("dir").nlink, 2u);
  EXPECT_EQ(t.at("dir").xattrs.at("user.note"), "on a dir");
  EXPECT_EQ(t.at("dir/small").mode, S_IFREG | 04755u);
  EXPECT_EQ(t.at("dir/small").mtime_ns, 1500000000999999999);
  EXPECT_EQ(t.at("dir/small").content_hash, ContentHash("hello"));
  EXPECT_EQ(t.at("dir/small").nlink, 2u);
  EXPECT_EQ(t.at("dir/small-again").hardlink_group, "dir/small");
  EXPECT_EQ(t.at("dir/big").mode, S_IFREG | 02640u);
  EXPECT_EQ(t.at("dir/big").uid, 4000000000u);
  EXPECT_EQ(t.at("dir/big").gid, 4000000001u);
  EXPECT_EQ(t.at("dir/big").mtime_ns, -1000000000 + 5);
  EXPECT_EQ(t.at("dir/big").size, big.size());
  EXPECT_EQ(t.at("dir/big").content_hash, ContentHash(big));
  EXPECT_EQ(t.at("empty").mode, S_IFREG | 0u);
  EXPECT_EQ(t.at("empty").size, 0u);
  EXPECT_EQ(t.at("caps").xattrs.at("security.capability"), cap);
  EXPECT_EQ(t.at("caps").xattrs.at("trusted.strata"), "t");
  EXPECT_EQ(t.at("caps").xattrs.at("user.empty"), "");
  EXPECT_EQ(t.at("dir/link").link, "../empty");
  EXPECT_EQ(t.at("dir/link").uid, 1000u);
  EXPECT_EQ(t.at("abs").link, "/usr/bin/python3");
  EXPECT_EQ(t.at("abs").xattrs.at("trusted.on-symlink"), "s");
  EXPECT_EQ(t.at("dev/null").mode, S_IFCHR | 0666u);
  EXPECT_EQ(t.at("dev/null").rdev, makedev(1, 3));
  EXPECT_EQ(t.at("dev/loop").mode, S_IFBLK | 0660u);
  EXPECT_EQ(t.at("dev/loop").rdev, makedev(7, 300000));
  EXPECT_EQ(t.at("dev/largest").rdev, makedev(4095, 0xfffff));
  EXPECT_EQ(t.at("dev/whiteout").rdev, makedev(0, 0));
  EXPECT_EQ(t.at("fifo").mode, S_IFIFO | 0620u);
  EXPECT_EQ(t.at("sock").mode, S_IFSOCK | 0755u);

  // The layout the format section promises.
  const erofs::ImageInfo& info = checked.image->info();
  EXPECT_EQ(info.build_time, 0u);
  EXPECT_EQ(info.block_size, 4096u);
  EXPECT_EQ(info.inode_count, 15u);
  EXPECT_EQ(info.uuid[14], '8');  // version 8: derived from the content
  EXPECT_EQ(info.device_blocks[1] * 4096, summary.blob_size);
  ASSERT_OK_AND_ASSIGN(erofs::Inode big_inode, checked.image->LookupPath("dir/big"));
  EXPECT_TRUE(big_inode.extended);
  EXPECT_EQ(big_inode.layout, erofs::DataLayout::kChunkBased);
  EXPECT_TRUE(big_inode.chunk_indexes);
  EXPECT_EQ(big_inode.chunk_bits, 20u);
  ASSERT_OK_AND_ASSIGN(auto map, checked.image->MapFile(big_inode));
  ASSERT_EQ(map.size(), 4u);
  for (const auto& e : map) EXPECT_EQ(e.device, 1u);
  EXPECT_EQ(map[3].length, 5u);
  ASSERT_OK_AND_ASSIGN(erofs::Inode link, checked.image->LookupPath("dir/link"));
  EXPECT_EQ(link.layout, erofs::DataLayout::kFlatInline);
}

TEST_F(ErofsWriterTest, PosixAclsAreKept) {
  // system.posix_acl_access: version 2, then (tag, perm, id) entries.
  auto entry = [](uint16_t tag, uint16_t perm, uint32_t id) {
    std::string e(8, '\0');
    std::memcpy(e.data(), &tag, 2);
    std::memcpy(e.data() + 2, &perm, 2);
    std::memcpy(e.data() + 4, &id, 4);
    return e;
  };
  std::string acl("\x02\x00\x00\x00", 4);
  acl += entry(0x01, 7, UINT32_MAX);  // ACL_USER_OBJ
  acl += entry(0x02, 6, 1234);        // ACL_USER 1234
  acl += entry(0x04, 5, UINT32_MAX);  // ACL_GROUP_OBJ
  acl += entry(0x10, 7, UINT32_MAX);  // ACL_MASK
  acl += entry(0x20, 4, UINT32_MAX);  // ACL_OTHER
  auto w = NewWriter();
  ASSERT_TRUE(w);
  ASSERT_OK(AddBytes(*w, "f", Attr(0754, 0, 0, 1, 0, {{"system.posix_acl_access", acl}}), "acl"));
  ASSERT_OK(w->AddDirectory("d", Attr(0755, 0, 0, 1, 0, {{"system.posix_acl_default", acl}})));
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  EXPECT_EQ(checked.tree.at("f").xattrs.at("system.posix_acl_access"), acl);
  EXPECT_EQ(checked.tree.at("d").xattrs.at("system.posix_acl_default"), acl);
}

TEST_F(ErofsWriterTest, NamesOf255BytesAndOddBytes) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  const std::string longest(255, 'n');
  std::vector<std::string> names = {longest,
                                    std::string(254, 'm') + "\xff",
                                    "with space",
                                    "new\nline",
                                    "\x01\x02\x7f",
                                    "\xff\xfe",
                                    "-",
                                    "+",
                                    ".hidden",
                                    "...",
                                    "..a",
                                    ".a",
                                    "A",
                                    "a",
                                    "ünïcødé"};
  for (const auto& n : names) ASSERT_OK(AddBytes(*w, n, Attr(0644), n));
  EXPECT_EQ(w->AddDirectory(longest + "x", Attr(0755)).code(), ENAMETOOLONG);
  ASSERT_OK(w->AddDirectory("d/" + longest, Attr(0755)));
  ASSERT_OK(AddBytes(*w, "d/" + longest + "/" + longest, Attr(0600), "deep long"));
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  for (const auto& n : names) {
    SCOPED_TRACE(Quote(n));
    ASSERT_TRUE(checked.tree.count(n));
    EXPECT_EQ(checked.tree.at(n).content_hash, ContentHash(n));
    ASSERT_OK_AND_ASSIGN(erofs::Inode root, checked.image->Root());
    EXPECT_OK(checked.image->Lookup(root, n).status());
  }
  EXPECT_EQ(checked.tree.at("d/" + longest + "/" + longest).content_hash, ContentHash("deep long"));
}

TEST_F(ErofsWriterTest, WideDirectoriesSpanManyBlocks) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  std::vector<std::string> names;
  for (int i = 0; i < 3000; ++i)
    names.push_back(StrCat("entry-", i, "-", std::string(static_cast<size_t>(i % 200), 'w')));
  // Names around "." and "..", which sort among them.
  for (const char* n : {"-", ",", ".-", ".0", "..0", "0", "\x01", "\xff"}) names.push_back(n);
  for (const auto& n : names) ASSERT_OK(w->AddFile("wide/" + n, Attr(0644), 0, Pieces({})));
  for (int i = 0; i < 50; ++i) ASSERT_OK(w->AddDirectory(StrCat("wide/sub-", i), Attr(0700)));
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  ASSERT_OK_AND_ASSIGN(erofs::Inode wide, checked.image->LookupPath("wide"));
  EXPECT_GT(wide.size, 50u * 4096);
  EXPECT_EQ(wide.nlink, 52u);
  ASSERT_OK_AND_ASSIGN(auto entries, checked.image->ReadDir(wide));
  EXPECT_EQ(entries.size(), names.size() + 50);
  for (const auto& n : names) {
    SCOPED_TRACE(Quote(n));
    EXPECT_OK(checked.image->Lookup(wide, n).status());  // the kernel's binary search over blocks
  }
  EXPECT_EQ(checked.image->Lookup(wide, "entry-3000").status().code(), ENOENT);
}

TEST_F(ErofsWriterTest, DeepPaths) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  std::string path;
  for (int i = 0; i < 600; ++i) path += StrCat(i ? "/" : "", "d", i % 10);
  ASSERT_OK(AddBytes(*w, path + "/bottom", Attr(0644), "bottom"));
  ASSERT_OK(w->AddSymlink(path + "/up", Attr(0777), "../../.."));
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  EXPECT_EQ(checked.tree.at(path + "/bottom").content_hash, ContentHash("bottom"));
  EXPECT_EQ(checked.tree.at(path).mode, S_IFDIR | 0755u);  // created with the documented defaults
  EXPECT_EQ(checked.tree.at(path).mtime_ns, 0);
  EXPECT_EQ(checked.tree.size(), 600u + 3u);
}

TEST_F(ErofsWriterTest, SparseFilesBeyond4GiBCostNothing) {
  // From a descriptor: holes found with SEEK_DATA, data beyond 4 GiB.
  const std::string sparse = dir_.Sub("sparse");
  {
    ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(sparse, O_RDWR | O_CREAT | O_TRUNC, 0644));
    ASSERT_OK(PwriteFull(fd.get(), std::string_view("head"), 0));
    ASSERT_OK(PwriteFull(fd.get(), std::string_view("beyond-4GiB"), (4ull << 30) + 12345));
    ASSERT_EQ(::ftruncate(fd.get(), (5ull << 30) + 7), 0);
  }
  auto w = NewWriter();
  ASSERT_TRUE(w);
  {
    ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(sparse, O_RDONLY));
    ASSERT_OK(w->AddFile("from-fd", Attr(0644), fd.get()));
  }
  // From a stream with an explicit sparse map, as libarchive gives it.
  ASSERT_OK(w->AddFile("from-stream", Attr(0644), (6ull << 30),
                       Pieces({{0, "start"}, {(4ull << 30) - 2, "across-4GiB"}, {(6ull << 30) - 3, "end"}})));
  ImageSummary summary;
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w, &summary));
  EXPECT_EQ(summary.file_bytes, (5ull << 30) + 7 + (6ull << 30));
  EXPECT_EQ(summary.extents.size(), 2u + 4u);  // "across-4GiB" straddles a chunk boundary
  EXPECT_EQ(summary.blob_size, 6 * kMiB);      // a chunk with data is stored whole; holes cost nothing
  ASSERT_OK_AND_ASSIGN(erofs::Inode inode, checked.image->LookupPath("from-fd"));
  EXPECT_EQ(inode.size, (5ull << 30) + 7);
  char buf[11];
  ASSERT_OK_AND_ASSIGN(size_t n, checked.image->Read(inode, (4ull << 30) + 12345, std::span<char>(buf, sizeof buf)));
  EXPECT_EQ(std::string(buf, n), "beyond-4GiB");
  ASSERT_OK_AND_ASSIGN(inode, checked.image->LookupPath("from-stream"));
  ASSERT_OK_AND_ASSIGN(n, checked.image->Read(inode, (4ull << 30) - 2, std::span<char>(buf, sizeof buf)));
  EXPECT_EQ(std::string(buf, n), "across-4GiB");
  ASSERT_OK_AND_ASSIGN(n, checked.image->Read(inode, (6ull << 30) - 3, std::span<char>(buf, sizeof buf)));
  EXPECT_EQ(std::string(buf, n), "end");
  ASSERT_OK_AND_ASSIGN(auto map, checked.image->MapFile(inode));
  EXPECT_EQ(map.size(), 6u * 1024);
}

TEST_F(ErofsWriterTest, HolesAndZeroChunksAreNotStored) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  const std::string data = RandomBytes(100, 3);
  // chunk 0: data then zeros; 1: hole; 2: written zeros; 3: hole; 4: data at its end.
  ASSERT_OK(w->AddFile("holey", Attr(0644), 5 * kMiB,
                       Pieces({{0, data}, {2 * kMiB, std::string(kMiB, '\0')}, {5 * kMiB - 100, data}})));
  ASSERT_OK(w->AddFile("zeros", Attr(0644), 3 * kMiB + 1, Bytes(std::string(3 * kMiB + 1, '\0'))));
  ImageSummary summary;
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w, &summary));
  EXPECT_EQ(summary.extents.size(), 2u);
  ASSERT_OK_AND_ASSIGN(erofs::Inode holey, checked.image->LookupPath("holey"));
  ASSERT_OK_AND_ASSIGN(auto map, checked.image->MapFile(holey));
  ASSERT_EQ(map.size(), 5u);
  EXPECT_FALSE(map[0].hole);
  EXPECT_TRUE(map[1].hole);
  EXPECT_TRUE(map[2].hole);
  EXPECT_TRUE(map[3].hole);
  EXPECT_FALSE(map[4].hole);
  std::string want(5 * kMiB, '\0');
  want.replace(0, 100, data);
  want.replace(5 * kMiB - 100, 100, data);
  EXPECT_EQ(checked.tree.at("holey").content_hash, ContentHash(want));
  ASSERT_OK_AND_ASSIGN(erofs::Inode zeros, checked.image->LookupPath("zeros"));
  ASSERT_OK_AND_ASSIGN(map, checked.image->MapFile(zeros));
  for (const auto& e : map) EXPECT_TRUE(e.hole);
}

TEST_F(ErofsWriterTest, IdenticalChunksAreStoredOnce) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  const std::string a = RandomBytes(3 * kMiB + 10, 7);
  const std::string block = RandomBytes(kMiB, 8);
  ASSERT_OK(w->AddFile("a", Attr(0644), a.size(), Bytes(a)));
  ASSERT_OK(w->AddFile("copy-of-a", Attr(0600), a.size(), Bytes(a)));
  ASSERT_OK(w->AddFile("repeats", Attr(0644), 4 * kMiB, Bytes(block + block + block + block)));
  ASSERT_OK(AddBytes(*w, "tail-like-a", Attr(0644), a.substr(3 * kMiB)));  // a's last chunk alone
  ImageSummary summary;
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w, &summary));
  EXPECT_EQ(summary.extents.size(), 4u + 1u);
  EXPECT_EQ(summary.blob_size, 4 * kMiB + 4096);
  EXPECT_EQ(checked.tree.at("copy-of-a").content_hash, ContentHash(a));
  EXPECT_EQ(checked.tree.at("repeats").content_hash, ContentHash(block + block + block + block));
  EXPECT_EQ(checked.tree.at("tail-like-a").content_hash, ContentHash(a.substr(3 * kMiB)));
}

TEST_F(ErofsWriterTest, LargeXattrs) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  const std::string v1 = RandomBytes(65535, 1), v2 = RandomBytes(60000, 2), v3 = RandomBytes(60000, 3);
  ASSERT_OK(AddBytes(*w, "f", Attr(0644, 0, 0, 1, 0, {{"user.a", v1}, {"user.b", v2}, {"trusted.c", v3}}), "x"));
  ASSERT_OK(w->AddDirectory("d", Attr(0755, 0, 0, 1, 0, {{"user.big", v1}})));
  ASSERT_OK(w->AddSymlink("s", Attr(0777, 0, 0, 1, 0, {{"trusted.big", v2}}), "f"));
  ASSERT_OK(AddBytes(*w, "d/inner", Attr(0644), "in"));
  ASSERT_OK(w->SetXattr("d/inner", "user.added", v3));

  const Status too_big = AddBytes(*w, "g", Attr(0644, 0, 0, 1, 0, {{"user.a", std::string(65536, 'v')}}), "x");
  EXPECT_EQ(too_big.code(), E2BIG);
  EXPECT_TRUE(Contains(too_big, "file g: xattr user.a has a value of 65536 bytes")) << too_big.ToString();
  std::vector<erofs::Xattr> many;
  for (int i = 0; i < 5; ++i) many.push_back({StrCat("user.x", i), v2});
  const Status too_many = AddBytes(*w, "h", Attr(0644, 0, 0, 1, 0, many), "x");
  EXPECT_EQ(too_many.code(), E2BIG);
  EXPECT_TRUE(Contains(too_many, "file h: 5 xattrs take")) << too_many.ToString();
  for (int i = 0; i < 3; ++i) ASSERT_OK(w->SetXattr("d/inner", StrCat("user.more", i), v2));
  EXPECT_EQ(w->SetXattr("d/inner", "user.one-too-many", v2).code(), E2BIG);

  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  const auto& f = checked.tree.at("f").xattrs;
  EXPECT_EQ(f.at("user.a"), v1);
  EXPECT_EQ(f.at("user.b"), v2);
  EXPECT_EQ(f.at("trusted.c"), v3);
  EXPECT_EQ(checked.tree.at("d").xattrs.at("user.big"), v1);
  EXPECT_EQ(checked.tree.at("s").xattrs.at("trusted.big"), v2);
  EXPECT_EQ(checked.tree.at("d/inner").xattrs.size(), 4u);
  EXPECT_EQ(checked.tree.at("d/inner").xattrs.count("user.one-too-many"), 0u);
  EXPECT_EQ(checked.tree.count("g"), 0u);
}

TEST_F(ErofsWriterTest, HardlinkGroupsAndLinkCounts) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  ASSERT_OK(AddBytes(*w, "a", Attr(0644), "first a"));
  ASSERT_OK(w->AddHardlink("b", "a"));
  ASSERT_OK(w->AddHardlink("sub/c", "a"));
  ASSERT_OK(w->AddHardlink("sub/c", "a"));  // again: nothing changes
  ASSERT_OK(w->AddSymlink("s", Attr(0777), "a"));
  ASSERT_OK(w->AddHardlink("s2", "s"));
  ASSERT_OK(w->AddSpecial("dev", FileType::kCharDevice, Attr(0600), makedev(1, 5)));
  ASSERT_OK(w->AddHardlink("dev2", "dev"));
  ASSERT_OK(AddBytes(*w, "x", Attr(0644), "x"));
  ASSERT_OK(w->AddHardlink("y", "x"));
  ASSERT_OK(w->AddHardlink("y", "a"));  // y now names a's inode; x is alone again
  // Replacing a: the links keep the old inode, as after tar's unlink.
  ASSERT_OK(AddBytes(*w, "a", Attr(0600), "second a"));

  const Status missing = w->AddHardlink("m", "nope");
  EXPECT_EQ(missing.code(), ENOENT);
  EXPECT_TRUE(Contains(missing, "hardlink m: its target nope does not exist")) << missing.ToString();
  EXPECT_EQ(w->AddHardlink("m", "sub").code(), EPERM);
  EXPECT_EQ(w->AddHardlink("m", "").code(), EPERM);
  EXPECT_EQ(w->AddHardlink("m", "s/through").code(), ENOENT);
  EXPECT_EQ(w->TypeOf("m"), std::nullopt);

  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  const auto& t = checked.tree;
  EXPECT_EQ(t.at("a").content_hash, ContentHash("second a"));
  EXPECT_EQ(t.at("a").nlink, 1u);
  EXPECT_EQ(t.at("b").content_hash, ContentHash("first a"));
  EXPECT_EQ(t.at("b").nlink, 3u);
  EXPECT_EQ(t.at("sub/c").hardlink_group, "b");
  EXPECT_EQ(t.at("y").hardlink_group, "b");
  EXPECT_EQ(t.at("x").nlink, 1u);
  EXPECT_EQ(t.at("s2").hardlink_group, "s");
  EXPECT_EQ(t.at("s2").nlink, 2u);
  EXPECT_EQ(t.at("dev2").rdev, makedev(1, 5));
  EXPECT_EQ(t.at("dev2").nlink, 2u);
  EXPECT_EQ(checked.image->info().inode_count, 7u);  // root, a, the first a, sub, s, dev, x
}

TEST_F(ErofsWriterTest, LaterEntriesReplaceEarlierOnes) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  const std::string old_data = RandomBytes(kMiB + 3, 11), new_data = RandomBytes(5000, 12);
  ASSERT_OK(w->AddFile("f", Attr(0644), old_data.size(), Bytes(old_data)));
  ASSERT_OK(w->AddFile("f", Attr(0600), new_data.size(), Bytes(new_data)));
  ASSERT_OK(AddBytes(*w, "tree/x/y", Attr(0644), "gone"));
  ASSERT_OK(AddBytes(*w, "tree", Attr(0644), "a file now"));  // the whole subtree goes
  ASSERT_OK(AddBytes(*w, "was-file", Attr(0644), "x"));
  ASSERT_OK(w->AddDirectory("was-file", Attr(0750, 5, 5, 77)));
  ASSERT_OK(AddBytes(*w, "dir/kept", Attr(0644), "kept"));
  ASSERT_OK(w->AddDirectory("dir", Attr(0711, 9, 9, 99, 9, {{"user.v", "2"}})));  // entries stay
  ASSERT_OK(w->AddDirectory("", Attr(0700, 0, 0, 5)));                            // the root too
  ASSERT_OK(w->AddSymlink("l", Attr(0777), "first"));
  ASSERT_OK(w->AddSymlink("l", Attr(0777), "second"));
  ImageSummary summary;
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w, &summary));
  const auto& t = checked.tree;
  EXPECT_EQ(t.at("f").content_hash, ContentHash(new_data));
  EXPECT_EQ(t.at("f").mode, S_IFREG | 0600u);
  EXPECT_EQ(t.at("tree").content_hash, ContentHash("a file now"));
  EXPECT_EQ(t.count("tree/x"), 0u);
  EXPECT_EQ(t.at("was-file").mode, S_IFDIR | 0750u);
  EXPECT_EQ(t.at("dir").mode, S_IFDIR | 0711u);
  EXPECT_EQ(t.at("dir").uid, 9u);
  EXPECT_EQ(t.at("dir").xattrs.at("user.v"), "2");
  EXPECT_EQ(t.at("dir/kept").content_hash, ContentHash("kept"));
  EXPECT_EQ(t.at(".").mode, S_IFDIR | 0700u);
  EXPECT_EQ(t.at(".").nlink, 4u);
  EXPECT_EQ(t.at("l").link, "second");
  // Only data some inode still uses is stored; the rest of the blob is zero.
  EXPECT_EQ(summary.extents.size(), 3u);  // new_data, "a file now", "kept"
  for (const auto& e : summary.extents) {
    EXPECT_NE(e.hash, HashBytes(std::string_view(old_data).substr(0, kMiB)));
    EXPECT_NE(e.hash, HashBytes(std::string_view("gone")));
  }
  ASSERT_OK_AND_ASSIGN(std::string blob_bytes, ReadFileToString(blob()));
  EXPECT_EQ(blob_bytes.find(old_data.substr(0, 64)), std::string::npos);
}

// With a group size, small chunks side by side share an extent; a group
// ends after a member whose name ends in four zero bits, and never spans
// the zeroed chunk of a replaced file.
TEST_F(ErofsWriterTest, SmallChunksAreGroupedUpToANameAndNeverAcrossAReplacedOne) {
  auto w = ImageWriter::Create({.chunk_size = kMiB, .group_size = 128 << 10, .blob_path = blob()});
  ASSERT_OK(w.status());
  std::vector<std::string> data;
  for (int i = 0; i < 48; ++i) {
    data.push_back(RandomBytes(100 + (i * 977) % 3000, 100 + i));
    ASSERT_OK(AddBytes(**w, StrCat("s", 100 + i), Attr(0644), data.back()));
  }
  const std::string replaced = RandomBytes(2000, 99);
  ASSERT_OK(AddBytes(**w, "s120", Attr(0644), replaced));  // s120's first chunk is dead now
  ImageSummary summary;
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(**w, &summary));
  EXPECT_EQ(checked.tree.at("s120").content_hash, ContentHash(replaced));
  EXPECT_LT(summary.extents.size(), data.size() / 2);

  ASSERT_OK_AND_ASSIGN(std::string blob_bytes, ReadFileToString(blob()));
  auto where = [&](const std::string& d) { return blob_bytes.find(d); };
  for (size_t i = 0; i < data.size(); ++i) {
    if (i != 20) {
      ASSERT_NE(where(data[i]), std::string::npos) << i;
    }
  }
  EXPECT_EQ(where(data[20]), std::string::npos);  // zeroed
  size_t groups = 0;
  for (const auto& e : summary.extents) {
    // The files whose data starts in this extent, in blob order.
    std::vector<size_t> members;
    for (size_t i = 0; i < data.size(); ++i) {
      if (i == 20) continue;
      const size_t at = where(data[i]);
      if (at >= e.offset && at < e.offset + e.length) members.push_back(i);
    }
    ASSERT_FALSE(members.empty());
    groups += members.size() > 1;
    EXPECT_LE(e.length, 128u << 10);
    for (size_t m = 0; m + 1 < members.size(); ++m) {
      EXPECT_NE(HashBytes(data[members[m]]).low & 15, 0u) << "a group goes on past a member whose name ends it";
    }
    // s119 and s121 lay on either side of s120's dead chunk.
    EXPECT_FALSE(std::count(members.begin(), members.end(), 19) && std::count(members.begin(), members.end(), 21));
  }
  EXPECT_GT(groups, 1u);
}

TEST_F(ErofsWriterTest, InlineAndPlainTails) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  // Targets of every size class: tiny, one that needs a fresh block to sit
  // inline, one that cannot be inline, the longest.
  for (size_t n : {1, 100, 2000, 3000, 4000, 4030, 4095}) {
    ASSERT_OK(w->AddSymlink(StrCat("links/", n), Attr(0777), std::string(n, 't')));
    ASSERT_OK(w->AddSymlink(StrCat("links/", n, "-x"), Attr(0777, 0, 0, 1, 0, {{"trusted.x", std::string(300, 'x')}}),
                            std::string(n, 'u')));
  }
  // Directories whose last block is nearly full.
  for (int d = 0; d < 4; ++d) {
    for (int i = 0; i < 30 + d * 7; ++i) {
      ASSERT_OK(w->AddSpecial(StrCat("dirs/", d, "/", std::string(100, 'e'), i), FileType::kFifo, Attr(0600)));
    }
  }
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  for (size_t n : {1, 100, 2000, 3000, 4000, 4030, 4095}) {
    EXPECT_EQ(checked.tree.at(StrCat("links/", n)).link, std::string(n, 't'));
    EXPECT_EQ(checked.tree.at(StrCat("links/", n, "-x")).link, std::string(n, 'u'));
  }
  ASSERT_OK_AND_ASSIGN(erofs::Inode small, checked.image->LookupPath("links/100"));
  EXPECT_EQ(small.layout, erofs::DataLayout::kFlatInline);
  ASSERT_OK_AND_ASSIGN(erofs::Inode longest, checked.image->LookupPath("links/4095-x"));
  EXPECT_EQ(longest.layout, erofs::DataLayout::kFlatPlain);
}

TEST_F(ErofsWriterTest, InodesAndTheirXattrsMayCrossBlocks) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  // Xattrs of every length shift the inodes after them by 4 bytes at a
  // time, so some 64-byte inodes (and xattr areas) straddle a block edge.
  for (int i = 0; i < 300; ++i) {
    ASSERT_OK(AddBytes(*w, StrCat("f", i),
                       Attr(0644, 0, 0, i, 0, {{"user.x", std::string(static_cast<size_t>(i), 'x')}}),
                       StrCat("data ", i)));
  }
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  int crossing = 0;
  for (int i = 0; i < 300; ++i) {
    ASSERT_OK_AND_ASSIGN(erofs::Inode inode, checked.image->LookupPath(StrCat("f", i)));
    if (inode.meta_offset % 4096 > 4096 - sizeof(erofs::InodeExtended)) ++crossing;
    EXPECT_EQ(checked.tree.at(StrCat("f", i)).xattrs.at("user.x"), std::string(static_cast<size_t>(i), 'x'));
  }
  EXPECT_GT(crossing, 0);
}

TEST_F(ErofsWriterTest, TheSameCallsGiveTheSameBytes) {
  auto build = [&](const std::string& tag, int64_t mtime) -> Result<std::pair<std::string, std::string>> {
    auto w = ImageWriter::Create({.blob_path = blob() + tag});
    if (!w.ok()) return w.status();
    const std::string data = RandomBytes(2 * kMiB + 100, 5);
    STRATA_RETURN_IF_ERROR((*w)->AddFile("z/last", Attr(0644, 1, 2, mtime), data.size(), Bytes(data)));
    STRATA_RETURN_IF_ERROR(AddBytes(**w, "a", Attr(0644, 0, 0, 1, 0, {{"user.b", "2"}, {"user.a", "1"}}), "a"));
    STRATA_RETURN_IF_ERROR((*w)->AddSymlink("z/link", Attr(0777), "last"));
    STRATA_RETURN_IF_ERROR((*w)->AddHardlink("h", "z/last"));
    STRATA_RETURN_IF_ERROR((*w)->Finish(meta() + tag).status());
    STRATA_ASSIGN_OR_RETURN(std::string m, ReadFileToString(meta() + tag));
    STRATA_ASSIGN_OR_RETURN(std::string b, ReadFileToString(blob() + tag));
    return std::make_pair(m, b);
  };
  ASSERT_OK_AND_ASSIGN(auto first, build("1", 100));
  ASSERT_OK_AND_ASSIGN(auto second, build("2", 100));
  EXPECT_TRUE(first == second);
  ASSERT_OK_AND_ASSIGN(auto changed, build("3", 101));
  EXPECT_NE(first.first, changed.first);
  EXPECT_EQ(first.second, changed.second);
  // The UUID follows the content.
  EXPECT_NE(first.first.substr(erofs::kSuperOffset + offsetof(erofs::SuperBlock, uuid), 16),
            changed.first.substr(erofs::kSuperOffset + offsetof(erofs::SuperBlock, uuid), 16));
}

TEST_F(ErofsWriterTest, AnEmptyImageMounts) {
  auto w = NewWriter();
  ASSERT_TRUE(w);
  ImageSummary summary;
  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w, &summary));
  EXPECT_EQ(summary.blob_size, 0u);
  EXPECT_EQ(summary.inodes, 1u);
  EXPECT_EQ(summary.meta_size, 4096u);
  EXPECT_EQ(checked.tree.size(), 1u);
  EXPECT_EQ(checked.tree.at(".").mode, S_IFDIR | 0755u);
}

TEST_F(ErofsWriterTest, LargerBlocksReadBack) {
  auto w = ImageWriter::Create({.block_size = 16384, .chunk_size = 65536, .blob_path = blob()});
  ASSERT_OK(w.status());
  const std::string data = RandomBytes(200000, 9);
  ASSERT_OK((*w)->AddFile("f", Attr(0644), data.size(), Bytes(data)));
  for (int i = 0; i < 500; ++i)
    ASSERT_OK((*w)->AddSymlink(StrCat("links/l", i), Attr(0777), std::string(i * 8 + 1, 'l')));
  ASSERT_OK_AND_ASSIGN(ImageSummary summary, (*w)->Finish(meta()));
  EXPECT_EQ(summary.extents.size(), 4u);
  // fsck.erofs 1.5 knows 4 KiB blocks only, and the kernel mounts blocks up
  // to its page size (4 KiB here, 16 or 64 KiB on some arm64): our reader
  // checks it.
  ASSERT_OK_AND_ASSIGN(auto meta_source, erofs::FileSource(meta()));
  ASSERT_OK_AND_ASSIGN(auto blob_source, erofs::FileSource(blob()));
  ASSERT_OK_AND_ASSIGN(auto image, erofs::Image::Open(meta_source, {blob_source}));
  EXPECT_EQ(image->info().block_size, 16384u);
  ASSERT_OK_AND_ASSIGN(auto tree, strata::testing::SnapshotImage(*image));
  EXPECT_EQ(tree.at("f").content_hash, ContentHash(data));
  EXPECT_EQ(tree.at("links/l499").link, std::string(499 * 8 + 1, 'l'));
}

TEST_F(ErofsWriterTest, ErrorsNameThePathAndTheStep) {
  EXPECT_EQ(ImageWriter::Create({.block_size = 1000, .blob_path = blob()}).status().code(), EINVAL);
  EXPECT_EQ(ImageWriter::Create({.block_size = 4096, .chunk_size = 2048, .blob_path = blob()}).status().code(), EINVAL);
  EXPECT_FALSE(ImageWriter::Create({.blob_path = dir_.Sub("no/such/dir/blob")}).ok());

  auto w = NewWriter();
  ASSERT_TRUE(w);
  ASSERT_OK(AddBytes(*w, "file", Attr(0644), "f"));
  ASSERT_OK(w->AddSymlink("link", Attr(0777), "/etc"));
  struct Case {
    Status status;
    int code;
    std::string_view text;
  };
  const std::string name256(256, 'n');
  const std::vector<Case> cases = {
      {AddBytes(*w, "a//b", Attr(0644), ""), EINVAL, "file a//b: empty path component"},
      {AddBytes(*w, "/abs", Attr(0644), ""), EINVAL, "empty path component"},
      {AddBytes(*w, "a/../b", Attr(0644), ""), EINVAL, "path component .. is not allowed"},
      {w->AddDirectory("./x", Attr(0755)), EINVAL, "path component . is not allowed"},
      {AddBytes(*w, name256, Attr(0644), ""), ENAMETOOLONG, "a name of 256 bytes (at most 255)"},
      {AddBytes(*w, std::string("nul\0byte", 8), Attr(0644), ""), EINVAL, "contains a NUL byte"},
      {AddBytes(*w, "file/under", Attr(0644), ""), ENOTDIR, "parent file is a regular file, not a directory"},
      {AddBytes(*w, "link/passwd", Attr(0644), ""), ENOTDIR, "parent link is a symlink, not a directory"},
      {w->AddSymlink("s", Attr(0777), ""), EINVAL, "symlink s: a target of 0 bytes"},
      {w->AddSymlink("s", Attr(0777), std::string(4096, 't')), EINVAL, "a target of 4096 bytes"},
      {w->AddSymlink("", Attr(0777), "x"), EINVAL, "the root cannot be added"},
      {AddBytes(*w, "x", Attr(0644, 0, 0, 0, 0, {{"system.nfs4_acl", "v"}}), ""), ENOTSUP,
       "xattr name system.nfs4_acl: an EROFS image can hold only"},
      {AddBytes(*w, "x", Attr(0644, 0, 0, 0, 0, {{"user.", "v"}}), ""), EINVAL, "is only a prefix"},
      {AddBytes(*w, "x", Attr(0644, 0, 0, 0, 1000000000), ""), EINVAL, "mtime nanoseconds"},
      {w->AddSpecial("d", FileType::kCharDevice, Attr(0600), makedev(4096, 0)), EOVERFLOW, "device number 4096:0"},
      {w->AddSpecial("d", FileType::kRegular, Attr(0600)), EINVAL, "a regular file is not a special file"},
      {w->AddFile("short", Attr(0644), 10, Bytes("eleven byte")), EINVAL,
       "file short: 11 bytes of data at offset 0 pass the file's size of 10 bytes"},
      {w->AddFile("order", Attr(0644), 100, Pieces({{50, "b"}, {10, "a"}})), EINVAL,
       "data at offset 10 comes after data up to offset 51"},
      {w->AddFile("huge", Attr(0644), uint64_t{1} << 62, Pieces({})), EFBIG, "chunk indexes"},
      {w->SetXattr("missing", "user.x", "v"), ENOENT, "xattr of missing: no such entry"},
      {w->AddSymlink("s", Attr(0777, 0, 0, 0, 0, {{"user.x", "v"}}), "t"), EPERM,
       "symlink s: xattr user.x: user.* xattrs exist only on regular files and directories"},
      {w->SetXattr("link", "user.x", "v"), EPERM, "xattr of link: xattr user.x: user.*"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(c.status.code(), c.code) << c.status.ToString();
    EXPECT_TRUE(Contains(c.status, c.text)) << c.status.ToString();
    EXPECT_TRUE(Contains(c.status, "erofs writer: ")) << c.status.ToString();
  }

  // A source that fails: its error, with the path, and no trace in the image.
  int calls = 0;
  DataSource failing = [&]() -> Result<std::optional<DataPiece>> {
    if (calls++ == 0) return std::optional<DataPiece>(DataPiece{0, std::span<const char>("abc", 3)});
    return Error(EIO, "read entry new/dir/file: truncated archive");
  };
  const Status failed = w->AddFile("new/dir/file", Attr(0644), 100, failing);
  EXPECT_EQ(failed.code(), EIO);
  EXPECT_TRUE(Contains(failed, "erofs writer: file new/dir/file: read entry new/dir/file: truncated archive"))
      << failed.ToString();
  EXPECT_EQ(w->TypeOf("new"), std::nullopt);

  // A descriptor that is not a regular file.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const Status piped = w->AddFile("pipe", Attr(0644), pipe_fds[0]);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  EXPECT_EQ(piped.code(), EINVAL);
  EXPECT_TRUE(Contains(piped, "file pipe: the descriptor is not a regular file")) << piped.ToString();

  ASSERT_OK_AND_ASSIGN(auto checked, FinishAndCheck(*w));
  EXPECT_EQ(checked.tree.size(), 3u);  // root, file, link: the failures left nothing
  const Status late = AddBytes(*w, "late", Attr(0644), "");
  EXPECT_EQ(late.code(), EINVAL);
  EXPECT_TRUE(Contains(late, "already finished"));
  EXPECT_EQ(w->Finish(meta()).status().code(), EINVAL);
}

}  // namespace
}  // namespace strata::erofs
