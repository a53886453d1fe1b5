// Lock files that keep two daemons of one host off each other's settings.
#include "launcher/node/node_claims.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include <climits>
#include <set>

#include "common/fs.h"
#include "common/hash.h"
#include "common/strings.h"
#include "lazyfs/daemon.h"

namespace strata::launcher {

namespace {

// The path as the kernel would reach it: absolute, symbolic links of its
// existing part resolved (two spellings of one directory are one claim).
std::string Canonical(const std::string& path) {
  std::string abs = path;
  if (abs.empty() || abs[0] != '/') {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof cwd)) abs = JoinPath(cwd, path);
  }
  std::string head = abs, tail;
  while (!head.empty() && head != "/") {
    char buf[PATH_MAX];
    if (::realpath(head.c_str(), buf)) return tail.empty() ? std::string(buf) : JoinPath(buf, tail);
    const size_t slash = head.rfind('/');
    tail = tail.empty() ? head.substr(slash + 1) : JoinPath(head.substr(slash + 1), tail);
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
  return abs;
}

}  // namespace

Result<NodeClaims> NodeClaims::Take(const std::vector<Setting>& settings, const std::string& holder, const std::string& dir) {
  STRATA_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  NodeClaims claims;
  std::set<std::string> taken;  // (one daemon may give two settings one path)
  for (const auto& setting : settings) {
    const std::string value = setting.is_path ? Canonical(setting.value) : setting.value;
    // One file per kind and value: a name and a path never collide.
    const std::string kind = setting.is_path ? "path" : setting.what;
    const std::string file = JoinPath(dir, StrCat(HashBytes(StrCat(kind, "\n", value)).Hex(), ".lock"));
    if (!taken.insert(file).second) continue;
    UniqueFd fd(::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoError(errno, "claim " + setting.what + " " + value + ": open " + file);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) return ErrnoError(errno, "claim " + setting.what + " " + value + ": lock " + file);
      std::string who = ReadFileToString(file).value_or("");
      while (!who.empty() && who.back() == '\n') who.pop_back();
      return Error(EADDRINUSE, StrCat(setting.what, " ", Quote(value), " is in use by another launcher daemon on this host (",
                                      who.empty() ? "holder unknown" : who,
                                      "); every daemon needs its own (docs/operations.md, \"Several daemons on one host\")"));
    }
    const std::string text = StrCat(holder, "\n");
    if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      return ErrnoError(errno, "claim " + setting.what + ": write " + file);
    }
    claims.locks_.push_back(std::move(fd));
  }
  return claims;
}

Result<NodeClaims> ClaimDaemonSettings(const NodeConfig& node, const std::string& state_dir, const std::string& api_socket) {
  std::vector<NodeClaims::Setting> settings = {
      {"--state", state_dir},
      {"--socket", api_socket},
      {"STRATA_RUN_DIR", node.run_dir},
      {"STRATA_UPPERS", node.uppers},
      {"STRATA_LAZYFS_SOCKET", node.lazyfs_socket},
      {"STRATA_CACHE", node.cache_dir.empty() ? std::string(lazyfs::kDefaultCacheDir) : node.cache_dir},
      {"STRATA_CGROUP_PARENT", node.cgroup_parent, false},
  };
  if (!node.name.empty()) settings.push_back({"--node", node.name, false});
  return NodeClaims::Take(settings, StrCat("pid ", ::getpid(), ", --state ", state_dir));
}

}  // namespace strata::launcher
