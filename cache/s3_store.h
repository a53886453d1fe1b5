// S3Store: an ObjectStore on a bucket spoken to through the S3 API
// (AWS S3, MinIO, Ceph RGW, s3rver, ...), every request signed with AWS
// SigV4 by libcurl.
//
// URL: s3://<bucket>[/<prefix>][?endpoint=<scheme://host[:port]>&region=<r>
//      &style=path|virtual&<HttpOptions knobs>]
// An object is <prefix>/<key> in the bucket. Without an endpoint the store
// talks to https://s3.<region>.amazonaws.com, virtual-host style; with one,
// path style unless style=virtual. The region defaults to $AWS_REGION, then
// $AWS_DEFAULT_REGION, then us-east-1. Credentials come from
// $AWS_ACCESS_KEY_ID, $AWS_SECRET_ACCESS_KEY and $AWS_SESSION_TOKEN when
// the store is opened; without a key pair requests go unsigned (public
// buckets).
#pragma once

#include <memory>
#include <string>

#include "cache/http_client.h"
#include "cache/object_store.h"

namespace strata::cache {

struct S3Location {
  std::string bucket;
  std::string prefix;    // "" or ending in '/'
  std::string endpoint;  // "https://s3.us-east-1.amazonaws.com", no trailing '/'
  std::string region;
  bool path_style = false;
  std::string access_key, secret_key, session_token;
};

// Parses an s3:// URL (and the environment's credentials) into a location
// and the retry knobs; the error names the URL and what is wrong.
Result<std::pair<S3Location, HttpOptions>> ParseS3Url(std::string_view url);

// The x-amz-content-sha256 value of a request without a body (the SHA-256
// of nothing), and the one of a PUT: its payload is not part of the
// signature (the chunk names check the content end to end).
inline constexpr const char* kEmptyPayloadSha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
inline constexpr const char* kUnsignedPayload = "UNSIGNED-PAYLOAD";

// Builds a canonical SigV4 query string: parameters sorted by name, names
// and values percent-encoded (RFC 3986 unreserved characters kept). libcurl
// 7.88 signs the query exactly as sent, so what we send must already be
// canonical.
std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> params);

class S3Store : public ObjectStore {
 public:
  static Result<std::shared_ptr<ObjectStore>> Open(std::string url, S3Location location, HttpOptions options);

  const std::string& url() const override { return url_; }
  Result<std::string> Get(std::string_view key) override;
  Result<size_t> GetRange(std::string_view key, uint64_t offset, std::span<char> out) override;
  Status Put(std::string_view key, std::string_view data) override;
  Result<uint64_t> Size(std::string_view key) override;
  // Up to min(max_keys, 1000) objects per page (S3's own cap); the token is
  // S3's continuation token.
  Result<ListPage> List(std::string_view prefix, std::string_view token, size_t max_keys) override;
  Status Delete(std::string_view key) override;

 private:
  S3Store(std::string url, S3Location location, HttpOptions options);
  std::string ObjectUrl(std::string_view key) const;
  std::string BucketUrl() const;  // ends in '/' when virtual-host style
  // A request with the signing set up and the payload hash header.
  HttpRequest NewRequest(std::string method, std::string url, bool has_payload) const;
  // StatusError with S3's <Code> and <Message> from the answer's body.
  Status S3Error(const HttpResponse& r, std::string_view step) const;

  std::string url_;
  S3Location loc_;
  std::string host_base_;  // scheme://[bucket.]host[:port]
  std::string sigv4_;      // "aws:amz:<region>:s3"
  HttpClient client_;
};

}  // namespace strata::cache
