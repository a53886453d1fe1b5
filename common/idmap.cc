// User namespaces for idmapped mounts.
#include "common/idmap.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "common/fs.h"
#include "common/strings.h"

namespace strata {

std::string IdMapping::ToString() const { return StrCat(container, ":", host, ":", size); }

Result<IdMapping> IdMapping::Parse(std::string_view text) {
  auto parts = Split(text, ':');
  IdMapping m;
  if (parts.size() != 3) return Error(EINVAL, StrCat("id mapping ", Quote(text), ": expected CONTAINER:HOST:SIZE"));
  try {
    size_t used;
    unsigned long v[3];
    for (int i = 0; i < 3; ++i) {
      v[i] = std::stoul(parts[static_cast<size_t>(i)], &used);
      if (used != parts[static_cast<size_t>(i)].size() || v[i] > 0xffffffffUL) throw std::invalid_argument("x");
    }
    m = {static_cast<uint32_t>(v[0]), static_cast<uint32_t>(v[1]), static_cast<uint32_t>(v[2])};
  } catch (const std::exception&) {
    return Error(EINVAL, StrCat("id mapping ", Quote(text), ": expected three numbers CONTAINER:HOST:SIZE"));
  }
  if (m.size == 0) return Error(EINVAL, StrCat("id mapping ", Quote(text), ": size is 0"));
  return m;
}

Result<UniqueFd> CreateUserNamespace(const IdMapping& mapping) {
  int up[2], down[2];  // child -> parent "unshared"; parent -> child "done" (EOF)
  if (::pipe2(up, O_CLOEXEC) != 0) return ErrnoError(errno, "pipe");
  UniqueFd up_r(up[0]), up_w(up[1]);
  if (::pipe2(down, O_CLOEXEC) != 0) return ErrnoError(errno, "pipe");
  UniqueFd down_r(down[0]), down_w(down[1]);
  // The child only unshares and waits: async-signal-safe calls only, so it
  // is safe to fork a multi-threaded daemon.
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoError(errno, "fork for a user namespace");
  if (pid == 0) {
    char c;
    if (::unshare(CLONE_NEWUSER) != 0) ::_exit(1);
    ssize_t w = ::write(up_w.get(), "u", 1);
    (void)w;
    ::close(down_w.get());
    ssize_t r = ::read(down_r.get(), &c, 1);  // EOF once the parent is done
    (void)r;
    ::_exit(0);
  }
  up_w.reset();
  down_r.reset();
  auto reap = [&] {
    down_w.reset();
    ::kill(pid, SIGKILL);
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  };
  char c;
  if (::read(up_r.get(), &c, 1) != 1) {
    reap();
    return Error(EPERM, "create a user namespace: the kernel refused unshare(CLONE_NEWUSER)");
  }
  const std::string map = StrCat(mapping.container, " ", mapping.host, " ", mapping.size, "\n");
  const std::string proc = StrCat("/proc/", pid);
  // /proc files are written in place (no rename).
  Status s;
  for (const char* file : {"/uid_map", "/gid_map"}) {
    auto fd = OpenFile(proc + file, O_WRONLY);
    if (!fd.ok()) {
      s = fd.status();
      break;
    }
    s = WriteFull(fd->get(), map);
    if (!s.ok()) {
      s = s.Annotate(StrCat("write ", proc, file));
      break;
    }
  }
  Result<UniqueFd> ns = s.ok() ? OpenFile(proc + "/ns/user", O_RDONLY) : Result<UniqueFd>(s);
  reap();
  if (!ns.ok()) return ns.status().Annotate(StrCat("create user namespace for ", mapping.ToString()));
  return std::move(*ns);
}

Result<MountPoint> IdmappedMount(const std::string& source, const std::string& target, int userns_fd) {
  int tree = static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, source.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  if (tree < 0) return ErrnoError(errno, StrCat("clone mount ", source));
  UniqueFd tree_fd(tree);
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_IDMAP;
  attr.userns_fd = static_cast<uint64_t>(userns_fd);
  if (::syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) {
    return ErrnoError(errno, StrCat("idmap mount of ", source));
  }
  STRATA_RETURN_IF_ERROR(MakeDirs(target));
  if (::syscall(SYS_move_mount, tree, "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    return ErrnoError(errno, StrCat("attach idmapped mount of ", source, " at ", target));
  }
  return MountPoint::Adopt(target);
}

}  // namespace strata
