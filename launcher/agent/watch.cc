// The agent's directory watches (protocol version 7): inotify on a
// directory (and, recursive, every directory below it, also those made
// later), its events sent as they come until the launcher hangs up or the
// directory goes.
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/request.h"
#include "launcher/protocol/protocol.h"

namespace strata::launcher {

using nlohmann::json;
using agent::SendError;

namespace {

// The most directories one recursive watch follows.
constexpr size_t kMaxWatchedDirs = 8192;
constexpr uint32_t kMask = IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF |
                           IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK;

struct Watches {
  int fd;
  std::string root;
  bool recursive;
  std::map<int, std::string> dirs;  // watch descriptor -> path below root ("" for root)

  // Watches `rel` (and, recursive, every directory below it).
  Status Add(const std::string& rel) {
    if (dirs.size() >= kMaxWatchedDirs) {
      return Error(ENOSPC, StrCat("watch ", root, ": more than ", kMaxWatchedDirs, " directories below it"));
    }
    const std::string path = rel.empty() ? root : root + "/" + rel;
    const int wd = ::inotify_add_watch(fd, path.c_str(), kMask);
    if (wd < 0) return ErrnoError(errno, "watch " + path);
    dirs[wd] = rel;
    if (!recursive) return OkStatus();
    auto names = agent::DirNames(path, "watch");
    if (!names.ok()) return OkStatus();  // (gone again already)
    for (const auto& name : *names) {
      struct stat st;
      if (::lstat((path + "/" + name).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      Status s = Add(rel.empty() ? name : rel + "/" + name);
      if (!s.ok() && s.code() != ENOENT && s.code() != ENOTDIR) return s;
    }
    return OkStatus();
  }

  // Stops watching `rel` and what is below it (a directory moved away:
  // its watches would name it by where it was).
  void Drop(const std::string& rel) {
    for (auto it = dirs.begin(); it != dirs.end();) {
      if (it->second == rel || it->second.starts_with(rel + "/")) {
        ::inotify_rm_watch(fd, it->first);
        it = dirs.erase(it);
      } else {
        ++it;
      }
    }
  }
};

const char* TypeOf(uint32_t mask) {
  if (mask & (IN_CREATE | IN_MOVED_TO)) return "create";
  if (mask & IN_MODIFY) return "write";
  if (mask & IN_DELETE) return "remove";
  if (mask & IN_MOVED_FROM) return "rename";
  if (mask & IN_ATTRIB) return "chmod";
  return nullptr;
}

}  // namespace

Status Agent::Watch(int conn, const json& req) {
  const std::string path = req.value("path", "");
  if (path.empty() || path[0] != '/') return SendError(conn, Error(EINVAL, "watch: path must be absolute"));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return SendError(conn, ErrnoError(errno, "watch " + path));
  if (!S_ISDIR(st.st_mode)) return SendError(conn, Error(ENOTDIR, "watch " + path + ": not a directory"));
  UniqueFd in(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (!in) return SendError(conn, ErrnoError(errno, "watch: inotify_init1"));
  Watches w{in.get(), path == "/" ? "" : path, req.value("recursive", false), {}};
  if (Status s = w.Add(""); !s.ok()) return SendError(conn, s);
  STRATA_RETURN_IF_ERROR(WriteFrame(conn, Frame::kOk, "{}"));
  alignas(inotify_event) char buf[64 * 1024];
  std::set<uint32_t> put_moves;  // cookies of puts' renames (their moved-from half)
  while (true) {
    pollfd p[2] = {{in.get(), POLLIN, 0}, {conn, POLLIN | POLLRDHUP, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "watch: poll");
    }
    if (p[1].revents) return OkStatus();  // the launcher hung up (or spoke out of turn)
    const ssize_t n = ::read(in.get(), buf, sizeof buf);
    if (n <= 0) continue;
    for (ssize_t off = 0; off < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buf + off);
      off += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      if (e->mask & IN_Q_OVERFLOW) {  // (of no watch: its wd is -1)
        return SendError(conn, Error(EOVERFLOW, "watch " + path + ": events were lost (the kernel's queue overflowed)"));
      }
      auto dir = w.dirs.find(e->wd);
      if (dir == w.dirs.end()) continue;
      if (e->mask & IN_IGNORED) {
        w.dirs.erase(dir);
        continue;
      }
      if (e->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
        if (dir->second.empty()) return WriteFrame(conn, Frame::kOk, json{{"ended", "the directory was removed or moved"}}.dump());
        continue;  // (a subdirectory: its parent's event said so)
      }
      const std::string name = e->len ? std::string(e->name) : "";
      // A put's own file is not shown; its rename into place is the
      // file's creation and write, as a write in place would show.
      if (std::string_view(name).starts_with(agent::kPutTempPrefix)) {
        if (e->mask & IN_MOVED_FROM) put_moves.insert(e->cookie);
        continue;
      }
      const bool put = (e->mask & IN_MOVED_TO) && put_moves.erase(e->cookie) > 0;
      const std::string rel = dir->second.empty() ? name : name.empty() ? dir->second : dir->second + "/" + name;
      if (w.recursive && (e->mask & IN_ISDIR) && (e->mask & IN_MOVED_FROM)) w.Drop(rel);
      if (w.recursive && (e->mask & IN_ISDIR) && (e->mask & (IN_CREATE | IN_MOVED_TO))) {
        Status s = w.Add(rel);
        if (!s.ok() && s.code() != ENOENT && s.code() != ENOTDIR) return SendError(conn, s);
      }
      const char* type = TypeOf(e->mask);
      if (!type) continue;
      for (const char* t : {type, put ? "write" : nullptr}) {
        if (!t) continue;
        STRATA_RETURN_IF_ERROR(
            WriteFrame(conn, Frame::kWatchEvent, json{{"name", rel}, {"type", t}}.dump(-1, ' ', false, json::error_handler_t::replace)));
      }
    }
  }
}

}  // namespace strata::launcher
