// The ObjectStore helpers and URL dispatch.
#include "cache/object_store.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <random>

#include "cache/file_store.h"
#include "cache/http_client.h"
#include "cache/http_store.h"
#include "cache/s3_store.h"
#include "common/fs.h"
#include "common/strings.h"

namespace strata::cache {

Result<bool> ObjectStore::Exists(std::string_view key) {
  auto size = Size(key);
  if (size.ok()) return true;
  if (size.status().code() == ENOENT) return false;
  return size.status();
}

std::string StagingName(std::string_view key) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string base = Basename(key);
  if (base.size() > 100) base.resize(100);
  return StrCat(base, ".", getpid(), ".", counter.fetch_add(1), ".", rng() % 1000000);
}

std::string ChunkKey(const Digest128& id) {
  std::string hex = id.Hex();
  return StrCat("chunks/", hex.substr(0, 2), "/", hex);
}

Result<std::vector<ObjectInfo>> ListAll(ObjectStore& store, std::string_view prefix) {
  std::vector<ObjectInfo> all;
  std::string token;
  do {
    STRATA_ASSIGN_OR_RETURN(ListPage page, store.List(prefix, token, 1000));
    for (auto& o : page.objects) all.push_back(std::move(o));
    token = std::move(page.next_token);
  } while (!token.empty());
  return all;
}

Status ValidateKey(std::string_view key) {
  if (key.empty()) return Error(EINVAL, "object key is empty");
  for (const auto& part : Split(key, '/')) {
    if (part.empty() || part.front() == '.') {
      return Error(EINVAL, StrCat("object key ", Quote(key), ": components must be non-empty and must not start with '.'"));
    }
  }
  return OkStatus();
}

Result<std::shared_ptr<ObjectStore>> OpenStore(std::string_view url) {
  if (url.starts_with("file://")) {
    std::string_view path = url.substr(7);
    if (!path.starts_with("/")) {
      return Error(EINVAL, StrCat("store URL ", Quote(url), ": file:// needs an absolute path (file:///path)"));
    }
    return FileStore::Open(std::string(url), std::string(path));
  }
  if (url.starts_with("/")) return FileStore::Open(std::string(url), std::string(url));
  if (url.starts_with("http://") || url.starts_with("https://")) {
    ParsedUrl parsed = SplitUrlQuery(url);
    HttpOptions options;
    for (const auto& [name, value] : parsed.params) {
      auto applied = ApplyHttpOption(name, value, &options);
      if (!applied.ok()) return applied.status().Annotate(StrCat("store URL ", Quote(url)));
      if (!*applied) {
        return Error(EINVAL, StrCat("store URL ", Quote(url), ": unknown parameter ", Quote(name),
                                    " (known: timeout, connect_timeout, attempts, backoff, backoff_max, deadline)"));
      }
    }
    size_t host_start = parsed.base.find("://") + 3;
    if (host_start >= parsed.base.size() || parsed.base[host_start] == '/') {
      return Error(EINVAL, StrCat("store URL ", Quote(url), ": no host"));
    }
    return HttpStore::Open(std::string(url), std::move(parsed.base), options);
  }
  if (url.starts_with("s3://")) {
    STRATA_ASSIGN_OR_RETURN(auto parsed, ParseS3Url(url));
    return S3Store::Open(std::string(url), std::move(parsed.first), parsed.second);
  }
  size_t colon = url.find("://");
  if (colon == std::string_view::npos) {
    return Error(EINVAL, StrCat("store URL ", Quote(url), ": expected file:///path, an absolute path, http(s)://host/prefix or s3://bucket/prefix"));
  }
  return Error(EPROTONOSUPPORT, StrCat("store URL ", Quote(url), ": unsupported scheme ",
                                       Quote(url.substr(0, colon)), " (supported: file, http, https, s3)"));
}

std::string DefaultStoreUrl(std::string_view flag_value) {
  if (!flag_value.empty()) return std::string(flag_value);
  if (const char* env = std::getenv("STRATA_STORE"); env && *env) return env;
  return kDefaultStorePath;
}

}  // namespace strata::cache
