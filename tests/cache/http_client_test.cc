// The retry, timeout and deadline policy of remote stores against a server
// that misbehaves on purpose, and what reaches the chunk cache through it.
#include "cache/http_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "cache/chunk_cache.h"
#include "cache/http_store.h"
#include "common/fs.h"
#include "common/strings.h"
#include "tests/testing/store_servers.h"
#include "tests/testing/test_http_server.h"
#include "tests/testing/test_util.h"

namespace strata::cache {
namespace {

using testing::RandomBytes;
using testing::TestHttpServer;
using Fault = TestHttpServer::Fault;
using FaultKind = TestHttpServer::FaultKind;
using Clock = std::chrono::steady_clock;

class HttpClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = TestHttpServer::Start();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    data_ = RandomBytes(300 * 1024, 7);
    id_ = HashBytes(data_);
    key_ = ChunkKey(id_);
    server_->SetObject("/store/" + key_, data_);
  }

  // A store on the test server with short timeouts; `knobs` are extra query parameters.
  std::shared_ptr<ObjectStore> Open(std::string_view knobs = "") {
    std::string url = StrCat(server_->url(), "/store?attempts=4&backoff=10ms&backoff_max=50ms&timeout=2s&deadline=10s",
                             knobs.empty() ? "" : "&", knobs);
    auto store = OpenStore(url);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? *store : nullptr;
  }

  std::unique_ptr<TestHttpServer> server_;
  std::string data_;
  Digest128 id_;
  std::string key_;
};

bool CurlMapped() {
  auto maps = ReadFileToString("/proc/self/maps");
  return maps.ok() && maps->find("libcurl") != std::string::npos;
}

// Loading libcurl costs a process milliseconds: only the first HTTP request
// may pay it (each test runs in its own process).
TEST(HttpClientLoadTest, LibcurlIsLoadedByTheFirstRequestOnly) {
  TempDir dir = testing::MakeTempDir();
  ASSERT_OK_AND_ASSIGN(auto files, OpenStore("file://" + dir.path()));
  ASSERT_OK(files->Put("layers/x", "data"));
  HttpClient client("http store test", HttpOptions{.attempts = 1});
  EXPECT_FALSE(CurlMapped());
  auto answer = client.Perform({.method = "GET", .url = "http://127.0.0.1:1/nothing"}, "get nothing");
  EXPECT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), ECONNREFUSED) << answer.status().ToString();
  EXPECT_TRUE(CurlMapped());
}

TEST_F(HttpClientTest, RetriesA5xxBurstThenSucceeds) {
  auto store = Open();
  server_->AddFault(Fault{FaultKind::kStatus, 503}, 2);
  server_->AddFault(Fault{FaultKind::kStatus, 500}, 1);
  ASSERT_OK_AND_ASSIGN(std::string got, store->Get(key_));
  EXPECT_EQ(got, data_);
  EXPECT_EQ(server_->requests(), 4);
}

TEST_F(HttpClientTest, GivesUpAfterTheAttemptsNamingStoreKeyStepAndAnswer) {
  auto store = Open();
  server_->SetFaultAlways(Fault{FaultKind::kStatus, 503});
  auto r = store->Get(key_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(server_->requests(), 4);  // attempts=4, not one more
  EXPECT_EQ(r.status().code(), EIO);
  const std::string msg = r.status().ToString();
  EXPECT_NE(msg.find(StrCat("http store ", server_->url(), "/store?")), std::string::npos) << msg;
  EXPECT_NE(msg.find(StrCat("get ", key_)), std::string::npos) << msg;
  EXPECT_NE(msg.find("HTTP 503 after 4 attempts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HTTP/1.1 503 Service Unavailable"), std::string::npos) << msg;
}

TEST_F(HttpClientTest, RetriesTooManyRequestsHonouringRetryAfterWithinTheCap) {
  auto store = Open("backoff_max=300ms");
  Fault fault{FaultKind::kStatus, 429};
  fault.retry_after = "1";  // one second, capped to backoff_max
  server_->AddFault(fault, 2);
  auto t0 = Clock::now();
  ASSERT_OK_AND_ASSIGN(std::string got, store->Get(key_));
  auto elapsed = Clock::now() - t0;
  EXPECT_EQ(got, data_);
  EXPECT_EQ(server_->requests(), 3);
  EXPECT_GE(elapsed, std::chrono::milliseconds(590));  // waited as asked, up to the cap
  EXPECT_LT(elapsed, std::chrono::milliseconds(1500));  // never the full Retry-After
}

TEST_F(HttpClientTest, NeverRetriesClientErrors) {
  auto store = Open();
  server_->SetFaultAlways(Fault{FaultKind::kStatus, 403});
  auto r = store->Get(key_);
  EXPECT_EQ(r.status().code(), EACCES);
  EXPECT_NE(r.status().ToString().find("HTTP 403"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(server_->requests(), 1);

  server_->SetFaultAlways(std::nullopt);
  server_->TakeRequests();
  int before = server_->requests();
  auto missing = store->Get("chunks/00/missing");
  EXPECT_EQ(missing.status().code(), ENOENT);
  EXPECT_EQ(server_->requests(), before + 1);
  auto size = store->Size("chunks/00/missing");
  EXPECT_EQ(size.status().code(), ENOENT);
}

TEST_F(HttpClientTest, RetriesConnectionsClosedMidBody) {
  auto store = Open();
  server_->AddFault(Fault{FaultKind::kCloseMidBody}, 2);
  ASSERT_OK_AND_ASSIGN(std::string got, store->Get(key_));
  EXPECT_EQ(got, data_);
  EXPECT_EQ(server_->requests(), 3);
}

TEST_F(HttpClientTest, RetriesADeclaredLengthTheBodyNeverReaches) {
  auto store = Open();
  server_->AddFault(Fault{FaultKind::kLongLength}, 1);
  ASSERT_OK_AND_ASSIGN(std::string got, store->Get(key_));
  EXPECT_EQ(got, data_);
  EXPECT_EQ(server_->requests(), 2);
}

TEST_F(HttpClientTest, AStallPastTheAttemptTimeoutIsRetried) {
  auto store = Open("timeout=300ms");
  Fault stall{FaultKind::kStall};
  stall.stall = std::chrono::seconds(5);
  server_->AddFault(stall, 1);
  auto t0 = Clock::now();
  ASSERT_OK_AND_ASSIGN(std::string got, store->Get(key_));
  EXPECT_EQ(got, data_);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(server_->requests(), 2);
}

TEST_F(HttpClientTest, TheDeadlineHoldsWhateverTheAttempts) {
  auto store = Open("attempts=100&timeout=400ms&deadline=1s");
  Fault stall{FaultKind::kStall};
  stall.stall = std::chrono::seconds(10);
  server_->SetFaultAlways(stall);
  auto t0 = Clock::now();
  auto r = store->Get(key_);
  auto elapsed = Clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ETIMEDOUT);
  EXPECT_NE(r.status().ToString().find("deadline of 1s passed"), std::string::npos) << r.status().ToString();
  EXPECT_GE(elapsed, std::chrono::milliseconds(900));
  EXPECT_LT(elapsed, std::chrono::milliseconds(1300));
  EXPECT_LE(server_->requests(), 3);
}

TEST_F(HttpClientTest, BackoffStaysWithinItsCap) {
  // 6 failures with backoff 10ms doubling to at most 40ms: at most
  // 10+20+40+40+40 ms of sleeping in all.
  auto store = Open("attempts=6&backoff=10ms&backoff_max=40ms");
  server_->SetFaultAlways(Fault{FaultKind::kStatus, 502});
  auto t0 = Clock::now();
  EXPECT_FALSE(store->Get(key_).ok());
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(150 + 200));
  EXPECT_EQ(server_->requests(), 6);
}

TEST_F(HttpClientTest, ConnectionRefusedIsRetriedAndNamed) {
  ASSERT_OK_AND_ASSIGN(int port, testing::FreeLoopbackPort());
  std::string url = StrCat("http://127.0.0.1:", port, "/x?attempts=3&backoff=10ms");
  ASSERT_OK_AND_ASSIGN(auto store, OpenStore(url));
  auto r = store->Get("chunks/ab/abcd");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ECONNREFUSED);
  const std::string msg = r.status().ToString();
  EXPECT_NE(msg.find(url), std::string::npos) << msg;
  EXPECT_NE(msg.find("get chunks/ab/abcd: failed after 3 attempts (last: Couldn't connect"), std::string::npos) << msg;
}

TEST_F(HttpClientTest, RangeReadsCheckWhatTheServerSent) {
  auto store = Open();
  std::string buf(1000, '\0');
  ASSERT_OK_AND_ASSIGN(size_t n, store->GetRange(key_, 5000, buf));
  EXPECT_EQ(n, 1000u);
  EXPECT_EQ(buf, data_.substr(5000, 1000));
  ASSERT_OK_AND_ASSIGN(n, store->GetRange(key_, data_.size() - 10, buf));
  EXPECT_EQ(n, 10u);
  ASSERT_OK_AND_ASSIGN(n, store->GetRange(key_, data_.size(), buf));
  EXPECT_EQ(n, 0u);

  // A server that ignores Range and sends the whole object: we take our part.
  server_->SetHandler([&](const TestHttpServer::Request&) { return TestHttpServer::Reply{200, {}, data_}; });
  ASSERT_OK_AND_ASSIGN(n, store->GetRange(key_, 7000, buf));
  EXPECT_EQ(n, 1000u);
  EXPECT_EQ(buf, data_.substr(7000, 1000));

  // A 206 for other bytes than asked is never taken as the answer.
  server_->TakeRequests();
  int before = server_->requests();
  server_->SetHandler([&](const TestHttpServer::Request&) {
    return TestHttpServer::Reply{206, {{"Content-Range", StrCat("bytes 0-999/", data_.size())}}, data_.substr(0, 1000)};
  });
  auto wrong = store->GetRange(key_, 7000, buf);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().ToString().find("asked for bytes 7000-7999"), std::string::npos) << wrong.status().ToString();
  EXPECT_EQ(server_->requests(), before + 4);  // retried, bounded
}

TEST_F(HttpClientTest, ConnectionsAreReusedAcrossThreads) {
  auto store = Open();
  constexpr int kThreads = 8, kGets = 40;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kGets; ++i) {
        auto got = store->Get(key_);
        if (!got.ok() || *got != data_) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(server_->requests(), kThreads * kGets);
  EXPECT_LE(server_->connections(), 2 * kThreads);  // not one per request
}

// What the chunk cache makes of a store that sends wrong bytes or wrong
// lengths: nothing bad is cached, and a good answer later is.
TEST_F(HttpClientTest, WrongBytesNeverReachTheCache) {
  auto store = Open();
  TempDir dir = testing::MakeTempDir();
  ChunkCacheOptions options;
  options.dir = dir.Sub("cache");
  options.fetch_threads = 2;
  ASSERT_OK_AND_ASSIGN(auto cache, ChunkCache::Open(options));

  server_->AddFault(Fault{FaultKind::kWrongBytes}, 1);
  auto r = cache->Get(id_, store);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EBADMSG);
  EXPECT_FALSE(cache->Contains(id_));

  server_->AddFault(Fault{FaultKind::kShortLength}, 1);  // half the object, well-formed
  r = cache->Get(id_, store);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EBADMSG);
  EXPECT_FALSE(cache->Contains(id_));
  EXPECT_EQ(cache->stats().corrupt, 2u);

  ASSERT_OK_AND_ASSIGN(auto handle, cache->Get(id_, store));
  std::string back(data_.size(), '\0');
  ASSERT_OK_AND_ASSIGN(size_t n, handle.Read(0, back));
  EXPECT_EQ(n, data_.size());
  EXPECT_EQ(back, data_);
  EXPECT_TRUE(cache->Contains(id_));
}

TEST(HttpOptionsTest, UrlKnobsParseAndBadOnesAreNamed) {
  HttpOptions options;
  ASSERT_OK_AND_ASSIGN(bool applied, ApplyHttpOption("timeout", "250ms", &options));
  EXPECT_TRUE(applied);
  EXPECT_EQ(options.attempt_timeout, std::chrono::milliseconds(250));
  ASSERT_OK_AND_ASSIGN(applied, ApplyHttpOption("attempts", "7", &options));
  EXPECT_EQ(options.attempts, 7);
  ASSERT_OK_AND_ASSIGN(applied, ApplyHttpOption("colour", "red", &options));
  EXPECT_FALSE(applied);
  EXPECT_FALSE(ApplyHttpOption("attempts", "0", &options).ok());
  EXPECT_FALSE(ApplyHttpOption("deadline", "soon", &options).ok());

  auto bad = OpenStore("http://127.0.0.1:1/x?retries=3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("unknown parameter retries"), std::string::npos) << bad.status().ToString();
  EXPECT_FALSE(OpenStore("http:///nohost").ok());
}

TEST(UrlEncodingTest, EncodesAllButUnreserved) {
  EXPECT_EQ(EncodeUrlComponent("a b+c/d=e&f~g_h.i-j%"), "a%20b%2Bc%2Fd%3De%26f~g_h.i-j%25");
  EXPECT_EQ(EncodeUrlPath("chunks/a b/\xc3\xa9"), "chunks/a%20b/%C3%A9");
  EXPECT_EQ(DecodeUrlComponent("a%20b%2Bc+d", true), "a b+c d");
  EXPECT_EQ(DecodeUrlComponent("50%", false), "50%");
}

}  // namespace
}  // namespace strata::cache
