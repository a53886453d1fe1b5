// HttpStore: an ObjectStore on a plain HTTP(S) server with WebDAV, such as
// nginx with `dav_methods PUT DELETE MOVE; create_full_put_path on;`.
// An object is the resource <base>/<key>. Reads are GET (with Range for
// GetRange) and HEAD; a put uploads to <base>/.tmp/<name>.<pid>.<n>.<rand>
// and MOVEs it over <base>/<key>, so a reader sees the whole old object or
// the whole new one. List walks the server's JSON directory listings
// (nginx: `autoindex on; autoindex_format json;`) and fails with ENOTSUP on
// a server that offers none.
#pragma once

#include <memory>
#include <string>

#include "cache/http_client.h"
#include "cache/object_store.h"

namespace strata::cache {

class HttpStore : public ObjectStore {
 public:
  // `url` is what the user gave (errors name it); `base` is the scheme,
  // host and path prefix without the query ("http://host:8080/layers").
  // Opening sends nothing: a server that is down fails the first call.
  static Result<std::shared_ptr<ObjectStore>> Open(std::string url, std::string base, HttpOptions options);

  const std::string& url() const override { return url_; }
  Result<std::string> Get(std::string_view key) override;
  Result<size_t> GetRange(std::string_view key, uint64_t offset, std::span<char> out) override;
  Status Put(std::string_view key, std::string_view data) override;
  Result<uint64_t> Size(std::string_view key) override;
  Result<ListPage> List(std::string_view prefix, std::string_view token, size_t max_keys) override;
  Status Delete(std::string_view key) override;

 private:
  HttpStore(std::string url, std::string base, HttpOptions options);
  std::string UrlOf(std::string_view key) const;
  // One directory's entries from its JSON listing; empty when it does not exist.
  struct DirEntry {
    std::string name;
    bool is_dir = false;
    uint64_t size = 0;
  };
  Result<std::vector<DirEntry>> ReadDir(const std::string& dir_key);
  Status Walk(const std::string& dir_key, std::string_view prefix, std::string_view token, size_t limit,
              std::vector<ObjectInfo>* out);

  std::string url_;
  std::string base_;  // no trailing slash
  HttpClient client_;
};

}  // namespace strata::cache
