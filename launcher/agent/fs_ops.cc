// The agent's filesystem calls (protocol version 6, kFs): describe, list,
// make, move and remove entries of the sandbox's tree, as its own root
// sees them. The E2B plane's filesystem service is made of them.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/request.h"
#include "launcher/protocol/protocol.h"

namespace strata::launcher {

using nlohmann::json;
using agent::SendError;

namespace {

// The most one list answers (its answer is one frame, at most kMaxFrame),
// and the deepest it goes.
constexpr size_t kMaxListBytes = kMaxFrame - (16 << 10);
constexpr uint32_t kMaxListDepth = 64;

// The records of a colon-separated file of the sandbox's (/etc/passwd,
// /etc/group) with at least `fields` fields and a name; none if it cannot be read.
std::vector<std::vector<std::string>> Records(const char* file, size_t fields) {
  std::vector<std::vector<std::string>> records;
  auto text = ReadFileToString(file);
  if (!text.ok()) return records;
  for (const auto& line : Split(*text, '\n')) {
    auto f = Split(line, ':');
    if (f.size() >= fields && !f[0].empty()) records.push_back(std::move(f));
  }
  return records;
}

// uid/gid -> name.
std::map<uint32_t, std::string> Names(const char* file) {
  std::map<uint32_t, std::string> names;
  for (const auto& f : Records(file, 3)) names.emplace(std::strtoul(f[2].c_str(), nullptr, 10), f[0]);
  return names;
}


std::string Permissions(mode_t mode) {
  std::string p = S_ISDIR(mode) ? "d" : S_ISLNK(mode) ? "L" : "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) p.push_back(mode & (0400 >> i) ? rwx[i] : '-');
  return p;
}

struct Describer {
  std::map<uint32_t, std::string> users = Names("/etc/passwd"), groups = Names("/etc/group");

  Result<json> Entry(const std::string& path) const {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return ErrnoError(errno, "stat " + path);
    const size_t slash = path.rfind('/');
    json e = {{"name", path == "/" ? "/" : path.substr(slash + 1)},
              {"path", path},
              {"type", S_ISDIR(st.st_mode) ? "dir" : S_ISLNK(st.st_mode) ? "symlink" : "file"},
              {"size", st.st_size},
              {"mode", st.st_mode & 07777},
              {"permissions", Permissions(st.st_mode)},
              {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec}};
    auto u = users.find(st.st_uid);
    e["owner"] = u == users.end() ? std::to_string(st.st_uid) : u->second;
    auto g = groups.find(st.st_gid);
    e["group"] = g == groups.end() ? std::to_string(st.st_gid) : g->second;
    if (S_ISLNK(st.st_mode)) {
      char target[4096];
      const ssize_t n = ::readlink(path.c_str(), target, sizeof target);
      if (n >= 0) e["target"] = std::string(target, static_cast<size_t>(n));
    }
    return e;
  }

  Status List(const std::string& dir, uint32_t depth, json* out, size_t* bytes) const {
    STRATA_ASSIGN_OR_RETURN(auto names, agent::DirNames(dir, "list"));
    for (const auto& name : names) {
      const std::string path = dir == "/" ? "/" + name : dir + "/" + name;
      auto entry = Entry(path);
      if (!entry.ok()) continue;  // (gone meanwhile)
      *bytes += entry->dump().size() + 1;
      if (*bytes > kMaxListBytes) {
        return Error(E2BIG, StrCat("list: more than one answer holds (", out->size(), " entries so far, at ", path,
                                   "); list a directory further down, or with less depth"));
      }
      const bool is_dir = (*entry)["type"] == "dir";
      out->push_back(std::move(*entry));
      if (is_dir && depth > 1) STRATA_RETURN_IF_ERROR(List(path, depth - 1, out, bytes));
    }
    return OkStatus();
  }
};

// Removes `path` and, for a directory, everything below it, never
// following a link.
Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoError(errno, "remove " + path);
  if (!S_ISDIR(st.st_mode)) return ::unlink(path.c_str()) == 0 ? OkStatus() : ErrnoError(errno, "remove " + path);
  STRATA_ASSIGN_OR_RETURN(auto names, agent::DirNames(path, "remove"));
  for (const auto& name : names) STRATA_RETURN_IF_ERROR(RemoveTree(path + "/" + name));
  return ::rmdir(path.c_str()) == 0 ? OkStatus() : ErrnoError(errno, "remove " + path);
}

bool Absolute(const std::string& path) {
  if (path.empty() || path[0] != '/' || path.find('\0') != std::string::npos) return false;
  for (const auto& part : Split(path, '/')) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

namespace agent {

// The names in directory `dir` but "." and "..", sorted.
Result<std::vector<std::string>> DirNames(const std::string& dir, const char* what) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return ErrnoError(errno, StrCat(what, " ", dir));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

Result<User> LookupUser(const std::string& name) {
  for (const auto& f : Records("/etc/passwd", 6)) {
    if (f[0] == name) {
      return User{static_cast<uint32_t>(std::strtoul(f[2].c_str(), nullptr, 10)),
                  static_cast<uint32_t>(std::strtoul(f[3].c_str(), nullptr, 10)), f[5]};
    }
  }
  return Error(ENOENT, "user " + Quote(name) + " is not in the sandbox's /etc/passwd");
}

Status MakeDirsAs(const std::string& path, const std::string& user) {
  // The directories that are missing, from the top down.
  std::vector<std::string> missing;
  struct stat st;
  for (std::string p = path; p.size() > 1 && ::lstat(p.c_str(), &st) != 0; p = Dirname(p)) missing.insert(missing.begin(), p);
  STRATA_RETURN_IF_ERROR(MakeDirs(path));
  if (user.empty() || user == "root") return OkStatus();
  auto u = LookupUser(user);
  if (!u.ok()) return OkStatus();
  for (const auto& dir : missing) {
    if (::lchown(dir.c_str(), u->uid, u->gid) != 0) return ErrnoError(errno, "mkdir " + dir + ": chown to " + user);
  }
  return OkStatus();
}

}  // namespace agent

Status Agent::Fs(int conn, const json& req) {
  const std::string op = req.value("op", "");
  const std::string path = req.value("path", "");
  if (!Absolute(path)) return SendError(conn, Error(EINVAL, StrCat(op, ": path must be absolute, without \"..\"")));
  Describer describe;
  auto answer = [&](Result<json> r) {
    if (!r.ok()) return SendError(conn, r.status());
    return WriteFrame(conn, Frame::kOk, r->dump(-1, ' ', false, json::error_handler_t::replace));
  };
  if (op == "stat") {
    auto e = describe.Entry(path);
    return answer(e.ok() ? Result<json>(json{{"entry", *e}}) : Result<json>(e.status()));
  }
  if (op == "list") {
    const uint32_t depth = std::clamp<uint32_t>(req.value("depth", 1u), 1, kMaxListDepth);
    auto top = describe.Entry(path);
    if (!top.ok()) return answer(top.status());
    if ((*top)["type"] != "dir") return answer(Error(ENOTDIR, "list " + path + ": not a directory"));
    json entries = json::array();
    size_t bytes = 0;
    Status s = describe.List(path, depth, &entries, &bytes);
    return answer(s.ok() ? Result<json>(json{{"entries", entries}}) : Result<json>(s));
  }
  if (op == "mkdir") {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) return answer(Error(EEXIST, "mkdir " + path + ": exists"));
    // Made for a user ("user"): theirs, the parents it made too.
    Status s = agent::MakeDirsAs(path, req.value("user", ""));
    if (!s.ok()) return answer(s);
    auto e = describe.Entry(path);
    return answer(e.ok() ? Result<json>(json{{"entry", *e}}) : Result<json>(e.status()));
  }
  if (op == "move") {
    const std::string to = req.value("to", "");
    if (!Absolute(to)) return answer(Error(EINVAL, "move: the destination must be absolute, without \"..\""));
    Status s = agent::MakeDirsAs(Dirname(to), req.value("user", ""));
    if (s.ok() && ::rename(path.c_str(), to.c_str()) != 0) s = ErrnoError(errno, "move " + path + " to " + to);
    if (!s.ok()) return answer(s);
    auto e = describe.Entry(to);
    return answer(e.ok() ? Result<json>(json{{"entry", *e}}) : Result<json>(e.status()));
  }
  if (op == "remove") {
    if (path == "/") return answer(Error(EPERM, "remove /: refused"));
    Status s = RemoveTree(path);
    return answer(s.ok() ? Result<json>(json::object()) : Result<json>(s));
  }
  return answer(Error(EINVAL, "fs: unknown op " + Quote(op)));
}

}  // namespace strata::launcher
