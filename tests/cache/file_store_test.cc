#include "cache/file_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "common/strings.h"
#include "tests/testing/test_util.h"

namespace strata::cache {
namespace {

using testing::MakeTempDir;
using testing::RandomBytes;

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = OpenStore("file://" + dir_.path());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = *store;
  }
  TempDir dir_ = MakeTempDir();
  std::shared_ptr<ObjectStore> store_;
};

TEST_F(FileStoreTest, PutGetRangeSizeDelete) {
  std::string data = RandomBytes(3 << 20, 1);
  ASSERT_OK(store_->Put("chunks/ab/obj", data));
  ASSERT_OK_AND_ASSIGN(std::string got, store_->Get("chunks/ab/obj"));
  EXPECT_EQ(got, data);
  ASSERT_OK_AND_ASSIGN(uint64_t size, store_->Size("chunks/ab/obj"));
  EXPECT_EQ(size, data.size());

  std::string buf(1000, '\0');
  ASSERT_OK_AND_ASSIGN(size_t n, store_->GetRange("chunks/ab/obj", 12345, buf));
  EXPECT_EQ(n, 1000u);
  EXPECT_EQ(buf, data.substr(12345, 1000));
  ASSERT_OK_AND_ASSIGN(n, store_->GetRange("chunks/ab/obj", data.size() - 10, buf));
  EXPECT_EQ(n, 10u);  // short only at the end

  ASSERT_OK(store_->Delete("chunks/ab/obj"));
  ASSERT_OK(store_->Delete("chunks/ab/obj"));  // deleting twice is fine
  ASSERT_OK_AND_ASSIGN(bool exists, store_->Exists("chunks/ab/obj"));
  EXPECT_FALSE(exists);
}

TEST_F(FileStoreTest, MissingObjectIsENOENTNamingStoreAndKey) {
  auto r = store_->Get("layers/missing.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOENT);
  EXPECT_NE(r.status().ToString().find(dir_.path()), std::string::npos);
  EXPECT_NE(r.status().ToString().find("layers/missing.json"), std::string::npos);
}

TEST_F(FileStoreTest, RejectsKeysThatEscapeOrHide) {
  for (const char* key : {"", "../x", "a/../../x", "/abs", "a//b", ".tmp/x", "a/.hidden", "a/"}) {
    EXPECT_EQ(store_->Put(key, "x").code(), EINVAL) << key;
    EXPECT_EQ(store_->Get(key).status().code(), EINVAL) << key;
  }
}

TEST_F(FileStoreTest, PutIsAtomicForConcurrentReaders) {
  std::string a(1 << 20, 'a'), b(1 << 20, 'b');
  ASSERT_OK(store_->Put("obj", a));
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!stop) {
      auto got = store_->Get("obj");
      if (!got.ok() || (*got != a && *got != b)) ++torn;
    }
  });
  for (int i = 0; i < 50; ++i) ASSERT_OK(store_->Put("obj", i % 2 ? a : b));
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
}

TEST_F(FileStoreTest, ListPagesInKeyOrder) {
  // 2,500 keys across directories, plus names that sort differently as
  // files and as directories ("a-b" < "a/..." because '-' < '/').
  std::vector<std::string> keys;
  for (int i = 0; i < 2500; ++i) {
    std::string hex = StrCat(i % 7, i);
    keys.push_back(StrCat("chunks/", hex.substr(0, 2), "/", hex));
  }
  keys.push_back("chunks/a-b");
  keys.push_back("chunks/a/x");
  keys.push_back("chunksz");
  keys.push_back("layers/one.json");
  for (const auto& k : keys) ASSERT_OK(store_->Put(k, k));
  std::vector<std::string> want;
  for (const auto& k : keys) {
    if (k.starts_with("chunks/")) want.push_back(k);
  }
  std::sort(want.begin(), want.end());

  std::vector<std::string> got;
  std::string token;
  int pages = 0;
  do {
    ASSERT_OK_AND_ASSIGN(ListPage page, store_->List("chunks/", token, 1000));
    ++pages;
    for (const auto& o : page.objects) {
      got.push_back(o.key);
      EXPECT_EQ(o.size, o.key.size());
    }
    token = page.next_token;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(got, want);

  ASSERT_OK_AND_ASSIGN(auto all, ListAll(*store_, "chunks/1"));
  for (const auto& o : all) EXPECT_TRUE(o.key.starts_with("chunks/1"));
  EXPECT_FALSE(all.empty());
  ASSERT_OK_AND_ASSIGN(auto none, ListAll(*store_, "nothing/"));
  EXPECT_TRUE(none.empty());
}

TEST_F(FileStoreTest, ListSkipsTemporaries) {
  ASSERT_OK(store_->Put("a/b", "x"));
  ASSERT_OK(WriteFileAtomic(dir_.Sub(".tmp/b.123.0.0"), "partial"));
  ASSERT_OK_AND_ASSIGN(auto all, ListAll(*store_, ""));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].key, "a/b");
}

TEST_F(FileStoreTest, PutErrorNamesStepAndPath) {
  // A file where the temporary directory should be makes every put fail.
  ASSERT_OK(RemoveTree(dir_.Sub(".tmp")));
  ASSERT_OK(WriteFileAtomic(dir_.Sub(".tmp"), "in the way"));
  Status s = store_->Put("layers/x.json", "y");
  EXPECT_EQ(s.code(), ENOTDIR);
  EXPECT_NE(s.ToString().find("put layers/x.json"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find(dir_.path() + "/.tmp/"), std::string::npos) << s.ToString();
  ASSERT_OK_AND_ASSIGN(bool exists, store_->Exists("layers/x.json"));
  EXPECT_FALSE(exists);
}

TEST(OpenStoreTest, UrlErrorsSayWhatIsWrong) {
  auto r = OpenStore("ftp://host/x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("ftp"), std::string::npos);
  EXPECT_FALSE(OpenStore("file://relative").ok());
  EXPECT_FALSE(OpenStore("relative/path").ok());
}

TEST(OpenStoreTest, DefaultStoreUrlPrefersFlagThenEnv) {
  ::setenv("STRATA_STORE", "file:///from/env", 1);
  EXPECT_EQ(DefaultStoreUrl("file:///flag"), "file:///flag");
  EXPECT_EQ(DefaultStoreUrl(""), "file:///from/env");
  ::unsetenv("STRATA_STORE");
  EXPECT_EQ(DefaultStoreUrl(""), kDefaultStorePath);
}

}  // namespace
}  // namespace strata::cache
