// strata-jail: starts a hypervisor the way a jailer does (Firecracker's
// jailer is the model): in cgroups made for it, in new mount, pid, network,
// IPC and UTS namespaces, in a root that holds only what it needs, as its
// own unprivileged uid with no_new_privs. It stays as the waiter (outside
// the pid namespace) and exits with the hypervisor's status.
//   strata-jail --root DIR --uid N --gid N [--group N]... [--cgroup PROCS]...
//               [--bind SRC:DST]... [--dev NAME]... [--tmp DST]... -- PROGRAM ARG...
// Descriptors 3 and up pass through to PROGRAM unchanged. Static: it links
// nothing but libc and libstdc++.
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string root;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  std::vector<std::string> cgroups;
  std::vector<std::pair<std::string, std::string>> binds;  // read-only
  std::vector<std::string> devices;
  std::vector<std::string> tmps;  // small writable tmpfs mounts owned by uid
  std::vector<char*> argv;
};

[[noreturn]] void Die(const std::string& step) {
  std::fprintf(stderr, "strata-jail: %s: %s\n", step.c_str(), std::strerror(errno));
  std::_Exit(125);
}

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "strata-jail: %s\nusage: strata-jail --root DIR --uid N --gid N [--group N]... [--cgroup PROCS]... "
               "[--bind SRC:DST]... [--dev NAME]... [--tmp DST]... -- PROGRAM ARG...\n",
               why);
  std::_Exit(2);
}

unsigned long Number(const char* text) {
  char* end = nullptr;
  errno = 0;
  unsigned long v = std::strtoul(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') Usage("not a number");
  return v;
}

Options Parse(int argc, char** argv) {
  Options o;
  bool have_uid = false, have_gid = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) Usage(("missing value of " + a).c_str());
    const char* v = argv[++i];
    if (a == "--root") o.root = v;
    else if (a == "--uid") o.uid = static_cast<uid_t>(Number(v)), have_uid = true;
    else if (a == "--gid") o.gid = static_cast<gid_t>(Number(v)), have_gid = true;
    else if (a == "--group") o.groups.push_back(static_cast<gid_t>(Number(v)));
    else if (a == "--cgroup") o.cgroups.push_back(v);
    else if (a == "--dev") o.devices.push_back(v);
    else if (a == "--tmp") o.tmps.push_back(v);
    else if (a == "--bind") {
      std::string s = v;
      size_t colon = s.find(':');
      if (colon == std::string::npos || colon == 0 || s[colon + 1] != '/') Usage("--bind wants SRC:/DST");
      o.binds.push_back({s.substr(0, colon), s.substr(colon + 1)});
    } else {
      Usage(("unknown option " + a).c_str());
    }
  }
  if (o.root.empty() || o.root[0] != '/') Usage("--root wants an absolute directory");
  if (!have_uid || !have_gid || o.uid == 0 || o.gid == 0) Usage("--uid and --gid are required and not 0");
  if (i >= argc) Usage("no program after --");
  for (; i < argc; ++i) o.argv.push_back(argv[i]);
  o.argv.push_back(nullptr);
  return o;
}

void MakePath(const std::string& path, bool file) {
  for (size_t pos = 1; (pos = path.find('/', pos)) != std::string::npos; ++pos) {
    std::string dir = path.substr(0, pos);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) Die("mkdir " + dir);
  }
  if (file) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) Die("create " + path);
    ::close(fd);
  } else if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    Die("mkdir " + path);
  }
}

// A read-only bind of `source` at `target` (made to match: a file or a
// directory); `devices` keeps device nodes usable.
void BindReadOnly(const std::string& source, const std::string& target, bool devices) {
  struct stat st{};
  if (::stat(source.c_str(), &st) != 0) Die("bind " + source);
  MakePath(target, !S_ISDIR(st.st_mode));
  if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) Die("bind " + source);
  unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (devices ? 0 : MS_NODEV);
  if (::mount(nullptr, target.c_str(), nullptr, flags, nullptr) != 0) Die("make " + target + " read-only");
}

// The child: pid 1 of the new pid namespace. Builds the root and execs.
[[noreturn]] void Enter(const Options& o) {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) Die("make mounts private");
  const std::string& root = o.root;
  if (::mount("tmpfs", root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") != 0) Die("mount the root tmpfs");
  // The program and its libraries. Merged-/usr hosts have /lib* as
  // symbolic links into /usr; they are made the same here.
  BindReadOnly("/usr", root + "/usr", false);
  for (const char* dir : {"/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"}) {
    char target[4096];
    ssize_t n = ::readlink(dir, target, sizeof target - 1);
    if (n > 0) {
      target[n] = '\0';
      if (::symlink(target, (root + dir).c_str()) != 0) Die(std::string("symlink ") + dir);
    } else if (::access(dir, F_OK) == 0) {
      BindReadOnly(dir, root + dir, false);
    }
  }
  if (::access("/etc/ld.so.cache", R_OK) == 0) BindReadOnly("/etc/ld.so.cache", root + "/etc/ld.so.cache", false);
  for (const auto& [source, target] : o.binds) BindReadOnly(source, root + target, false);
  // /dev: only the nodes asked for.
  MakePath(root + "/dev", false);
  if (::mount("tmpfs", (root + "/dev").c_str(), "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755") != 0) Die("mount /dev");
  for (const char* name : {"null", "zero", "urandom", "random"}) BindReadOnly(std::string("/dev/") + name, root + "/dev/" + name, true);
  for (const auto& name : o.devices) {
    const std::string source = "/dev/" + name;
    struct stat st{};
    if (::stat(source.c_str(), &st) != 0) Die("device " + source);
    MakePath(root + source, true);
    if (::mount(source.c_str(), (root + source).c_str(), nullptr, MS_BIND, nullptr) != 0) Die("bind " + source);
  }
  for (const auto& dir : o.tmps) {
    MakePath(root + dir, false);
    if (::mount("tmpfs", (root + dir).c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4m,mode=0700") != 0) {
      Die("mount tmpfs " + dir);
    }
    if (::chown((root + dir).c_str(), o.uid, o.gid) != 0) Die("chown " + dir);
  }
  MakePath(root + "/proc", false);
  if (::mount("proc", (root + "/proc").c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) Die("mount /proc");
  if (::chdir(root.c_str()) != 0) Die("chdir " + root);
  if (::syscall(SYS_pivot_root, ".", ".") != 0) Die("pivot_root");
  if (::umount2(".", MNT_DETACH) != 0) Die("detach the old root");
  if (::chdir("/") != 0) Die("chdir /");
  if (::mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
    Die("make the root read-only");
  }
  ::sethostname("strata-vm", 9);
  if (::setgroups(o.groups.size(), o.groups.data()) != 0) Die("setgroups");
  if (::setresgid(o.gid, o.gid, o.gid) != 0) Die("setresgid");
  if (::setresuid(o.uid, o.uid, o.uid) != 0) Die("setresuid");
  // The hypervisor dies with its waiter, so killing the waiter ends both.
  // (After the uid change: a change of credentials clears it.)
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) Die("set the parent-death signal");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) Die("set no_new_privs");
  ::execv(o.argv[0], o.argv.data());
  Die(std::string("exec ") + o.argv[0]);
}

pid_t child = -1;

void Forward(int sig) {
  if (child > 0) ::kill(child, sig);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = Parse(argc, argv);
  if (::getuid() != 0) {
    std::fprintf(stderr, "strata-jail: must run as root (it makes namespaces and drops to --uid)\n");
    return 2;
  }
  for (const auto& procs : o.cgroups) {
    int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) Die("open " + procs);
    std::string pid = std::to_string(::getpid());
    if (::write(fd, pid.data(), pid.size()) < 0) Die("join cgroup " + procs);
    ::close(fd);
  }
  if (::unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0) Die("unshare namespaces");
  // The handlers before the fork (the child execs, which resets them), so
  // a signal in between is forwarded too.
  struct sigaction sa{};
  sa.sa_handler = Forward;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  child = ::fork();
  if (child < 0) Die("fork");
  if (child == 0) Enter(o);
  // The waiter holds nothing of the guest's.
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) Die("wait");
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}
