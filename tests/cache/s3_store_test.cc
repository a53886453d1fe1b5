// S3Store pieces that need no S3 server: URL parsing, canonical queries,
// and reading ListObjectsV2 and error documents (from an in-process server).
#include "cache/s3_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/strings.h"
#include "tests/testing/test_http_server.h"
#include "tests/testing/test_util.h"

namespace strata::cache {
namespace {

using testing::TestHttpServer;

// Sets or clears an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(CanonicalQueryTest, SortsByNameAndEncodesAsSigV4Wants) {
  EXPECT_EQ(CanonicalQuery({{"prefix", "a b/"}, {"list-type", "2"}, {"continuation-token", "x+y=/z~"}}),
            "continuation-token=x%2By%3D%2Fz~&list-type=2&prefix=a%20b%2F");
  EXPECT_EQ(CanonicalQuery({}), "");
}

TEST(ParseS3UrlTest, DefaultsAndOptions) {
  ScopedEnv key("AWS_ACCESS_KEY_ID", "AKID"), secret("AWS_SECRET_ACCESS_KEY", "SECRET"),
      token("AWS_SESSION_TOKEN", nullptr), region("AWS_REGION", nullptr), dregion("AWS_DEFAULT_REGION", "eu-west-1");
  ASSERT_OK_AND_ASSIGN(auto aws, ParseS3Url("s3://layers/prod/"));
  EXPECT_EQ(aws.first.bucket, "layers");
  EXPECT_EQ(aws.first.prefix, "prod/");
  EXPECT_EQ(aws.first.region, "eu-west-1");
  EXPECT_EQ(aws.first.endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(aws.first.path_style);
  EXPECT_EQ(aws.first.access_key, "AKID");

  ASSERT_OK_AND_ASSIGN(auto local,
                       ParseS3Url("s3://b?endpoint=http://127.0.0.1:9000&region=us-west-2&attempts=2&deadline=5s"));
  EXPECT_EQ(local.first.prefix, "");
  EXPECT_EQ(local.first.region, "us-west-2");
  EXPECT_TRUE(local.first.path_style);
  EXPECT_EQ(local.second.attempts, 2);
  EXPECT_EQ(local.second.deadline, std::chrono::seconds(5));

  ASSERT_OK_AND_ASSIGN(auto vhost, ParseS3Url("s3://b/p?endpoint=http://localhost:9000&style=virtual"));
  EXPECT_FALSE(vhost.first.path_style);

  for (const char* bad : {"s3://", "s3://b?style=sideways", "s3://b?endpoint=ftp://x", "s3://b?endpoint=http://h/p",
                          "s3://b?colour=red", "s3://b/../x"}) {
    EXPECT_FALSE(ParseS3Url(bad).ok()) << bad;
  }
  ScopedEnv no_secret("AWS_SECRET_ACCESS_KEY", nullptr);
  auto half = ParseS3Url("s3://b");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().ToString().find("AWS_SECRET_ACCESS_KEY"), std::string::npos);
}

class S3ListingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = TestHttpServer::Start();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    auto store = OpenStore(StrCat("s3://bkt/pre?endpoint=", server_->url(), "&attempts=2&backoff=1ms"));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = *store;
  }
  void Answer(int status, std::string body) {
    server_->SetHandler([=](const TestHttpServer::Request&) {
      return TestHttpServer::Reply{status, {{"Content-Type", "application/xml"}}, body};
    });
  }
  std::unique_ptr<TestHttpServer> server_;
  std::shared_ptr<ObjectStore> store_;
};

TEST_F(S3ListingTest, DecodesEntitiesAndFollowsTokens) {
  Answer(200,
         "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/"
         "2006-03-01/\"><Name>bkt</Name><Prefix>pre/</Prefix><KeyCount>3</KeyCount><MaxKeys>3</MaxKeys>"
         "<IsTruncated>true</IsTruncated><Contents><Key>pre/a&amp;b&lt;c&gt;&quot;&apos;</Key><Size>12</Size></Contents>"
         "<Contents><Key>pre/caf&#xE9;&#32;x</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><Size>0</Size>"
         "</Contents><Contents><Key>pre/k</Key><Size>18446744073709551615</Size></Contents>"
         "<NextContinuationToken>1/a+b=&amp;c</NextContinuationToken></ListBucketResult>");
  ASSERT_OK_AND_ASSIGN(ListPage page, store_->List("", "", 3));
  ASSERT_EQ(page.objects.size(), 3u);
  EXPECT_EQ(page.objects[0].key, "a&b<c>\"'");
  EXPECT_EQ(page.objects[0].size, 12u);
  EXPECT_EQ(page.objects[1].key, "caf\xc3\xa9 x");
  EXPECT_EQ(page.objects[2].size, UINT64_MAX);
  EXPECT_EQ(page.next_token, "1/a+b=&c");

  ASSERT_OK_AND_ASSIGN(page, store_->List("x y/", page.next_token, 5000));
  auto requests = server_->TakeRequests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].target, "/bkt?list-type=2&max-keys=3&prefix=pre%2F");
  EXPECT_EQ(requests[1].target,
            "/bkt?continuation-token=1%2Fa%2Bb%3D%26c&list-type=2&max-keys=1000&prefix=pre%2Fx%20y%2F");
}

TEST_F(S3ListingTest, RefusesWhatItCannotReadExactly) {
  Answer(200, "<ListBucketResult><Contents><Key>pre/a&bogus;</Key><Size>1</Size></Contents></ListBucketResult>");
  auto r = store_->List("", "", 10);
  EXPECT_EQ(r.status().code(), EPROTO);
  Answer(200, "<ListBucketResult><Contents><Key>pre/a</Key><Size>-1</Size></Contents></ListBucketResult>");
  EXPECT_EQ(store_->List("", "", 10).status().code(), EPROTO);
  Answer(200, "<html>a captive portal</html>");
  EXPECT_EQ(store_->List("", "", 10).status().code(), EPROTO);
  Answer(200, "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>");
  EXPECT_EQ(store_->List("", "", 10).status().code(), EPROTO);
}

TEST_F(S3ListingTest, ErrorsCarryS3sCodeAndMessage) {
  Answer(404,
         "<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>The specified bucket does not "
         "exist &amp; never did</Message></Error>");
  auto r = store_->Get("chunks/ab/x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOENT);
  const std::string msg = r.status().ToString();
  EXPECT_NE(msg.find("s3 store s3://bkt/pre?"), std::string::npos) << msg;
  EXPECT_NE(msg.find("get chunks/ab/x: HTTP 404"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NoSuchBucket: The specified bucket does not exist & never did"), std::string::npos) << msg;
  auto requests = server_->TakeRequests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].target, "/bkt/pre/chunks/ab/x");
}

}  // namespace
}  // namespace strata::cache
