// Our SigV4 signatures (libcurl's signer fed our canonical URLs and headers)
// against botocore's, an independent implementation: an in-process server
// captures exactly what S3Store sends, and botocore signs the same method,
// path, query, headers, payload hash and time.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include "cache/object_store.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "tests/testing/test_http_server.h"
#include "tests/testing/test_util.h"

#ifndef STRATA_SIGV4_REFERENCE
#error "STRATA_SIGV4_REFERENCE must name sigv4_reference.py"
#endif

namespace strata::cache {
namespace {

using testing::TestHttpServer;

// Debian's interpreter: it has python3-botocore, a python3 earlier on PATH may not.
constexpr const char* kPython = "/usr/bin/python3";
constexpr const char* kAccessKey = "AKIDEXAMPLE";
constexpr const char* kSecretKey = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
constexpr const char* kRegion = "eu-central-1";
// A continuation token with every kind of character that needs encoding.
constexpr const char* kToken = "1/a+b=c&d e~f%g";

TestHttpServer::Reply FakeS3(const TestHttpServer::Request& r) {
  if (r.target.find("list-type=2") != std::string::npos) {
    bool second = r.target.find("continuation-token=") != std::string::npos;
    std::string body = StrCat(
        "<ListBucketResult><Name>b</Name><IsTruncated>", second ? "false" : "true", "</IsTruncated>",
        "<Contents><Key>p/k", second ? "2" : "1", "</Key><Size>1</Size></Contents>",
        second ? "" : "<NextContinuationToken>1/a+b=c&amp;d e~f%g</NextContinuationToken>", "</ListBucketResult>");
    return {200, {}, body};
  }
  if (r.method == "PUT") return {200, {}, ""};
  if (r.method == "DELETE") return {204, {}, ""};
  if (auto range = r.Header("range")) return {206, {{"Content-Range", "bytes 2-5/11"}}, "llo "};
  return {200, {}, "hello world"};
}

class S3SignatureTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto probe = RunCommand({.argv = {kPython, "-c", "import botocore.auth"}});
    if (!probe.ok() || !probe->success()) {
      GTEST_SKIP() << kPython << " cannot import botocore (scripts/setup installs python3-botocore)";
    }
    auto server = TestHttpServer::Start();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    server_->SetHandler(FakeS3);
    ::setenv("AWS_ACCESS_KEY_ID", kAccessKey, 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", kSecretKey, 1);
  }
  void TearDown() override { ::unsetenv("AWS_SESSION_TOKEN"); }

  // Botocore's Authorization for each captured request, with `secret`.
  std::vector<std::string> Reference(const std::vector<TestHttpServer::Request>& requests, const char* secret,
                                     const char* token) {
    nlohmann::json in = {{"access_key", kAccessKey}, {"secret_key", secret}, {"region", kRegion},
                         {"token", token ? nlohmann::json(token) : nlohmann::json(nullptr)}};
    for (const auto& r : requests) {
      nlohmann::json headers = nlohmann::json::object();
      for (const auto& [k, v] : r.headers) headers[k] = v;
      in["requests"].push_back({{"method", r.method}, {"target", r.target}, {"headers", headers}});
    }
    auto run = RunChecked({.argv = {kPython, STRATA_SIGV4_REFERENCE}, .stdin_data = in.dump()}, "botocore signer");
    EXPECT_TRUE(run.ok()) << run.status().ToString();
    if (!run.ok()) return {};
    auto lines = Split(run->out, '\n');
    if (!lines.empty() && lines.back().empty()) lines.pop_back();
    return lines;
  }

  std::unique_ptr<TestHttpServer> server_;
};

TEST_P(S3SignatureTest, AuthorizationMatchesBotocore) {
  const bool virtual_host = GetParam();
  for (const char* token : {static_cast<const char*>(nullptr), "FQoGZXIvYXdzE+token/with=odd&chars"}) {
    SCOPED_TRACE(token ? "with a session token" : "without a session token");
    if (token) ::setenv("AWS_SESSION_TOKEN", token, 1);
    else ::unsetenv("AWS_SESSION_TOKEN");
    std::string url = virtual_host
                          ? StrCat("s3://b/p?endpoint=http://localhost:", server_->port(), "&style=virtual&region=", kRegion)
                          : StrCat("s3://b/p?endpoint=", server_->url(), "&region=", kRegion);
    ASSERT_OK_AND_ASSIGN(auto store, OpenStore(url));
    server_->TakeRequests();

    ASSERT_OK_AND_ASSIGN(std::string got, store->Get("chunks/ab/a b+c"));
    EXPECT_EQ(got, "hello world");
    std::string buf(4, '\0');
    ASSERT_OK_AND_ASSIGN(size_t n, store->GetRange("chunks/ab/a b+c", 2, buf));
    EXPECT_EQ(n, 4u);
    ASSERT_OK(store->Put("layers/x.json", "{\"payload\": true}"));
    ASSERT_OK(store->Size("layers/x.json").status());
    ASSERT_OK(store->Delete("layers/x.json"));
    ASSERT_OK_AND_ASSIGN(ListPage first, store->List("k", "", 1));
    EXPECT_EQ(first.next_token, kToken);
    ASSERT_OK_AND_ASSIGN(ListPage second, store->List("k", first.next_token, 1));
    EXPECT_TRUE(second.next_token.empty());

    auto requests = server_->TakeRequests();
    ASSERT_EQ(requests.size(), 7u);
    EXPECT_EQ(requests[0].target, "/" + std::string(virtual_host ? "" : "b/") + "p/chunks/ab/a%20b%2Bc");
    EXPECT_EQ(requests[0].Header("host"), virtual_host ? StrCat("b.localhost:", server_->port())
                                                       : StrCat("127.0.0.1:", server_->port()));
    EXPECT_NE(requests[6].target.find("continuation-token=1%2Fa%2Bb%3Dc%26d%20e~f%25g&"), std::string::npos)
        << requests[6].target;
    for (const auto& r : requests) {
      auto auth = r.Header("authorization");
      ASSERT_TRUE(auth.has_value()) << r.method << " " << r.target;
      for (const char* must : {"host", "x-amz-content-sha256", "x-amz-date"}) {
        EXPECT_NE(auth->find(must), std::string::npos) << *auth;
      }
      if (token) {
        EXPECT_EQ(r.Header("x-amz-security-token"), token);
        EXPECT_NE(auth->find("x-amz-security-token"), std::string::npos) << *auth;
      }
    }
    EXPECT_NE(requests[1].Header("authorization")->find("range"), std::string::npos);

    std::vector<std::string> want = Reference(requests, kSecretKey, token);
    ASSERT_EQ(want.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(*requests[i].Header("authorization"), want[i]) << requests[i].method << " " << requests[i].target;
    }
    // The comparison can fail: another secret signs differently.
    std::vector<std::string> other = Reference({requests[0]}, "not-the-secret", token);
    ASSERT_EQ(other.size(), 1u);
    EXPECT_NE(*requests[0].Header("authorization"), other[0]);
  }
}

INSTANTIATE_TEST_SUITE_P(Styles, S3SignatureTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "VirtualHost" : "PathStyle";
                         });

}  // namespace
}  // namespace strata::cache
