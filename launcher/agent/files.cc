// The agent's file transfer: one file put or got, and directory trees
// (every name resolved below the target, never through a symlink).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/request.h"
#include "launcher/protocol/protocol.h"

namespace strata::launcher {

using nlohmann::json;
using agent::ParseJson;
using agent::SendError;

Status Agent::Put(int conn, const json& req) {
  const std::string path = req.value("path", "");
  if (path.empty() || path[0] != '/') return SendError(conn, Error(EINVAL, "put: path must be absolute"));
  // Into a temporary file beside the target, renamed over it only once
  // every byte is in: a transfer cut short leaves the target as it was.
  const std::string tmp = StrCat(Dirname(path), "/", agent::kPutTempPrefix, ::getpid(), "-", ::syscall(SYS_gettid));
  Status s = agent::MakeDirsAs(Dirname(path), req.contains("uid") ? "" : req.value("user", ""));
  UniqueFd fd;
  // A file that is itself a file rule's path is written in place: renaming
  // over it would unlink the mount point that hides it (or keeps it
  // read-only) in every running command's namespace.
  struct stat existing;
  const bool in_place = req.value("in_place", false) && ::lstat(path.c_str(), &existing) == 0 && S_ISREG(existing.st_mode);
  if (s.ok() && in_place) {
    fd.reset(::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW));
    if (!fd) s = ErrnoError(errno, "put: open " + path);
  } else if (s.ok()) {
    fd.reset(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) s = ErrnoError(errno, "put: create a file beside " + path);
  }
  auto drop = [&] {
    if (fd && !in_place) ::unlink(tmp.c_str());
  };
  // Read the data frames whatever happened, so the stream stays in step.
  while (true) {
    Frame type;
    std::string payload;
    Status r = ReadFrame(conn, &type, &payload);
    if (!r.ok()) {
      drop();
      return r;
    }
    if (type == Frame::kDataEnd) break;
    if (type != Frame::kData) {
      drop();
      return Error(EPROTO, "put: expected data frames");
    }
    if (s.ok()) s = WriteFull(fd.get(), payload).Annotate("put: write " + path);
  }
  // "user": a name of the sandbox's /etc/passwd the file is given to (a name it lacks: root's).
  std::optional<std::pair<uint32_t, uint32_t>> owner;
  if (req.contains("uid")) owner = {req.value("uid", 0u), req.value("gid", 0u)};
  if (const std::string user = req.value("user", ""); !owner && !user.empty()) {
    if (auto u = agent::LookupUser(user); u.ok()) owner = {u->uid, u->gid};
  }
  if (s.ok() && owner && ::fchown(fd.get(), owner->first, owner->second) != 0) {
    s = ErrnoError(errno, "put: chown " + path);
  }
  if (s.ok() && ::fchmod(fd.get(), req.value("mode", 0644) & 07777) != 0) s = ErrnoError(errno, "put: chmod " + path);
  if (s.ok() && !in_place && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoError(errno, "put: rename into " + path);
  if (!s.ok()) {
    drop();
    return SendError(conn, s);
  }
  return WriteFrame(conn, Frame::kOk, "{}");
}

Status Agent::Get(int conn, const json& req) {
  const std::string path = req.value("path", "");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return SendError(conn, ErrnoError(errno, "get: open " + path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return SendError(conn, ErrnoError(errno, "get: stat " + path));
  if (!S_ISREG(st.st_mode)) return SendError(conn, Error(EINVAL, "get: " + path + " is not a regular file"));
  STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kOk, json{{"size", st.st_size}, {"mode", st.st_mode & 07777}}.dump()));
  std::vector<char> buf(kMaxFrame);
  while (true) {
    ssize_t r = ::read(fd.get(), buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return SendError(conn, ErrnoError(errno, "get: read " + path));
    if (r == 0) break;
    STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kData, std::string_view(buf.data(), static_cast<size_t>(r))));
  }
  return WriteFrame(conn, Frame::kDataEnd, "");
}

// ---- Directory trees. Every name is resolved below the target one
// component at a time, never following a symbolic link (O_NOFOLLOW on each
// directory), so no entry of an archive, and no link it made earlier, can
// put a byte outside the target.

namespace {

// The components of a relative name; ".." anywhere is refused.
Result<std::vector<std::string>> TreeComponents(const std::string& name) {
  std::vector<std::string> parts;
  for (auto& p : Split(name, '/')) {
    if (p.empty() || p == ".") continue;
    if (p == "..") return Error(EINVAL, "tree: entry " + Quote(name) + " has a \"..\" component");
    parts.push_back(p);
  }
  return parts;
}

// The directory `parts[0..n)` below `root`, made (0755) where missing when `create`.
Result<UniqueFd> OpenBeneath(int root, const std::vector<std::string>& parts, size_t n, bool create, const std::string& name) {
  UniqueFd dir(::fcntl(root, F_DUPFD_CLOEXEC, 0));
  for (size_t i = 0; i < n; ++i) {
    int fd = ::openat(dir.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
      if (::mkdirat(dir.get(), parts[i].c_str(), 0755) != 0 && errno != EEXIST) return ErrnoError(errno, "tree: mkdir for " + name);
      fd = ::openat(dir.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      if (errno == ELOOP || errno == ENOTDIR) return Error(EINVAL, "tree: " + Quote(name) + " lies under a link or a file, not a directory");
      return ErrnoError(errno, "tree: open a directory of " + name);
    }
    dir.reset(fd);
  }
  return dir;
}

// Removes what stands at `leaf` unless it is a directory (a file or link
// the archive replaces).
void ClearLeaf(int parent, const std::string& leaf) {
  struct stat st;
  if (::fstatat(parent, leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode)) ::unlinkat(parent, leaf.c_str(), 0);
}

}  // namespace

Status Agent::PutTree(int conn, const json& req) {
  const std::string path = req.value("path", "");
  if (path.empty() || path[0] != '/') return SendError(conn, Error(EINVAL, "put tree: path must be absolute"));
  Status s = MakeDirs(path);
  UniqueFd root;
  if (s.ok()) {
    root.reset(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root) s = ErrnoError(errno, "put tree: open " + path);
  }
  uint64_t entries = 0;
  // Reads every frame whatever happened, so the stream stays in step; the
  // first error is the answer.
  while (true) {
    Frame type;
    std::string payload;
    STRATA_RETURN_IF_ERROR(ReadFrame(conn, &type, &payload));
    if (type == Frame::kTreeEnd) break;
    if (type != Frame::kTreeEntry) return Error(EPROTO, "put tree: expected an entry");
    auto entry = ParseJson(payload);
    const std::string name = entry.ok() ? entry->value("name", "") : "";
    const std::string kind = entry.ok() ? entry->value("type", "") : "";
    const uint32_t mode = entry.ok() ? entry->value("mode", 0644u) & 07777 : 0644;
    UniqueFd file;
    if (s.ok() && !entry.ok()) s = entry.status();
    std::vector<std::string> parts;
    if (s.ok()) {
      auto p = TreeComponents(name);
      if (!p.ok()) s = p.status();
      else parts = std::move(*p);
    }
    if (s.ok() && parts.empty() && kind != "dir") s = Error(EINVAL, "put tree: an entry without a name");
    UniqueFd parent;
    if (s.ok() && !parts.empty()) {
      auto d = OpenBeneath(root.get(), parts, parts.size() - 1, true, name);
      if (!d.ok()) s = d.status();
      else parent = std::move(*d);
    }
    if (s.ok() && !parts.empty()) {
      const std::string& leaf = parts.back();
      if (kind == "dir") {
        if (::mkdirat(parent.get(), leaf.c_str(), mode) != 0 && errno != EEXIST) s = ErrnoError(errno, "put tree: mkdir " + name);
        struct stat st;
        if (s.ok() && (::fstatat(parent.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))) {
          s = Error(EEXIST, "put tree: " + name + " exists and is not a directory");
        }
        if (s.ok()) ::fchmodat(parent.get(), leaf.c_str(), mode, 0);
      } else if (kind == "file") {
        ClearLeaf(parent.get(), leaf);
        file.reset(::openat(parent.get(), leaf.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!file) s = ErrnoError(errno, "put tree: create " + name);
      } else if (kind == "symlink") {
        ClearLeaf(parent.get(), leaf);
        if (::symlinkat(entry->value("target", "").c_str(), parent.get(), leaf.c_str()) != 0) s = ErrnoError(errno, "put tree: symlink " + name);
      } else if (kind == "hardlink") {
        auto t = TreeComponents(entry->value("target", ""));
        if (!t.ok() || t->empty()) {
          s = Error(EINVAL, "put tree: hard link " + name + " has no target in the tree");
        } else {
          auto tdir = OpenBeneath(root.get(), *t, t->size() - 1, false, name);
          if (!tdir.ok()) s = tdir.status();
          else {
            ClearLeaf(parent.get(), leaf);
            if (::linkat(tdir->get(), t->back().c_str(), parent.get(), leaf.c_str(), 0) != 0) s = ErrnoError(errno, "put tree: link " + name);
          }
        }
      } else {
        s = Error(EINVAL, "put tree: " + name + ": unknown entry type " + Quote(kind));
      }
    }
    if (kind == "file") {
      while (true) {
        STRATA_RETURN_IF_ERROR(ReadFrame(conn, &type, &payload));
        if (type == Frame::kDataEnd) break;
        if (type != Frame::kData) return Error(EPROTO, "put tree: expected file data");
        if (s.ok() && file) s = WriteFull(file.get(), payload).Annotate("put tree: write " + name);
      }
      if (s.ok() && file && ::fchmod(file.get(), mode) != 0) s = ErrnoError(errno, "put tree: chmod " + name);
    }
    if (s.ok()) ++entries;
  }
  if (!s.ok()) return SendError(conn, s);
  return WriteFrame(conn, Frame::kOk, json{{"entries", entries}}.dump());
}

namespace {

// Sends the tree below `dir` (whose name in the archive is `prefix`),
// never following a link.
Status SendTree(int conn, int dir, const std::string& prefix) {
  int copy = ::fcntl(dir, F_DUPFD_CLOEXEC, 0);
  DIR* d = ::fdopendir(copy);
  if (!d) {
    ::close(copy);
    return ErrnoError(errno, "get tree: list " + prefix);
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  std::vector<char> buf(kMaxFrame);
  for (const auto& n : names) {
    const std::string name = prefix.empty() ? n : prefix + "/" + n;
    struct stat st;
    if (::fstatat(dir, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    json entry = {{"name", name}, {"mode", st.st_mode & 07777}, {"mtime", st.st_mtime}};
    if (S_ISDIR(st.st_mode)) {
      int sub = ::openat(dir, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) continue;
      UniqueFd owner(sub);
      entry["type"] = "dir";
      STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kTreeEntry, entry.dump(-1, ' ', false, json::error_handler_t::replace)));
      STRATA_RETURN_IF_ERROR(SendTree(conn, sub, name));
    } else if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t len = ::readlinkat(dir, n.c_str(), target, sizeof target);
      if (len < 0) continue;
      entry["type"] = "symlink";
      entry["target"] = std::string(target, static_cast<size_t>(len));
      STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kTreeEntry, entry.dump(-1, ' ', false, json::error_handler_t::replace)));
    } else if (S_ISREG(st.st_mode)) {
      UniqueFd f(::openat(dir, n.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!f) continue;
      entry["type"] = "file";
      entry["size"] = st.st_size;
      STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kTreeEntry, entry.dump(-1, ' ', false, json::error_handler_t::replace)));
      // Exactly `size` bytes (a file that grows or shrinks meanwhile is cut or padded with zeros).
      uint64_t left = static_cast<uint64_t>(st.st_size);
      while (left > 0) {
        ssize_t r = ::read(f.get(), buf.data(), std::min<uint64_t>(buf.size(), left));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          std::fill(buf.begin(), buf.end(), 0);
          r = static_cast<ssize_t>(std::min<uint64_t>(buf.size(), left));
        }
        STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kData, std::string_view(buf.data(), static_cast<size_t>(r))));
        left -= static_cast<uint64_t>(r);
      }
      STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kDataEnd, ""));
    }
    // (Devices, fifos and sockets are not sent.)
  }
  return OkStatus();
}

}  // namespace

Status Agent::GetTree(int conn, const json& req) {
  const std::string path = req.value("path", "");
  UniqueFd root(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) return SendError(conn, ErrnoError(errno, "get tree: open " + path));
  STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kOk, "{}"));
  STRATA_RETURN_IF_ERROR(SendTree(conn, root.get(), ""));
  return WriteFrame(conn, Frame::kTreeEnd, "");
}

}  // namespace strata::launcher
