// ObjectStore: where layers live. One interface over a mounted filesystem
// (file://), HTTP and S3. Keys are relative slash-separated paths such as
// "chunks/ab/ab12...". Every implementation is safe to call from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace strata::cache {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

struct ListPage {
  std::vector<ObjectInfo> objects;  // sorted by key
  // Pass to the next List call; empty when this was the last page.
  std::string next_token;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // The store's URL as the user gave it; errors name it.
  virtual const std::string& url() const = 0;

  // The whole object; ENOENT when it does not exist.
  virtual Result<std::string> Get(std::string_view key) = 0;
  // Reads up to out.size() bytes at `offset`; returns the count, which is
  // short only at the end of the object.
  virtual Result<size_t> GetRange(std::string_view key, uint64_t offset, std::span<char> out) = 0;
  // Stores `data` under `key` atomically: a reader sees the old object, no
  // object, or all of the new one, never a part.
  virtual Status Put(std::string_view key, std::string_view data) = 0;
  // The object's size; ENOENT when it does not exist.
  virtual Result<uint64_t> Size(std::string_view key) = 0;
  // Up to `max_keys` objects whose keys start with `prefix`, in key order,
  // starting after the page `token` names (empty: from the start).
  virtual Result<ListPage> List(std::string_view prefix, std::string_view token, size_t max_keys) = 0;
  // Deletes `key`; a key that does not exist is not an error.
  virtual Status Delete(std::string_view key) = 0;

  // Size() that tells "absent" apart from failure.
  Result<bool> Exists(std::string_view key);
};

// The store key of a content-named object: "chunks/<2 hex>/<32 hex>".
std::string ChunkKey(const Digest128& id);

// Every object under `prefix`, across all pages.
Result<std::vector<ObjectInfo>> ListAll(ObjectStore& store, std::string_view prefix);

// Where a writer stages an object before it takes its key (FileStore and
// HttpStore): a directory of that name under the store's root (which
// ValidateKey keeps keys out of), and a name there no other writer, here
// or in another process, picks.
inline constexpr const char* kStagingDir = ".tmp";
std::string StagingName(std::string_view key);

// Checks that `key` is a relative path of non-empty components, none of
// which starts with '.' (so "..", temporary names and hidden files are out).
Status ValidateKey(std::string_view key);

// Opens the store a URL names: "file:///path" or an absolute path (FileStore),
// "http(s)://host[:port]/prefix" (HttpStore) or "s3://bucket/prefix?..."
// (S3Store); remote URLs take the retry knobs of HttpOptions as query
// parameters. The error names the URL and what is wrong with it.
Result<std::shared_ptr<ObjectStore>> OpenStore(std::string_view url);

// The store from --store, else $STRATA_STORE, else the node's default
// local store.
std::string DefaultStoreUrl(std::string_view flag_value);
inline constexpr const char* kDefaultStorePath = "/var/lib/strata/store";

}  // namespace strata::cache
