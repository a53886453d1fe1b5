// FileStore: objects as files under a root directory.
#include "cache/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/fs.h"
#include "common/strings.h"

namespace strata::cache {
namespace {

struct Entry {
  std::string name;
  bool is_dir;
  std::string sort_key;  // directories sort as "name/", matching their keys
};

}  // namespace

Result<std::shared_ptr<ObjectStore>> FileStore::Open(std::string url, std::string root) {
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  Status s = MakeDirs(JoinPath(root, kStagingDir));
  if (!s.ok()) return s.Annotate(StrCat("open file store ", url));
  return std::shared_ptr<ObjectStore>(new FileStore(std::move(url), std::move(root)));
}

std::string FileStore::PathOf(std::string_view key) const { return JoinPath(root_, key); }

std::string FileStore::Step(std::string_view step, std::string_view key) const {
  return StrCat("file store ", url_, ": ", step, " ", key);
}

Result<std::string> FileStore::Get(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  auto fd = OpenFile(PathOf(key), O_RDONLY);
  if (!fd.ok()) return fd.status().Annotate(Step("get", key));
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return ErrnoError(errno, Step("stat", key));
  std::string data(static_cast<size_t>(st.st_size), '\0');
  auto n = PreadFull(fd->get(), data, 0);
  if (!n.ok()) return n.status().Annotate(Step("get", key));
  if (*n != data.size()) {
    return Error(EIO, StrCat(Step("get", key), ": file shrank while being read (", *n, " of ", data.size(), " bytes)"));
  }
  return data;
}

Result<size_t> FileStore::GetRange(std::string_view key, uint64_t offset, std::span<char> out) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  auto fd = OpenFile(PathOf(key), O_RDONLY);
  if (!fd.ok()) return fd.status().Annotate(Step("get range of", key));
  auto n = PreadFull(fd->get(), out, offset);
  if (!n.ok()) return n.status().Annotate(Step("get range of", key));
  return *n;
}

Status FileStore::Put(std::string_view key, std::string_view data) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string final_path = PathOf(key);
  const std::string tmp = JoinPath(JoinPath(root_, kStagingDir), StagingName(key));
  {
    auto fd = OpenFile(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (!fd.ok()) return fd.status().Annotate(Step("put", key));
    Status s = WriteFull(fd->get(), data);
    if (s.ok() && ::fsync(fd->get()) != 0) s = ErrnoError(errno, "fsync");
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s.Annotate(StrCat(Step("put", key), ": write ", tmp));
    }
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    Status s;
    if (errno == ENOENT) s = MakeDirs(Dirname(final_path));
    if (s.ok() && ::rename(tmp.c_str(), final_path.c_str()) != 0) {
      s = ErrnoError(errno, StrCat("rename ", tmp, " to ", final_path));
    }
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s.Annotate(Step("put", key));
    }
  }
  return OkStatus();
}

Result<uint64_t> FileStore::Size(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  struct stat st;
  if (::stat(PathOf(key).c_str(), &st) != 0) return ErrnoError(errno, Step("stat", key));
  if (!S_ISREG(st.st_mode)) return Error(ENOENT, StrCat(Step("stat", key), ": not a regular file"));
  return static_cast<uint64_t>(st.st_size);
}

Status FileStore::Delete(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  if (::unlink(PathOf(key).c_str()) != 0 && errno != ENOENT) return ErrnoError(errno, Step("delete", key));
  return OkStatus();
}

namespace {

// Walks the tree below `dir_key` in key order, appending objects that match
// `prefix` and sort after `token`, until `limit` are collected.
Status Walk(const std::string& root, const std::string& dir_key, std::string_view prefix,
            std::string_view token, size_t limit, std::vector<ObjectInfo>* out) {
  const std::string dir_path = dir_key.empty() ? root : JoinPath(root, dir_key);
  DIR* dir = ::opendir(dir_path.c_str());
  if (!dir) {
    if (errno == ENOENT || errno == ENOTDIR) return OkStatus();
    return ErrnoError(errno, StrCat("list ", dir_path));
  }
  std::vector<Entry> entries;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;  // ".", "..", ".tmp" and temporaries
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      if (::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      is_dir = S_ISDIR(st.st_mode);
    }
    std::string name = e->d_name;
    std::string sort_key = is_dir ? name + "/" : name;
    entries.push_back({std::move(name), is_dir, std::move(sort_key)});
  }
  ::closedir(dir);
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.sort_key < b.sort_key; });

  for (const auto& e : entries) {
    if (out->size() >= limit) return OkStatus();
    std::string key = dir_key.empty() ? e.name : dir_key + "/" + e.name;
    if (e.is_dir) {
      std::string sub = key + "/";
      if (!sub.starts_with(prefix) && !prefix.starts_with(sub)) continue;
      // Every key below starts with `sub`; skip the subtree when all sort before the token.
      if (!token.empty() && sub < token && !token.starts_with(sub)) continue;
      STRATA_RETURN_IF_ERROR(Walk(root, key, prefix, token, limit, out));
      continue;
    }
    if (!key.starts_with(prefix) || (!token.empty() && key <= token)) continue;
    struct stat st;
    if (::stat(JoinPath(root, key).c_str(), &st) != 0) continue;  // deleted meanwhile
    if (!S_ISREG(st.st_mode)) continue;
    out->push_back({std::move(key), static_cast<uint64_t>(st.st_size)});
  }
  return OkStatus();
}

}  // namespace

Result<ListPage> FileStore::List(std::string_view prefix, std::string_view token, size_t max_keys) {
  if (max_keys == 0) max_keys = 1000;
  // Start at the deepest directory the prefix names in full.
  size_t slash = prefix.rfind('/');
  std::string start = slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash));
  ListPage page;
  Status s = Walk(root_, start, prefix, token, max_keys + 1, &page.objects);
  if (!s.ok()) return s.Annotate(StrCat("file store ", url_, ": list ", Quote(prefix)));
  if (page.objects.size() > max_keys) {
    page.objects.resize(max_keys);
    page.next_token = page.objects.back().key;
  }
  return page;
}

}  // namespace strata::cache
