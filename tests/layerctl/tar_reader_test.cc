// Tar archives streamed into the image writer, hostile ones included. The
// reader needs no root; as root the kernel also mounts every image.
#include "layerctl/tar_reader.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <functional>

#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "tests/layerctl/image_check.h"
#include "tests/testing/test_util.h"

namespace strata::layerctl {
namespace {

using strata::testing::ContentHash;
using strata::testing::MakeTempDir;

// Writes tar archives entry by entry, including the hostile ones no tar
// command would produce.
class TarWriter {
 public:
  explicit TarWriter(const std::string& path, const char* filter = nullptr) : a_(archive_write_new()) {
    archive_write_set_format_pax(a_);
    const std::string f = filter ? filter : "";
    if (f == "gzip") archive_write_add_filter_gzip(a_);
    if (f == "zstd") archive_write_add_filter_zstd(a_);
    if (f == "xz") archive_write_add_filter_xz(a_);
    if (f == "bzip2") archive_write_add_filter_bzip2(a_);
    archive_write_open_filename(a_, path.c_str());
  }
  ~TarWriter() { Close(); }
  void Close() {
    if (a_) {
      archive_write_close(a_);
      archive_write_free(a_);
      a_ = nullptr;
    }
  }
  void File(const std::string& name, const std::string& data, mode_t perm = 0644, uid_t uid = 0, gid_t gid = 0,
            const char* xattr = nullptr, const std::string& xvalue = "") {
    archive_entry* e = Entry(name, AE_IFREG, perm, uid, gid);
    archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    if (xattr) archive_entry_xattr_add_entry(e, xattr, xvalue.data(), xvalue.size());
    archive_write_header(a_, e);
    archive_write_data(a_, data.data(), data.size());
    archive_entry_free(e);
  }
  void Dir(const std::string& name, mode_t perm = 0755, int64_t mtime = 1600000000) {
    archive_entry* e = Entry(name, AE_IFDIR, perm, 0, 0);
    archive_entry_set_mtime(e, mtime, 0);
    Write(e);
  }
  void Symlink(const std::string& name, const std::string& target) {
    archive_entry* e = Entry(name, AE_IFLNK, 0777, 0, 0);
    archive_entry_set_symlink(e, target.c_str());
    Write(e);
  }
  void Hardlink(const std::string& name, const std::string& target) {
    archive_entry* e = Entry(name, AE_IFREG, 0644, 0, 0);
    archive_entry_set_hardlink(e, target.c_str());
    archive_entry_set_size(e, 0);
    Write(e);
  }
  void Device(const std::string& name, mode_t type, dev_t rdev) {
    archive_entry* e = Entry(name, type, 0600, 0, 0);
    archive_entry_set_rdev(e, rdev);
    Write(e);
  }

 private:
  archive_entry* Entry(const std::string& name, mode_t type, mode_t perm, uid_t uid, gid_t gid) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, perm);
    archive_entry_set_uid(e, uid);
    archive_entry_set_gid(e, gid);
    archive_entry_set_mtime(e, 1600000000, 123456789);
    return e;
  }
  void Write(archive_entry* e) {
    archive_write_header(a_, e);
    archive_entry_free(e);
  }
  archive* a_;
};

class TarReaderTest : public ::testing::Test {
 protected:
  // Reads tar() into a fresh image and checks it (reader, fsck, kernel).
  Result<testing::CheckedImage> Build(TarStats* stats = nullptr) {
    STRATA_ASSIGN_OR_RETURN(auto w, erofs::ImageWriter::Create({.blob_path = dir_.Sub("blob.img")}));
    STRATA_ASSIGN_OR_RETURN(TarStats s, AddTar(tar(), *w));
    if (stats) *stats = s;
    STRATA_RETURN_IF_ERROR(w->Finish(dir_.Sub("meta.img")).status());
    return testing::CheckImage(dir_.Sub("meta.img"), dir_.Sub("blob.img"), dir_.path());
  }
  // Reads tar() and returns the error it must give.
  Status BuildError() {
    auto w = erofs::ImageWriter::Create({.blob_path = dir_.Sub("blob.img")});
    if (!w.ok()) return w.status();
    auto r = AddTar(tar(), **w);
    return r.ok() ? Error(EINVAL, "the archive was accepted") : r.status();
  }
  std::string tar() const { return dir_.Sub("in.tar"); }
  TempDir dir_ = MakeTempDir();
};

TEST_F(TarReaderTest, BuildsEveryKindOfEntryFaithfully) {
  const std::string cap("\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 20);
  {
    TarWriter w(tar());
    w.Dir("./", 0750, 1700000000);
    w.Dir("bin", 0755);
    w.File("bin/tool", "#!/bin/sh\n", 04755, 0, 0);
    w.File("home/user/data", "hello", 0640, 1000, 1001, "user.note", "kept");
    w.File("caps", "x", 0755, 0, 0, "security.capability", cap);
    w.Symlink("bin/sh", "/usr/bin/busybox");
    w.Hardlink("bin/tool2", "bin/tool");
    w.Device("dev/null", AE_IFCHR, makedev(1, 3));
    w.Device("dev/loop0", AE_IFBLK, makedev(7, 0));
    w.Device("run/fifo", AE_IFIFO, 0);
  }
  TarStats stats;
  ASSERT_OK_AND_ASSIGN(auto checked, Build(&stats));
  EXPECT_EQ(stats.regular_files, 3u);
  EXPECT_EQ(stats.entries, 10u);
  const auto& t = checked.tree;
  EXPECT_EQ(t.at(".").mode, S_IFDIR | 0750u);
  EXPECT_EQ(t.at(".").mtime_ns, 1700000000000000000);
  EXPECT_EQ(t.at("bin/tool").mode, S_IFREG | 04755u);
  EXPECT_EQ(t.at("bin/tool").nlink, 2u);
  EXPECT_EQ(t.at("bin/tool").mtime_ns, 1600000000123456789);
  EXPECT_EQ(t.at("bin/tool").content_hash, ContentHash("#!/bin/sh\n"));
  EXPECT_EQ(t.at("bin/tool2").hardlink_group, "bin/tool");
  EXPECT_EQ(t.at("home/user/data").uid, 1000u);
  EXPECT_EQ(t.at("home/user/data").gid, 1001u);
  EXPECT_EQ(t.at("home/user/data").mode, S_IFREG | 0640u);
  EXPECT_EQ(t.at("home/user/data").xattrs.at("user.note"), "kept");
  EXPECT_EQ(t.at("home").mode, S_IFDIR | 0755u);  // not in the archive: the writer's defaults
  EXPECT_EQ(t.at("home").mtime_ns, 0);
  EXPECT_EQ(t.at("caps").xattrs.at("security.capability"), cap);
  EXPECT_EQ(t.at("bin/sh").link, "/usr/bin/busybox");
  EXPECT_EQ(t.at("dev/null").mode, S_IFCHR | 0600u);
  EXPECT_EQ(t.at("dev/null").rdev, makedev(1, 3));
  EXPECT_EQ(t.at("dev/loop0").mode, S_IFBLK | 0600u);
  EXPECT_EQ(t.at("dev/loop0").rdev, makedev(7, 0));
  EXPECT_EQ(t.at("run/fifo").mode, S_IFIFO | 0600u);
  EXPECT_EQ(t.at("bin").mtime_ns, 1600000000000000000);
  EXPECT_EQ(t.at("bin").nlink, 2u);
}

TEST_F(TarReaderTest, OciWhiteoutsBecomeOverlayWhiteouts) {
  {
    TarWriter w(tar());
    w.Dir("etc");
    w.File("etc/.wh.removed", "");
    w.Dir("opt/app");
    w.File("opt/app/.wh..wh..opq", "");
    w.File("opt/app/new", "n");
    w.File("later/.wh..wh..opq", "");  // before its directory's own entry
    w.Dir("later", 0700);
    w.File("gone/.wh..wh..opq", "");
    w.File("gone", "replaced by a file");
  }
  ASSERT_OK_AND_ASSIGN(auto checked, Build());
  const auto& t = checked.tree;
  EXPECT_EQ(t.at("etc/removed").mode, S_IFCHR | 0u);
  EXPECT_EQ(t.at("etc/removed").rdev, makedev(0, 0));
  EXPECT_EQ(t.count("etc/.wh.removed"), 0u);
  EXPECT_EQ(t.at("opt/app").xattrs.at("trusted.overlay.opaque"), "y");
  EXPECT_EQ(t.count("opt/app/.wh..wh..opq"), 0u);
  EXPECT_EQ(t.at("later").xattrs.at("trusted.overlay.opaque"), "y");
  EXPECT_EQ(t.at("later").mode, S_IFDIR | 0700u);
  EXPECT_EQ(t.at("gone").content_hash, ContentHash("replaced by a file"));
  EXPECT_EQ(t.count("opt"), 1u);
}

TEST_F(TarReaderTest, RefusesEntriesThatLeaveTheRoot) {
  struct Case {
    const char* what;
    std::function<void(TarWriter&)> write;
    const char* message;
  };
  std::vector<Case> cases = {
      {"dotdot", [](TarWriter& w) { w.File("../escaped", "x"); }, "\"..\" would leave the root"},
      {"nested dotdot", [](TarWriter& w) { w.File("a/../../escaped", "x"); }, "\"..\" would leave the root"},
      {"absolute", [](TarWriter& w) { w.File("/tmp/escaped", "x"); }, "absolute name"},
      {"hardlink out", [](TarWriter& w) { w.Hardlink("h", "../../etc/passwd"); }, "hardlink target"},
      {"hardlink absolute", [](TarWriter& w) { w.Hardlink("h", "/etc/passwd"); }, "hardlink target"},
      {"hardlink to nothing", [](TarWriter& w) { w.Hardlink("h", "etc/passwd"); }, "does not exist"},
      {"hardlink to a directory",
       [](TarWriter& w) {
         w.Dir("d");
         w.Hardlink("h", "d");
       },
       "is a directory"},
      {"through symlink",
       [this](TarWriter& w) {
         w.Symlink("link", dir_.path());
         w.File("link/escaped", "x");
       },
       "never follows links"},
      {"through dir symlink",
       [](TarWriter& w) {
         w.Symlink("etc", "/etc");
         w.Hardlink("etc/stolen", "etc/passwd");
       },
       "never follows links"},
      {"hardlink target through symlink",
       [](TarWriter& w) {
         w.Symlink("etc", "/etc");
         w.Hardlink("stolen", "etc/passwd");
       },
       "never follows links"},
      {"through a file",
       [](TarWriter& w) {
         w.File("f", "x");
         w.File("f/under", "x");
       },
       "never follows links"},
      {"long name", [](TarWriter& w) { w.File(std::string(256, 'n'), "x"); }, "longer than 255 bytes"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    {
      TarWriter w(tar());
      c.write(w);
    }
    const Status s = BuildError();
    EXPECT_NE(s.ToString().find(c.message), std::string::npos) << s.ToString();
    EXPECT_NE(s.ToString().find(tar()), std::string::npos) << "the error names the archive: " << s.ToString();
    EXPECT_NE(::access(dir_.Sub("escaped").c_str(), F_OK), 0);
    EXPECT_NE(::access("/tmp/escaped", F_OK), 0);
  }
}

TEST_F(TarReaderTest, LaterEntriesReplaceEarlierOnes) {
  {
    TarWriter w(tar());
    w.File("f", "first");
    w.File("f", "second", 0600);
    w.File("d/x", "in d");
    w.File("d", "d is a file now");
    w.File("e", "e was a file");
    w.Dir("e", 0711);
    w.Symlink("l", "one");
    w.Symlink("l", "two");
  }
  ASSERT_OK_AND_ASSIGN(auto checked, Build());
  const auto& t = checked.tree;
  EXPECT_EQ(t.at("f").content_hash, ContentHash("second"));
  EXPECT_EQ(t.at("f").mode, S_IFREG | 0600u);
  EXPECT_EQ(t.at("d").content_hash, ContentHash("d is a file now"));
  EXPECT_EQ(t.count("d/x"), 0u);
  EXPECT_EQ(t.at("e").mode, S_IFDIR | 0711u);
  EXPECT_EQ(t.at("l").link, "two");
}

TEST_F(TarReaderTest, ReadsEveryCompressionAndHashesTheInput) {
  for (const char* filter : {"", "gzip", "zstd", "xz", "bzip2"}) {
    SCOPED_TRACE(filter);
    {
      TarWriter w(tar(), filter);
      w.File("f", std::string(100000, 'z'));
    }
    TarStats stats;
    ASSERT_OK_AND_ASSIGN(auto checked, Build(&stats));
    ASSERT_OK_AND_ASSIGN(std::string raw, ReadFileToString(tar()));
    EXPECT_EQ(stats.source, HashBytes(raw));
    EXPECT_EQ(stats.source_bytes, raw.size());
    EXPECT_EQ(stats.bytes, 100000u);
    EXPECT_EQ(checked.tree.at("f").content_hash, ContentHash(std::string(100000, 'z')));
  }
}

TEST_F(TarReaderTest, TruncatedOrCorruptArchivesAreClearErrors) {
  {
    TarWriter w(tar());
    w.File("big", std::string(200000, 'b'));
    w.File("after", "a");
  }
  ASSERT_OK_AND_ASSIGN(std::string raw, ReadFileToString(tar()));
  ASSERT_OK(WriteFileAtomic(tar(), raw.substr(0, 100000)));
  Status s = BuildError();
  EXPECT_NE(s.ToString().find("big"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find(tar()), std::string::npos) << s.ToString();

  ASSERT_OK(WriteFileAtomic(tar(), std::string(5000, '\x7f')));
  s = BuildError();
  EXPECT_NE(s.ToString().find(tar()), std::string::npos) << s.ToString();
  ASSERT_OK_AND_ASSIGN(auto w, erofs::ImageWriter::Create({.blob_path = dir_.Sub("blob.img")}));
  const auto missing = AddTar(dir_.Sub("missing.tar"), *w);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().ToString().find("missing.tar"), std::string::npos);
}

TEST_F(TarReaderTest, SparseFilesKeepTheirHoles) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(RunChecked({.argv = {"truncate", "-s", "3G", src + "/sparse"}}, "truncate").status());
  ASSERT_OK(RunChecked({.argv = {"sh", "-c", "printf end >> " + src + "/sparse"}}, "append").status());
  ASSERT_OK(RunChecked({.argv = {"tar", "--sparse", "-C", src, "-cf", tar(), "."}}, "tar").status());
  ASSERT_OK_AND_ASSIGN(auto checked, Build());
  EXPECT_EQ(checked.tree.at("sparse").size, (3ull << 30) + 3);
  std::string want_tail = "end";
  ASSERT_OK_AND_ASSIGN(erofs::Inode inode, checked.image->LookupPath("sparse"));
  char buf[3];
  ASSERT_OK_AND_ASSIGN(size_t n, checked.image->Read(inode, 3ull << 30, std::span<char>(buf, 3)));
  EXPECT_EQ(std::string(buf, n), want_tail);
  struct stat st;
  ASSERT_EQ(::stat(dir_.Sub("blob.img").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4096);  // only the chunk holding "end"
}

}  // namespace
}  // namespace strata::layerctl
