#include "layerctl/tar_unpack.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/subprocess.h"
#include "tests/testing/test_util.h"

namespace strata::layerctl {
namespace {

using testing::MakeTempDir;

// Writes tar archives entry by entry, including the hostile ones no tar
// command would produce.
class TarWriter {
 public:
  explicit TarWriter(const std::string& path, const char* filter = nullptr) : a_(archive_write_new()) {
    archive_write_set_format_pax(a_);
    if (filter && std::string(filter) == "gzip") archive_write_add_filter_gzip(a_);
    if (filter && std::string(filter) == "zstd") archive_write_add_filter_zstd(a_);
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
  void Dir(const std::string& name, mode_t perm = 0755) { Write(Entry(name, AE_IFDIR, perm, 0, 0)); }
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

class TarUnpackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: owners, devices and trusted.* xattrs";
    ASSERT_OK(MakeDirs(root()));
  }
  std::string root() const { return dir_.Sub("root"); }
  std::string tar() const { return dir_.Sub("in.tar"); }
  TempDir dir_ = MakeTempDir();
};

TEST_F(TarUnpackTest, UnpacksEveryKindOfEntryFaithfully) {
  {
    TarWriter w(tar());
    w.Dir("./");
    w.Dir("bin", 0755);
    w.File("bin/tool", "#!/bin/sh\n", 04755, 0, 0);
    w.File("home/user/data", "hello", 0640, 1000, 1001, "user.note", "kept");
    w.File("caps", "x", 0755, 0, 0, "security.capability", std::string("\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 20));
    w.Symlink("bin/sh", "/usr/bin/busybox");
    w.Hardlink("bin/tool2", "bin/tool");
    w.Device("dev/null", AE_IFCHR, makedev(1, 3));
    w.Device("dev/loop0", AE_IFBLK, makedev(7, 0));
    w.Device("run/fifo", AE_IFIFO, 0);
  }
  ASSERT_OK_AND_ASSIGN(UnpackStats stats, UnpackTar(tar(), root()));
  EXPECT_EQ(stats.regular_files, 3u);
  struct stat st;
  ASSERT_EQ(::lstat((root() + "/bin/tool").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);  // setuid survives the chown
  EXPECT_EQ(st.st_nlink, 2u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1600000000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 123456789);
  ASSERT_EQ(::lstat((root() + "/home/user/data").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u);
  EXPECT_EQ(st.st_gid, 1001u);
  char value[64];
  ssize_t n = ::lgetxattr((root() + "/home/user/data").c_str(), "user.note", value, sizeof value);
  EXPECT_EQ(std::string(value, n > 0 ? static_cast<size_t>(n) : 0), "kept");
  EXPECT_EQ(::lgetxattr((root() + "/caps").c_str(), "security.capability", value, sizeof value), 20);
  char link[64] = {};
  ASSERT_GT(::readlink((root() + "/bin/sh").c_str(), link, sizeof link), 0);
  EXPECT_STREQ(link, "/usr/bin/busybox");
  ASSERT_EQ(::lstat((root() + "/dev/null").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(1, 3));
  ASSERT_EQ(::lstat((root() + "/dev/loop0").c_str(), &st), 0);
  EXPECT_TRUE(S_ISBLK(st.st_mode));
  ASSERT_EQ(::lstat((root() + "/run/fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(::lstat((root() + "/bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mtim.tv_sec, 1600000000);  // set after its children were created
}

TEST_F(TarUnpackTest, OciWhiteoutsBecomeOverlayWhiteouts) {
  {
    TarWriter w(tar());
    w.Dir("etc");
    w.File("etc/.wh.removed", "");
    w.Dir("opt/app");
    w.File("opt/app/.wh..wh..opq", "");
    w.File("opt/app/new", "n");
  }
  ASSERT_OK(UnpackTar(tar(), root()).status());
  struct stat st;
  ASSERT_EQ(::lstat((root() + "/etc/removed").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(0, 0));
  EXPECT_NE(::lstat((root() + "/etc/.wh.removed").c_str(), &st), 0);
  char v[4];
  EXPECT_EQ(::lgetxattr((root() + "/opt/app").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(v[0], 'y');
  EXPECT_NE(::lstat((root() + "/opt/app/.wh..wh..opq").c_str(), &st), 0);
}

TEST_F(TarUnpackTest, RefusesEntriesThatLeaveTheRoot) {
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
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    ASSERT_OK(RemoveTree(root()));
    ASSERT_OK(MakeDirs(root()));
    {
      TarWriter w(tar());
      c.write(w);
    }
    auto r = UnpackTar(tar(), root());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().ToString().find(c.message), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().ToString().find(tar()), std::string::npos) << "the error names the archive";
    EXPECT_NE(::access(dir_.Sub("escaped").c_str(), F_OK), 0);
    EXPECT_NE(::access("/tmp/escaped", F_OK), 0);
  }
}

TEST_F(TarUnpackTest, ReadsGzipAndZstdAndHashesTheInput) {
  for (const char* filter : {"gzip", "zstd"}) {
    SCOPED_TRACE(filter);
    ASSERT_OK(RemoveTree(root()));
    ASSERT_OK(MakeDirs(root()));
    {
      TarWriter w(tar(), filter);
      w.File("f", std::string(100000, 'z'));
    }
    ASSERT_OK_AND_ASSIGN(UnpackStats stats, UnpackTar(tar(), root()));
    ASSERT_OK_AND_ASSIGN(std::string raw, ReadFileToString(tar()));
    EXPECT_EQ(stats.source, HashBytes(raw));
    EXPECT_EQ(stats.source_bytes, raw.size());
    ASSERT_OK_AND_ASSIGN(std::string f, ReadFileToString(root() + "/f"));
    EXPECT_EQ(f, std::string(100000, 'z'));
  }
}

TEST_F(TarUnpackTest, TruncatedOrCorruptArchivesAreClearErrors) {
  {
    TarWriter w(tar());
    w.File("big", std::string(200000, 'b'));
    w.File("after", "a");
  }
  ASSERT_OK_AND_ASSIGN(std::string raw, ReadFileToString(tar()));
  ASSERT_OK(WriteFileAtomic(tar(), raw.substr(0, 100000)));
  auto r = UnpackTar(tar(), root());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("big"), std::string::npos) << r.status().ToString();

  ASSERT_OK(WriteFileAtomic(tar(), std::string(5000, '\x7f')));
  r = UnpackTar(tar(), root());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find(tar()), std::string::npos);
  EXPECT_FALSE(UnpackTar(dir_.Sub("missing.tar"), root()).ok());
}

TEST_F(TarUnpackTest, SparseFilesKeepTheirHoles) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(RunChecked({.argv = {"truncate", "-s", "3G", src + "/sparse"}}, "truncate").status());
  ASSERT_OK(RunChecked({.argv = {"sh", "-c", "printf end >> " + src + "/sparse"}}, "append").status());
  ASSERT_OK(RunChecked({.argv = {"tar", "--sparse", "-C", src, "-cf", tar(), "."}}, "tar").status());
  ASSERT_OK(UnpackTar(tar(), root()).status());
  struct stat st;
  ASSERT_EQ(::stat((root() + "/sparse").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, (3ll << 30) + 3);
  EXPECT_LT(st.st_blocks * 512, 1 << 20);  // still sparse
}

}  // namespace
}  // namespace strata::layerctl
