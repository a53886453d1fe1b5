// HttpStore: objects as resources on a WebDAV-capable HTTP server.
#include "cache/http_store.h"

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/strings.h"

namespace strata::cache {

HttpStore::HttpStore(std::string url, std::string base, HttpOptions options)
    : url_(std::move(url)), base_(std::move(base)), client_(StrCat("http store ", url_), options) {}

Result<std::shared_ptr<ObjectStore>> HttpStore::Open(std::string url, std::string base, HttpOptions options) {
  while (base.ends_with('/')) base.pop_back();
  return std::shared_ptr<ObjectStore>(new HttpStore(std::move(url), std::move(base), options));
}

std::string HttpStore::UrlOf(std::string_view key) const { return StrCat(base_, "/", EncodeUrlPath(key)); }

Result<std::string> HttpStore::Get(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string step = StrCat("get ", key);
  HttpRequest req;
  req.url = UrlOf(key);
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status != 200) return client_.StatusError(r, step);
  return std::move(r.body);
}

Result<size_t> HttpStore::GetRange(std::string_view key, uint64_t offset, std::span<char> out) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  if (out.empty()) return size_t{0};
  const std::string step = StrCat("get range ", offset, "+", out.size(), " of ", key);
  HttpRequest req;
  req.url = UrlOf(key);
  req.headers.push_back(StrCat("Range: bytes=", offset, "-", offset + out.size() - 1));
  req.out = out;
  req.skip_on_200 = offset;
  req.check = [&](const HttpResponse& r) { return CheckRangeAnswer(r, offset, out.size()); };
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status == 416) return size_t{0};  // offset at or past the end
  if (r.status != 200 && r.status != 206) return client_.StatusError(r, step);
  return r.out_bytes;
}

Status HttpStore::Put(std::string_view key, std::string_view data) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string tmp_url = StrCat(base_, "/", kStagingDir, "/", EncodeUrlComponent(StagingName(key)));
  const std::string final_url = UrlOf(key);
  const std::string step = StrCat("put ", key);

  HttpRequest put;
  put.method = "PUT";
  put.url = tmp_url;
  put.body = data;
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(put, StrCat(step, ": upload to ", tmp_url)));
  if (r.status < 200 || r.status >= 300) return client_.StatusError(r, StrCat(step, ": upload to ", tmp_url));

  HttpRequest move;
  move.method = "MOVE";
  move.url = tmp_url;
  move.headers = {"Destination: " + final_url, "Overwrite: T"};
  auto moved = client_.Perform(move, StrCat(step, ": move into place"));
  if (moved.ok() && moved->status >= 200 && moved->status < 300) return OkStatus();
  if (moved.ok() && moved->status == 404 && moved->attempts > 1) {
    // An earlier attempt's MOVE may have gone through with its answer lost;
    // then the temporary is gone and the object is there, whole.
    auto size = Size(key);
    if (size.ok() && *size == data.size()) return OkStatus();
  }
  Status error = moved.ok() ? client_.StatusError(*moved, StrCat(step, ": move into place")) : moved.status();
  HttpRequest cleanup;
  cleanup.method = "DELETE";
  cleanup.url = tmp_url;
  client_.Perform(cleanup, StrCat(step, ": remove temporary")).status().IgnoreError();
  return error;
}

Result<uint64_t> HttpStore::Size(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string step = StrCat("stat ", key);
  HttpRequest req;
  req.method = "HEAD";
  req.url = UrlOf(key);
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status == 301 || r.status == 302) {
    // nginx redirects a directory to "<dir>/": there is no object by that name.
    return Error(ENOENT, StrCat(client_.store_name(), ": ", step, ": a directory, not an object"));
  }
  if (r.status != 200) return client_.StatusError(r, step);
  auto length = r.ContentLength();
  if (!length) return Error(EPROTO, StrCat(client_.store_name(), ": ", step, ": HEAD answer has no Content-Length"));
  return *length;
}

Status HttpStore::Delete(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string step = StrCat("delete ", key);
  HttpRequest req;
  req.method = "DELETE";
  req.url = UrlOf(key);
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if ((r.status >= 200 && r.status < 300) || r.status == 404) return OkStatus();
  return client_.StatusError(r, step);
}

Result<std::vector<HttpStore::DirEntry>> HttpStore::ReadDir(const std::string& dir_key) {
  const std::string step = StrCat("list directory ", Quote(dir_key.empty() ? "/" : dir_key + "/"));
  HttpRequest req;
  req.url = dir_key.empty() ? base_ + "/" : StrCat(base_, "/", EncodeUrlPath(dir_key), "/");
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status == 404) return std::vector<DirEntry>{};
  if (r.status != 200) return client_.StatusError(r, step);
  auto not_json = [&] {
    return Error(ENOTSUP, StrCat(client_.store_name(), ": ", step,
                                 ": the server sent no JSON directory listing (nginx: autoindex on; "
                                 "autoindex_format json;)"));
  };
  auto type = r.Header("content-type");
  if (!type || type->find("json") == std::string_view::npos) return not_json();
  nlohmann::json listing = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!listing.is_array()) return not_json();
  std::vector<DirEntry> entries;
  for (const auto& e : listing) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) return not_json();
    DirEntry entry;
    entry.name = e["name"].get<std::string>();
    if (entry.name.empty() || entry.name.front() == '.') continue;  // ".tmp" and its likes
    std::string kind = e.value("type", "");
    entry.is_dir = kind == "directory";
    if (!entry.is_dir && kind != "file") continue;  // links, sockets: not objects
    if (!entry.is_dir) {
      if (!e.contains("size") || !e["size"].is_number_unsigned()) return not_json();
      entry.size = e["size"].get<uint64_t>();
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

// The same walk as FileStore's: directories sort as "name/" so the listing
// comes out in key order, and subtrees that lie wholly before the page token
// are not fetched.
Status HttpStore::Walk(const std::string& dir_key, std::string_view prefix, std::string_view token, size_t limit,
                       std::vector<ObjectInfo>* out) {
  STRATA_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, ReadDir(dir_key));
  auto sort_key = [](const DirEntry& e) { return e.is_dir ? e.name + "/" : e.name; };
  std::sort(entries.begin(), entries.end(),
            [&](const DirEntry& a, const DirEntry& b) { return sort_key(a) < sort_key(b); });
  for (const auto& e : entries) {
    if (out->size() >= limit) return OkStatus();
    std::string key = dir_key.empty() ? e.name : dir_key + "/" + e.name;
    if (e.is_dir) {
      std::string sub = key + "/";
      if (!sub.starts_with(prefix) && !prefix.starts_with(sub)) continue;
      if (!token.empty() && sub < token && !token.starts_with(sub)) continue;
      STRATA_RETURN_IF_ERROR(Walk(key, prefix, token, limit, out));
      continue;
    }
    if (!key.starts_with(prefix) || (!token.empty() && key <= token)) continue;
    out->push_back({std::move(key), e.size});
  }
  return OkStatus();
}

Result<ListPage> HttpStore::List(std::string_view prefix, std::string_view token, size_t max_keys) {
  if (max_keys == 0) max_keys = 1000;
  size_t slash = prefix.rfind('/');
  std::string start = slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash));
  ListPage page;
  STRATA_RETURN_IF_ERROR(Walk(start, prefix, token, max_keys + 1, &page.objects));
  if (page.objects.size() > max_keys) {
    page.objects.resize(max_keys);
    page.next_token = page.objects.back().key;
  }
  return page;
}

}  // namespace strata::cache
