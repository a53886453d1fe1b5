#include "common/fs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/testing/test_util.h"

namespace strata {
namespace {

using testing::MakeTempDir;

TEST(FsTest, WriteFileAtomicReplacesWhole) {
  TempDir dir = MakeTempDir();
  std::string path = dir.Sub("f");
  ASSERT_OK(WriteFileAtomic(path, "first"));
  ASSERT_OK(WriteFileAtomic(path, "second version"));
  ASSERT_OK_AND_ASSIGN(std::string got, ReadFileToString(path));
  EXPECT_EQ(got, "second version");
}

TEST(FsTest, ErrorsNameThePath) {
  auto r = ReadFileToString("/nonexistent/strata/file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOENT);
  EXPECT_NE(r.status().ToString().find("/nonexistent/strata/file"), std::string::npos);
}

TEST(FsTest, MakeDirsAndRemoveTree) {
  TempDir dir = MakeTempDir();
  ASSERT_OK(MakeDirs(dir.Sub("a/b/c")));
  ASSERT_OK(MakeDirs(dir.Sub("a/b/c")));
  ASSERT_OK(WriteFileAtomic(dir.Sub("a/b/c/f"), "x"));
  ASSERT_OK(RemoveTree(dir.Sub("a")));
  EXPECT_NE(::access(dir.Sub("a").c_str(), F_OK), 0);
  EXPECT_OK(RemoveTree(dir.Sub("missing")));
}

// A private directory made first must not make its parents private: the
// node's /run/strata once became 0700 that way, and no sandbox's mapped
// root could reach /run/strata/sandboxes beside it.
TEST(FsTest, MakeDirsGivesOnlyTheLeafItsMode) {
  TempDir dir = MakeTempDir();
  const mode_t old = ::umask(022);
  ASSERT_OK(MakeDirs(dir.Sub("run/strata/claims"), 0700));
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::stat(dir.Sub("run/strata").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755);
  ASSERT_EQ(::stat(dir.Sub("run/strata/claims").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700);
}

TEST(FsTest, RemoveTreeNeverFollowsSymlinks) {
  TempDir outside = MakeTempDir();
  ASSERT_OK(WriteFileAtomic(outside.Sub("keep"), "precious"));
  TempDir dir = MakeTempDir();
  ASSERT_OK(MakeDirs(dir.Sub("t")));
  ASSERT_EQ(::symlink(outside.path().c_str(), dir.Sub("t/link").c_str()), 0);
  ASSERT_OK(RemoveTree(dir.Sub("t")));
  EXPECT_EQ(::access(outside.Sub("keep").c_str(), F_OK), 0);
}

TEST(FsTest, TempDirIsRemoved) {
  std::string path;
  {
    TempDir dir = MakeTempDir();
    path = dir.path();
    ASSERT_OK(WriteFileAtomic(dir.Sub("x"), "y"));
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

TEST(FsTest, PathHelpers) {
  EXPECT_EQ(JoinPath("/a/", "/b"), "/a/b");
  EXPECT_EQ(Dirname("/a/b/c"), "/a/b");
  EXPECT_EQ(Dirname("c"), ".");
  EXPECT_EQ(Basename("/a/b/c/"), "c");
}

}  // namespace
}  // namespace strata
