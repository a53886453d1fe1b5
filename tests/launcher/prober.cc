// strata-test-prober: a static helper the file-rule tests copy into a
// sandbox to try the routes to a hidden file that a shell cannot take.
//   hold SOCK PATH...   open each PATH (O_PATH and O_RDONLY), then hand
//                       the descriptors to whoever connects to SOCK
//   fetch SOCK NAME     take the descriptors from SOCK and try NAME
//                       beneath each (openat, openat2), and list each
//   openat2 DIR NAME    open NAME beneath DIR with openat2's resolve flags
//   syscalls            try the system calls a command's seccomp profile
//                       refuses (and two it allows), natively and through
//                       the 32-bit entry
// Prints one line per attempt: "ok CONTENT" or "err ERRNO-NAME".
#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  if (n < 0) return "err " + std::string(strerrorname_np(errno));
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return "ok " + out;
}

void Report(const std::string& what, int fd) {
  if (fd < 0) {
    std::printf("%s: err %s\n", what.c_str(), strerrorname_np(errno));
    return;
  }
  std::printf("%s: %s\n", what.c_str(), ReadAll(fd).c_str());
  ::close(fd);
}

void List(const std::string& what, int dirfd) {
  int copy = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY);
  DIR* d = copy >= 0 ? ::fdopendir(copy) : nullptr;
  if (!d) {
    std::printf("%s: err %s\n", what.c_str(), strerrorname_np(errno));
    return;
  }
  std::string names;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names += std::string(" ") + e->d_name;
  }
  ::closedir(d);
  std::printf("%s: ok%s\n", what.c_str(), names.c_str());
}

void TryOpenat2(const std::string& what, int dirfd, const char* name) {
  const struct {
    const char* label;
    uint64_t resolve;
  } flags[] = {{"plain", 0}, {"beneath", RESOLVE_BENEATH}, {"in_root", RESOLVE_IN_ROOT}, {"no_xdev", RESOLVE_NO_XDEV},
               {"no_magiclinks", RESOLVE_NO_MAGICLINKS}};
  for (const auto& f : flags) {
    open_how how{};
    how.flags = O_RDONLY;
    how.resolve = f.resolve;
    int fd = static_cast<int>(::syscall(SYS_openat2, dirfd, name, &how, sizeof how));
    Report(what + " openat2 " + f.label, fd);
  }
}

sockaddr_un Address(const char* path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  return a;
}

int Hold(const char* sock, const std::vector<const char*>& paths) {
  std::vector<int> fds;
  for (const char* p : paths) {
    fds.push_back(::open(p, O_PATH));
    fds.push_back(::open(p, O_RDONLY));
  }
  int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a = Address(sock);
  ::unlink(sock);
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 8) != 0) {
    std::perror("hold: listen");
    return 1;
  }
  std::printf("holding\n");
  std::fflush(stdout);
  while (true) {
    int c = ::accept(s, nullptr, nullptr);
    if (c < 0) continue;
    std::vector<int> open_fds;
    for (int fd : fds) {
      if (fd >= 0) open_fds.push_back(fd);
    }
    std::vector<char> control(CMSG_SPACE(sizeof(int) * open_fds.size()));
    char byte = static_cast<char>(open_fds.size());
    iovec iov{&byte, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!open_fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int) * open_fds.size());
      std::memcpy(CMSG_DATA(cm), open_fds.data(), sizeof(int) * open_fds.size());
    }
    ::sendmsg(c, &msg, 0);
    ::close(c);
  }
}

int Fetch(const char* sock, const char* name) {
  int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a = Address(sock);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::printf("connect: err %s\n", strerrorname_np(errno));
    return 1;
  }
  char byte = 0;
  iovec iov{&byte, 1};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * 64));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  if (::recvmsg(s, &msg, 0) <= 0) {
    std::printf("recvmsg: err %s\n", strerrorname_np(errno));
    return 1;
  }
  std::vector<int> fds;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    fds.resize(n);
    std::memcpy(fds.data(), CMSG_DATA(cm), n * sizeof(int));
  }
  std::printf("received %zu\n", fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    const std::string what = "fd" + std::to_string(i);
    List(what + " list", fds[i]);
    Report(what + " openat", ::openat(fds[i], name, O_RDONLY));
    TryOpenat2(what, fds[i], name);
  }
  return 0;
}

// Each call with arguments the kernel refuses (EFAULT, EINVAL) before it
// checks capabilities: EPERM then comes from a seccomp program, not from a
// missing capability.
int Syscalls() {
  auto report = [](const char* what, long rc) {
    if (rc < 0) std::printf("%s: err %s\n", what, strerrorname_np(errno));
    else std::printf("%s: ok\n", what);
    std::fflush(stdout);
  };
  const auto bad = reinterpret_cast<const char*>(1);
  report("getpid", ::syscall(SYS_getpid));
  report("mount", ::syscall(SYS_mount, "none", "/tmp", bad, 0L, nullptr));
  report("umount2", ::syscall(SYS_umount2, "/proc", 0x40000000L));
  report("mount_setattr", ::syscall(SYS_mount_setattr, -1, "", 0x40000000L, nullptr, 0L));
  report("unshare", ::syscall(SYS_unshare, 0x1L));
  report("keyctl", ::syscall(SYS_keyctl, 9999L, 0L, 0L, 0L, 0L));
  report("bpf", ::syscall(SYS_bpf, 9999L, nullptr, 0L));
  report("clone3", ::syscall(SYS_clone3, nullptr, 0L));
  // A new user namespace by clone: the child (if it were made) exits.
  long child = ::syscall(SYS_clone, static_cast<long>(CLONE_NEWUSER | SIGCHLD), 0L, nullptr, nullptr, 0L);
  if (child == 0) ::_exit(0);
  report("clone_newuser", child);
  long plain = ::syscall(SYS_clone, static_cast<long>(SIGCHLD), 0L, nullptr, nullptr, 0L);
  if (plain == 0) ::_exit(0);
  report("clone", plain);
  // mount (21) and unshare (310) of the 32-bit entry (an address below
  // 4 GiB for mount's type).
  auto int80 = [](long nr, long a, long b, long c) {
    long rc;
    asm volatile("int $0x80" : "=a"(rc) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
    if (rc < 0 && rc > -4096) {
      errno = static_cast<int>(-rc);
      return -1L;
    }
    return rc;
  };
  // A kernel without the 32-bit entry (a guest's, say) answers int 0x80
  // with SIGSEGV: tried in a child first.
  pid_t probe = ::fork();
  if (probe == 0) {
    int80(20, 0, 0, 0);  // getpid
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(probe, &status, 0);
  if (!WIFEXITED(status)) {
    std::printf("mount32: no 32-bit entry\nunshare32: no 32-bit entry\n");
    return 0;
  }
  report("mount32", int80(21, 0, 0, 1));
  report("unshare32", int80(310, 0x1, 0, 0));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string verb = argc > 1 ? argv[1] : "";
  if (verb == "hold" && argc >= 4) return Hold(argv[2], std::vector<const char*>(argv + 3, argv + argc));
  if (verb == "fetch" && argc == 4) return Fetch(argv[2], argv[3]);
  if (verb == "openat2" && argc == 4) {
    int dir = ::open(argv[2], O_PATH | O_DIRECTORY);
    if (dir < 0) {
      std::printf("open %s: err %s\n", argv[2], strerrorname_np(errno));
      return 1;
    }
    TryOpenat2(argv[2], dir, argv[3]);
    return 0;
  }
  if (verb == "syscalls") return Syscalls();
  std::fprintf(stderr, "usage: strata-test-prober hold SOCK PATH... | fetch SOCK NAME | openat2 DIR NAME | syscalls\n");
  return 2;
}
