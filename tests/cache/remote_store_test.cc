// HttpStore against nginx with WebDAV and S3Store against s3rver (path and
// virtual-host style), both started by the test on loopback ports: the
// ObjectStore contract a user relies on, on real servers.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "cache/chunk_cache.h"
#include "cache/chunk_codec.h"
#include "cache/object_store.h"
#include "common/strings.h"
#include "tests/testing/store_servers.h"
#include "tests/testing/test_util.h"

namespace strata::cache {
namespace {

using testing::NginxServer;
using testing::RandomBytes;
using testing::S3rverServer;

enum class Backend { kNginx, kS3Path, kS3Virtual };

std::string Name(Backend b) {
  switch (b) {
    case Backend::kNginx: return "Nginx";
    case Backend::kS3Path: return "S3rverPathStyle";
    case Backend::kS3Virtual: return "S3rverVirtualHost";
  }
  return "?";
}

constexpr const char* kBucket = "strata-test";

class RemoteStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    // The one access key s3rver knows. It checks the key, not SigV4 signatures:
    // s3_signature_test.cc holds those against botocore.
    ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
    ::unsetenv("AWS_SESSION_TOKEN");
    const std::string knobs = "attempts=3&backoff=20ms&timeout=20s&deadline=60s";
    if (GetParam() == Backend::kNginx) {
      auto nginx = NginxServer::Start();
      if (!nginx.ok() && nginx.status().code() == ENOENT) GTEST_SKIP() << nginx.status().ToString();
      ASSERT_TRUE(nginx.ok()) << nginx.status().ToString();
      nginx_ = std::move(*nginx);
      url_ = StrCat(nginx_->url(), "/layers/v1?", knobs);
    } else {
      auto s3 = S3rverServer::Start({kBucket});
      if (!s3.ok() && s3.status().code() == ENOENT) GTEST_SKIP() << s3.status().ToString();
      ASSERT_TRUE(s3.ok()) << s3.status().ToString();
      s3_ = std::move(*s3);
      // Virtual-host style: <bucket>.s3.localhost, which curl resolves to loopback
      // itself and s3rver (--service-endpoint localhost) reads the bucket from.
      url_ = GetParam() == Backend::kS3Path
                 ? StrCat("s3://", kBucket, "/layers/v1?endpoint=", s3_->endpoint(), "&", knobs)
                 : StrCat("s3://", kBucket, "/layers/v1?endpoint=http://s3.localhost:", s3_->port(), "&style=virtual&",
                          knobs);
    }
    auto store = OpenStore(url_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = *store;
  }

  // Puts `keys` (value: the key itself) from 8 threads.
  void PutAll(const std::vector<std::string>& keys) {
    std::atomic<size_t> next{0};
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (size_t i; (i = next++) < keys.size();) {
          Status s = store_->Put(keys[i], keys[i]);
          if (!s.ok()) {
            ++failed;
            ADD_FAILURE() << s.ToString();
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_EQ(failed.load(), 0);
  }

  std::unique_ptr<NginxServer> nginx_;
  std::unique_ptr<S3rverServer> s3_;
  std::string url_;
  std::shared_ptr<ObjectStore> store_;
};

TEST_P(RemoteStoreTest, PutGetRangeSizeDelete) {
  std::string data = RandomBytes(3 << 20, 1);
  ASSERT_OK(store_->Put("chunks/ab/obj", data));
  ASSERT_OK_AND_ASSIGN(std::string got, store_->Get("chunks/ab/obj"));
  EXPECT_EQ(got, data);
  ASSERT_OK_AND_ASSIGN(uint64_t size, store_->Size("chunks/ab/obj"));
  EXPECT_EQ(size, data.size());

  std::string buf(4096, '\0');
  ASSERT_OK_AND_ASSIGN(size_t n, store_->GetRange("chunks/ab/obj", 12345, buf));
  EXPECT_EQ(n, 4096u);
  EXPECT_EQ(buf, data.substr(12345, 4096));
  ASSERT_OK_AND_ASSIGN(n, store_->GetRange("chunks/ab/obj", data.size() - 10, buf));
  EXPECT_EQ(n, 10u);  // short only at the end
  EXPECT_EQ(buf.substr(0, 10), data.substr(data.size() - 10));
  ASSERT_OK_AND_ASSIGN(n, store_->GetRange("chunks/ab/obj", data.size(), buf));
  EXPECT_EQ(n, 0u);

  ASSERT_OK(store_->Put("chunks/ab/obj", "replaced"));
  ASSERT_OK_AND_ASSIGN(got, store_->Get("chunks/ab/obj"));
  EXPECT_EQ(got, "replaced");
  ASSERT_OK(store_->Put("empty", ""));
  ASSERT_OK_AND_ASSIGN(got, store_->Get("empty"));
  EXPECT_EQ(got, "");

  ASSERT_OK(store_->Delete("chunks/ab/obj"));
  ASSERT_OK(store_->Delete("chunks/ab/obj"));  // deleting twice is fine
  ASSERT_OK_AND_ASSIGN(bool exists, store_->Exists("chunks/ab/obj"));
  EXPECT_FALSE(exists);
}

TEST_P(RemoteStoreTest, MissingObjectIsENOENTNamingStoreAndKey) {
  auto r = store_->Get("layers/missing.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOENT);
  EXPECT_NE(r.status().ToString().find(url_), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("get layers/missing.json: HTTP 404"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(store_->Size("layers/missing.json").status().code(), ENOENT);
  std::string buf(10, '\0');
  EXPECT_EQ(store_->GetRange("layers/missing.json", 0, buf).status().code(), ENOENT);
  EXPECT_EQ(store_->Put("../escape", "x").code(), EINVAL);
}

TEST_P(RemoteStoreTest, KeysWithCharactersThatNeedEncoding) {
  const std::vector<std::string> keys = {"tags/a b+c=d&e%f~g/v1", "tags/caf\xc3\xa9;$,@!'()*", "tags/q?x#y"};
  for (const auto& k : keys) ASSERT_OK(store_->Put(k, k));
  for (const auto& k : keys) {
    ASSERT_OK_AND_ASSIGN(std::string got, store_->Get(k));
    EXPECT_EQ(got, k);
  }
  ASSERT_OK_AND_ASSIGN(auto all, ListAll(*store_, "tags/"));
  std::vector<std::string> listed;
  for (const auto& o : all) listed.push_back(o.key);
  std::vector<std::string> want = keys;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listed, want);
}

TEST_P(RemoteStoreTest, ListsMoreThanOnePageInKeyOrder) {
  std::vector<std::string> keys;
  for (int i = 0; i < 1200; ++i) {
    std::string hex = StrCat(i % 7, i);
    keys.push_back(StrCat("chunks/", hex.substr(0, 2), "/", hex));
  }
  keys.push_back("chunks/a-b");
  keys.push_back("chunks/a/x");
  keys.push_back("chunksz");
  keys.push_back("layers/one.json");
  PutAll(keys);
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
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 2);
  EXPECT_EQ(got, want);

  ASSERT_OK_AND_ASSIGN(auto some, ListAll(*store_, "chunks/1"));
  EXPECT_FALSE(some.empty());
  for (const auto& o : some) EXPECT_TRUE(o.key.starts_with("chunks/1")) << o.key;
  ASSERT_OK_AND_ASSIGN(auto none, ListAll(*store_, "nothing/"));
  EXPECT_TRUE(none.empty());
}

TEST_P(RemoteStoreTest, ChunkCacheFetchesThroughTheStore) {
  std::vector<Digest128> ids;
  for (int i = 0; i < 16; ++i) {
    std::string data = RandomBytes(1 << 20, 100 + i);
    ids.push_back(HashBytes(data));
    ASSERT_OK(store_->Put(ChunkKey(ids.back()), data));
  }
  TempDir dir = testing::MakeTempDir();
  ChunkCacheOptions options;
  options.dir = dir.Sub("cache");
  options.fetch_threads = 8;
  ASSERT_OK_AND_ASSIGN(auto cache, ChunkCache::Open(options));
  std::vector<std::thread> readers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      std::string buf(1 << 20, '\0');
      for (const auto& id : ids) {
        auto n = cache->Read(id, store_, 0, std::span<char>(buf.data(), buf.size()));
        if (!n.ok() || *n != buf.size() || HashBytes(buf) != id) ++bad;
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(cache->stats().fetches, ids.size());
}

TEST_P(RemoteStoreTest, MixedRawAndCompressedChunksAndACorruptFrame) {
  std::vector<std::pair<Digest128, std::string>> chunks;
  for (int i = 0; i < 8; ++i) {
    std::string data;
    for (int line = 0; data.size() < 200000; ++line) data += StrCat("chunk ", i, " line ", line, "\n");
    if (i % 2) data = RandomBytes(200000, 300 + i);  // incompressible: stays raw
    Digest128 id = HashBytes(data);
    auto packed = CompressChunk(data, Compression{});
    EXPECT_EQ(packed.has_value(), i % 2 == 0);
    ASSERT_OK(store_->Put(ChunkKey(id), packed ? *packed : data));
    chunks.emplace_back(id, std::move(data));
  }
  std::string bad_data(100000, 'z');
  Digest128 bad_id = HashBytes(bad_data);
  std::string bad = *CompressChunk(bad_data, Compression{});
  bad[bad.size() - 2] ^= 0x40;
  ASSERT_OK(store_->Put(ChunkKey(bad_id), bad));

  TempDir dir = testing::MakeTempDir();
  ChunkCacheOptions options;
  options.dir = dir.Sub("cache");
  ASSERT_OK_AND_ASSIGN(auto cache, ChunkCache::Open(options));
  for (const auto& [id, data] : chunks) {
    ASSERT_OK_AND_ASSIGN(ChunkCache::Handle h, cache->Get(id, store_, data.size()));
    std::string out(h.size(), '\0');
    ASSERT_OK_AND_ASSIGN(size_t n, h.Read(0, out));
    EXPECT_EQ(n, data.size());
    EXPECT_TRUE(out == data) << id.Hex();
  }
  EXPECT_EQ(cache->stats().compressed, 4u);
  auto h = cache->Get(bad_id, store_, bad_data.size());
  EXPECT_EQ(h.status().code(), EBADMSG);
  EXPECT_FALSE(cache->Contains(bad_id));
}

// WebDAV only: the temporary a put uploads first never stays behind, and a
// reader never sees half an object (S3 puts are atomic by the API).
using WebDavStoreTest = RemoteStoreTest;
TEST_P(WebDavStoreTest, PutIsAtomicAndLeavesNoTemporaries) {
  std::string a(2 << 20, 'a'), b(2 << 20, 'b');
  ASSERT_OK(store_->Put("obj", a));
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0}, reads{0};
  std::thread reader([&] {
    while (!stop) {
      auto got = store_->Get("obj");
      ++reads;
      if (!got.ok() || (*got != a && *got != b)) ++torn;
    }
  });
  for (int i = 0; i < 30; ++i) ASSERT_OK(store_->Put("obj", i % 2 ? a : b));
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(reads.load(), 0);
  ASSERT_OK_AND_ASSIGN(auto all, ListAll(*store_, ""));
  ASSERT_EQ(all.size(), 1u);
  auto tmp = ListAll(*store_, ".tmp/");
  EXPECT_FALSE(tmp.ok() && !tmp->empty());
  DIR* d = ::opendir(StrCat(nginx_->root(), "/layers/v1/.tmp").c_str());
  ASSERT_NE(d, nullptr);
  int left = 0;
  while (dirent* e = ::readdir(d)) left += e->d_name[0] != '.';
  ::closedir(d);
  EXPECT_EQ(left, 0);
}

TEST_P(RemoteStoreTest, AServerThatGoesAwayIsAClearError) {
  ASSERT_OK(store_->Put("x", "y"));
  nginx_.reset();
  s3_.reset();
  auto r = store_->Get("x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ECONNREFUSED) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("get x: failed after 3 attempts (last: Couldn't connect"), std::string::npos)
      << r.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Backends, WebDavStoreTest, ::testing::Values(Backend::kNginx),
                         [](const ::testing::TestParamInfo<Backend>& param) { return Name(param.param); });
INSTANTIATE_TEST_SUITE_P(Backends, RemoteStoreTest,
                         ::testing::Values(Backend::kNginx, Backend::kS3Path, Backend::kS3Virtual),
                         [](const ::testing::TestParamInfo<Backend>& param) { return Name(param.param); });

}  // namespace
}  // namespace strata::cache
