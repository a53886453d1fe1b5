// FileStore: an ObjectStore on a POSIX directory, local or a mounted
// distributed filesystem (3FS, CephFS, NFS, JuiceFS). Objects are plain
// files under the root; puts write a temporary file in <root>/.tmp, fsync
// it and rename it into place.
#pragma once

#include <memory>
#include <string>

#include "cache/object_store.h"

namespace strata::cache {

class FileStore : public ObjectStore {
 public:
  // Creates `root` (and .tmp below it) when missing.
  static Result<std::shared_ptr<ObjectStore>> Open(std::string url, std::string root);

  const std::string& url() const override { return url_; }
  Result<std::string> Get(std::string_view key) override;
  Result<size_t> GetRange(std::string_view key, uint64_t offset, std::span<char> out) override;
  Status Put(std::string_view key, std::string_view data) override;
  Result<uint64_t> Size(std::string_view key) override;
  Result<ListPage> List(std::string_view prefix, std::string_view token, size_t max_keys) override;
  Status Delete(std::string_view key) override;

 private:
  FileStore(std::string url, std::string root) : url_(std::move(url)), root_(std::move(root)) {}
  std::string PathOf(std::string_view key) const;
  // "file store <url>: <step> <key>".
  std::string Step(std::string_view step, std::string_view key) const;

  std::string url_;
  std::string root_;
};

}  // namespace strata::cache
