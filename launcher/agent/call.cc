// The agent's commands: an exec's process forked into its isolation (a
// function call's own namespaces, file rules, seccomp, privileges), its
// output pumped to the caller, its leftovers killed.
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <cstring>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/request.h"
#include "launcher/protocol/file_rules.h"
#include "launcher/protocol/layout.h"
#include "launcher/protocol/protocol.h"

namespace strata::launcher {

using nlohmann::json;
using agent::ParseJson;
using agent::SendError;

namespace {

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// ---- Function calls: everything below runs in a forked child of a
// multi-threaded process, so it keeps to async-signal-safe calls.

// One mount that puts a file rule in force in a command's own mount
// namespace (planned by the agent before the fork, made by the child).
struct RuleMount {
  enum Kind {
    kPin,       // an ancestor of a protected path, bound onto itself: a mount point cannot be renamed or removed
    kReadOnly,  // bound onto itself, then read-only with everything under it
    kDenyDir,   // an empty read-only tmpfs over it
    kDenyFile,  // /dev/null over it, on a mount without devices: every open fails
  } kind;
  std::string path;  // resolved in the agent's namespace
};

struct CallSpec {
  char** argv;
  char** envp;
  const char* cwd;
  int error_fd;         // the errno of a failed step goes here
  bool new_network;
  const std::string* seccomp;  // raw BPF
  const std::vector<RuleMount>* rules;  // empty: none
};

// What failed before a command could run, reported on the error pipe so
// the launcher's message names the step, not just an errno.
enum class StartStep : int { kExec, kChdir, kNamespaces, kMounts, kLoopback, kPrivileges, kFork, kRules, kLandlock, kCgroup, kUser, kTerminal,
                             kStarted /* not a failure: a shepherd's command runs, `err` is its pid */ };
struct StartFailure {
  StartStep step;
  int err;
  int rule = -1;  // kRules: which RuleMount
};

const char* StepName(StartStep step) {
  switch (step) {
    case StartStep::kExec: return "exec";
    case StartStep::kChdir: return "enter the working directory";
    case StartStep::kNamespaces: return "call: new namespaces";
    case StartStep::kMounts: return "call: mount /proc, /tmp and /dev/shm";
    case StartStep::kLoopback: return "call: bring loopback up";
    case StartStep::kPrivileges: return "call: drop privileges and load seccomp";
    case StartStep::kFork: return "call: fork";
    case StartStep::kRules: return "file rules";
    case StartStep::kLandlock: return "file rules: enter a Landlock domain";
    case StartStep::kCgroup: return "join the commands' cgroup";
    case StartStep::kUser: return "become the user";
    case StartStep::kTerminal: return "pty: take the terminal";
    case StartStep::kStarted: return "started";
  }
  return "start";
}

[[noreturn]] void FailStart(int error_fd, StartStep step, int e, int rule = -1) {
  StartFailure f{step, e, rule};
  ssize_t w = ::write(error_fd, &f, sizeof f);
  (void)w;
  ::_exit(127);
}

// The call's own /proc (masked as the container's would be), /tmp and
// /dev/shm, in its own mount namespace.
int SetUpCallMounts() {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return errno;
  if (::mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) return errno;
  struct stat st;
  if (::stat("/dev/shm", &st) == 0 && ::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777") != 0) {
    return errno;
  }
  if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) return errno;
  for (const char* p : kMaskedPaths) {
    if (::stat(p, &st) != 0) continue;
    int rc = S_ISDIR(st.st_mode) ? ::mount("tmpfs", p, "tmpfs", MS_RDONLY, "size=0")
                                 : ::mount("/dev/null", p, nullptr, MS_BIND, nullptr);
    if (rc != 0) return errno;
  }
  for (const char* p : kReadonlyPaths) {
    if (::stat(p, &st) != 0) continue;
    if (::mount(p, p, nullptr, MS_BIND | MS_REC, nullptr) != 0) return errno;
    if (::mount(nullptr, p, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) return errno;
  }
  return 0;
}

int LoopbackUp() {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, "lo", 3);
  int e = 0;
  if (::ioctl(fd, SIOCGIFFLAGS, &ifr) != 0) e = errno;
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  if (!e && ::ioctl(fd, SIOCSIFFLAGS, &ifr) != 0) e = errno;
  ::close(fd);
  return e;
}

int SetReadOnly(const char* path, uint64_t extra) {
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY | extra;
  return ::mount_setattr(AT_FDCWD, path, AT_RECURSIVE, &attr, sizeof attr) == 0 ? 0 : errno;
}

// Makes the rule mounts, in order, in the calling process's mount
// namespace (already its own); on failure `*failed` is the rule's index.
int MakeRuleMounts(const std::vector<RuleMount>& rules, int* failed) {
  for (size_t i = 0; i < rules.size(); ++i) {
    const char* p = rules[i].path.c_str();
    *failed = static_cast<int>(i);
    int rc = 0;
    switch (rules[i].kind) {
      case RuleMount::kPin:
        rc = ::mount(p, p, nullptr, MS_BIND | MS_REC, nullptr) == 0 ? 0 : errno;
        break;
      case RuleMount::kReadOnly:
        rc = ::mount(p, p, nullptr, MS_BIND | MS_REC, nullptr) == 0 ? SetReadOnly(p, 0) : errno;
        break;
      case RuleMount::kDenyDir:
        rc = ::mount("tmpfs", p, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=1,mode=0") == 0 ? 0 : errno;
        break;
      case RuleMount::kDenyFile:
        rc = ::mount("/dev/null", p, nullptr, MS_BIND, nullptr) == 0
                 ? SetReadOnly(p, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC | MOUNT_ATTR_NOSUID)
                 : errno;
        break;
    }
    if (rc) return rc;
  }
  return 0;
}

// A Landlock domain of the command's own: the kernel then refuses it (and
// everything it starts) ptrace-level access to any process outside it:
// /proc/PID/{root,cwd,fd,mem,environ,map_files}, ptrace, pidfd_getfd,
// process_vm_readv. That closes the routes to the agent's and the
// grader's view of the files. Its only file restriction (no block device
// may be made) is one the user namespace already enforces.
int EnterLandlockDomain() {
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = LANDLOCK_ACCESS_FS_MAKE_BLOCK;
  int fd = static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  if (fd < 0) return errno;
  int rc = ::syscall(SYS_landlock_restrict_self, fd, 0) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

// What a command may hold: a container's usual capabilities
// (launcher/container/oci_config.cc), without the two the agent holds to
// build its namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN) and without
// CAP_MKNOD. In a container the user namespace already makes those three
// harmless or absent; in a microVM the agent is the guest's real root, and
// they, CAP_SYS_PTRACE (its /proc/1/root) and the rest would undo file rules.
constexpr int kCommandCapabilities[] = {CAP_CHOWN,   CAP_DAC_OVERRIDE, CAP_FSETID,           CAP_FOWNER,     CAP_NET_RAW,
                                        CAP_SETGID,  CAP_SETUID,       CAP_SETFCAP,          CAP_SETPCAP,    CAP_NET_BIND_SERVICE,
                                        CAP_SYS_CHROOT, CAP_KILL,      CAP_AUDIT_WRITE};

// The command keeps only kCommandCapabilities and runs under the default
// seccomp profile.
int DropCallPrivileges(const std::string& seccomp) {
  uint64_t keep = 0;
  for (int cap : kCommandCapabilities) keep |= uint64_t{1} << cap;
  for (int cap = 0; cap < 64; ++cap) {
    if (keep & (uint64_t{1} << cap)) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      return errno;
    }
  }
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2];
  if (::syscall(SYS_capget, &header, data) != 0) return errno;
  for (int half = 0; half < 2; ++half) {
    const uint32_t mask = static_cast<uint32_t>(keep >> (32 * half));
    data[half].effective &= mask;
    data[half].permitted &= mask;
    data[half].inheritable &= mask;
  }
  if (::syscall(SYS_capset, &header, data) != 0) return errno;
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) return errno;
  sock_fprog prog{static_cast<unsigned short>(seccomp.size() / sizeof(sock_filter)),
                  reinterpret_cast<sock_filter*>(const_cast<char*>(seccomp.data()))};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) return errno;
  return 0;
}

// PID 1 of the call: prepares the namespaces, runs the command as its
// child, reaps whatever else the command leaves, and reports the command's
// wait status on `status_fd`. When it exits the kernel kills everything
// left in the call's PID namespace.
[[noreturn]] void CallInit(const CallSpec& c, int status_fd) {
  if (int e = SetUpCallMounts()) FailStart(c.error_fd, StartStep::kMounts, e);
  int failed = -1;
  if (int e = MakeRuleMounts(*c.rules, &failed)) FailStart(c.error_fd, StartStep::kRules, e, failed);
  if (int e = c.new_network ? LoopbackUp() : 0) FailStart(c.error_fd, StartStep::kLoopback, e);
  pid_t cmd = ::fork();
  if (cmd < 0) FailStart(c.error_fd, StartStep::kFork, errno);
  if (cmd == 0) {
    ::close(status_fd);
    if (int e = DropCallPrivileges(*c.seccomp)) FailStart(c.error_fd, StartStep::kPrivileges, e);
    if (int e = c.rules->empty() ? 0 : EnterLandlockDomain()) FailStart(c.error_fd, StartStep::kLandlock, e);
    if (::chdir(c.cwd) != 0) FailStart(c.error_fd, StartStep::kChdir, errno);
    ::environ = c.envp;
    ::execvp(c.argv[0], c.argv);
    FailStart(c.error_fd, StartStep::kExec, errno);
  }
  ::close(c.error_fd);
  for (int fd = 0; fd <= 2; ++fd) ::close(fd);  // the pipes end with the command's tree
  while (true) {
    int status = 0;
    pid_t p = ::waitpid(-1, &status, 0);
    if (p == cmd) {
      ssize_t w = ::write(status_fd, &status, sizeof status);
      (void)w;
      ::_exit(0);
    }
    if (p < 0 && errno != EINTR) ::_exit(0);
  }
}

// Ends this process the way `status` (a wait status) says: the same exit
// code, or the same signal (no core dump).
[[noreturn]] void ExitAs(int status) {
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  const int sig = WTERMSIG(status);
  ::signal(sig, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  ::sigprocmask(SIG_UNBLOCK, &only, nullptr);
  ::kill(::getpid(), sig);
  ::_exit(128 + sig);
}

// Closes every descriptor from 3 up but those in `keep` (sorted).
void CloseAllBut(const std::vector<int>& keep) {
  unsigned int from = 3;
  for (int k : keep) {
    const auto fd = static_cast<unsigned int>(k);
    if (fd > from) ::syscall(SYS_close_range, from, fd - 1, 0);
    if (fd + 1 > from) from = fd + 1;
  }
  ::syscall(SYS_close_range, from, ~0U, 0);
}

// The agent's child for a call: new namespaces, then the call's init; ends
// the way the command ended, so the agent sees its exit code or signal.
[[noreturn]] void RunCall(const CallSpec& c) {
  int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (c.new_network ? CLONE_NEWNET : 0);
  if (::unshare(flags) != 0) FailStart(c.error_fd, StartStep::kNamespaces, errno);
  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) FailStart(c.error_fd, StartStep::kFork, errno);
  pid_t init = ::fork();
  if (init < 0) FailStart(c.error_fd, StartStep::kFork, errno);
  if (init == 0) {
    ::close(status_pipe[0]);
    CallInit(c, status_pipe[1]);
  }
  ::close(status_pipe[1]);
  ::close(c.error_fd);
  int init_status = 0;
  while (::waitpid(init, &init_status, 0) < 0 && errno == EINTR) {
  }
  int status = 0;
  if (::read(status_pipe[0], &status, sizeof status) != sizeof status) status = init_status;  // init itself was killed
  ExitAs(status);
}

// Kills every process below this one (a subreaper: orphans of the killed
// come to it, so it sees the whole tree) and reaps them, until none is left.
void KillDescendants() {
  char path[64] = "/proc/self/task/";
  char digits[16];
  int n = 0;
  for (long tid = ::syscall(SYS_gettid); tid > 0; tid /= 10) digits[n++] = static_cast<char>('0' + tid % 10);
  size_t len = std::strlen(path);
  while (n > 0) path[len++] = digits[--n];
  std::memcpy(path + len, "/children", 10);
  for (int round = 0; round < 20000; ++round) {  // (20 s at most, for processes stuck in the kernel)
    char buf[4096];
    ssize_t got = 0;
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // (no /proc in the sandbox: nothing to find them by)
    got = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    pid_t pid = 0;
    for (ssize_t i = 0; i < std::max<ssize_t>(got, 0); ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
      } else if (pid > 0) {
        ::kill(pid, SIGKILL);
        pid = 0;
      }
    }
    if (pid > 0 && got < static_cast<ssize_t>(sizeof buf - 1)) ::kill(pid, SIGKILL);  // (a cut one waits for the next round)
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD) return;
    timespec pause{0, 1000000};
    ::nanosleep(&pause, nullptr);
  }
}

// A command with "kill_leftovers": this process stays as its parent and a
// subreaper, so everything the command starts, also what leaves its session
// (setsid, a daemon's double fork), stays below it; when the command ends
// it kills all of that and exits the way the command did. The command
// runs in a process group of its own, which the agent signals (timeouts,
// signal requests), so this process outlives a group SIGKILL to clean up.
//
// The shepherd itself stays in the sandbox's cgroup (its reserve: a fork
// bomb in the commands' cgroup does not stop it forking), outside the
// command's Landlock domain, and not dumpable: the command can neither
// read its memory or descriptors nor ptrace it. It can still signal it;
// a stopped shepherd is continued at a timeout, a killed one lets what
// left the session go (docs/protocol.md).
[[noreturn]] void Shepherd(char** argv, char** envp, int error_fd, const std::vector<int>& cgroups, bool landlock) {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::prctl(PR_SET_DUMPABLE, 0);
  // The command waits until its pid is reported: once it runs, it may
  // stop this process (kill -STOP $PPID), and the agent, waiting for the
  // report, would wait for ever. Its own failures to start go on the
  // error pipe after the report; the pipe ends at its exec.
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) FailStart(error_fd, StartStep::kFork, errno);
  pid_t cmd = ::fork();
  if (cmd < 0) FailStart(error_fd, StartStep::kFork, errno);
  if (cmd == 0) {
    ::close(go[1]);
    char b;
    while (::read(go[0], &b, 1) < 0 && errno == EINTR) {
    }
    ::close(go[0]);
    ::setpgid(0, 0);
    for (int fd : cgroups) {
      if (::write(fd, "0", 1) != 1) FailStart(error_fd, StartStep::kCgroup, errno);
    }
    if (int e = landlock ? EnterLandlockDomain() : 0) FailStart(error_fd, StartStep::kLandlock, e);
    ::environ = envp;
    ::execvp(argv[0], argv);
    FailStart(error_fd, StartStep::kExec, errno);
  }
  ::close(go[0]);
  for (int fd : cgroups) ::close(fd);
  StartFailure started{StartStep::kStarted, cmd, -1};
  ssize_t w = ::write(error_fd, &started, sizeof started);
  (void)w;
  ::close(error_fd);
  ::close(go[1]);
  for (int fd = 0; fd <= 2; ++fd) ::close(fd);  // the pipes end with the command's tree
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP && s != SIGCHLD) ::signal(s, SIG_IGN);  // (a kill -TERM -1 from inside)
  }
  int status = 0;
  while (::waitpid(cmd, &status, 0) < 0 && errno == EINTR) {
  }
  KillDescendants();
  ExitAs(status);
}

// Resolves `rules` in the agent's namespace into the mounts that put them
// in force, shallowest first. A deny path that does not exist yet is made
// (an empty directory, mode 0700), so that nothing can be put there later
// behind the rule's back; a read-only path must exist. Every ancestor of a
// protected path (but /) is pinned: a command cannot rename /opt away and
// put an /opt/harness of its own in its place.
Result<std::vector<RuleMount>> PlanRuleMounts(const FileRules& rules) {
  auto resolve = [](const std::string& path, const std::string& what) -> Result<std::string> {
    char buf[PATH_MAX];
    if (!::realpath(path.c_str(), buf)) return ErrnoError(errno, StrCat("exec: files.", what, ": ", path));
    return std::string(buf);
  };
  std::vector<RuleMount> protect;
  for (const std::string& d : rules.deny) {
    struct stat st;
    if (::lstat(d.c_str(), &st) != 0) {
      if (errno != ENOENT) return ErrnoError(errno, "exec: files.deny: " + d);
      STRATA_RETURN_IF_ERROR(MakeDirs(d, 0700).Annotate("exec: files.deny: make " + d));
    }
    STRATA_ASSIGN_OR_RETURN(std::string real, resolve(d, "deny"));
    // (A link on the way could be pointed elsewhere by a command, and the
    // caller's later copies and the grader would follow it.)
    if (real != d) return Error(EINVAL, StrCat("exec: files.deny: ", d, " leads through a symbolic link to ", real, "; name that"));
    if (::stat(real.c_str(), &st) != 0) return ErrnoError(errno, "exec: files.deny: " + d);
    protect.push_back({S_ISDIR(st.st_mode) ? RuleMount::kDenyDir : RuleMount::kDenyFile, real});
  }
  for (const std::string& r : rules.read_only) {
    STRATA_ASSIGN_OR_RETURN(std::string real, resolve(r, "read_only"));
    if (real != r) return Error(EINVAL, StrCat("exec: files.read_only: ", r, " leads through a symbolic link to ", real, "; name that"));
    protect.push_back({RuleMount::kReadOnly, real});
  }
  // (The rules come minimal, and no link changed a path: no protected
  // path lies under a denied one.) An ancestor is pinned unless it is
  // protected itself or lies under a read-only path (nothing moves there).
  auto under = [&](const std::string& path) {
    return std::any_of(protect.begin(), protect.end(), [&](const RuleMount& m) { return PathUnder(path, m.path); });
  };
  std::vector<RuleMount> plan = protect;
  std::vector<std::string> pins;
  for (const RuleMount& m : plan) {
    for (size_t slash = m.path.find('/', 1); slash != std::string::npos; slash = m.path.find('/', slash + 1)) {
      std::string ancestor = m.path.substr(0, slash);
      if (!under(ancestor)) pins.push_back(ancestor);
    }
  }
  std::sort(pins.begin(), pins.end());
  pins.erase(std::unique(pins.begin(), pins.end()), pins.end());
  for (auto& p : pins) plan.push_back({RuleMount::kPin, std::move(p)});
  auto depth = [](const std::string& p) { return std::count(p.begin(), p.end(), '/'); };
  std::stable_sort(plan.begin(), plan.end(), [&](const RuleMount& a, const RuleMount& b) {
    return depth(a.path) != depth(b.path) ? depth(a.path) < depth(b.path) : a.path < b.path;
  });
  if (std::any_of(plan.begin(), plan.end(), [](const RuleMount& m) { return m.kind == RuleMount::kDenyFile; }) &&
      ::access("/dev/null", F_OK) != 0) {
    return Error(ENOENT, "exec: files.deny: a denied file is hidden behind /dev/null, and the sandbox has none");
  }
  return plan;
}

const char* RuleKindName(RuleMount::Kind kind) {
  switch (kind) {
    case RuleMount::kPin: return "pin the parent directory";
    case RuleMount::kReadOnly: return "make read-only";
    case RuleMount::kDenyDir: return "hide the directory";
    case RuleMount::kDenyFile: return "hide the file";
  }
  return "mount";
}

// Whether this kernel has Landlock (the agent answers once).
bool HaveLandlock() {
  static const bool have = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION) >= 1;
  return have;
}

}  // namespace

const std::string* Agent::CallSeccomp() {
  std::lock_guard lock(mu_);
  if (call_seccomp_.empty()) {
    auto bpf = ReadFileToString(std::string(kAgentSocketDir) + "/" + kCommandSeccompName);
    if (!bpf.ok() || bpf->empty() || bpf->size() % sizeof(sock_filter) != 0) return nullptr;
    call_seccomp_ = std::move(*bpf);
  }
  return &call_seccomp_;
}

namespace agent {

Result<struct winsize> TerminalSize(const json& size) {
  struct winsize ws {};
  if (!size.is_object()) return Error(EINVAL, "a terminal's size must be {\"cols\": N, \"rows\": N}");
  const json cols = size.value("cols", json(80)), rows = size.value("rows", json(24));
  if (!cols.is_number_unsigned() || !rows.is_number_unsigned()) return Error(EINVAL, "a terminal's cols and rows must be whole numbers");
  ws.ws_col = static_cast<unsigned short>(std::clamp<uint64_t>(cols.get<uint64_t>(), 1, 10000));
  ws.ws_row = static_cast<unsigned short>(std::clamp<uint64_t>(rows.get<uint64_t>(), 1, 10000));
  return ws;
}

}  // namespace agent

Result<Agent::Started> Agent::Start(const json& req, bool want_stdin) {
  std::vector<std::string> argv, env;
  try {
    argv = req.at("argv").get<std::vector<std::string>>();
    if (req.contains("env")) env = req["env"].get<std::vector<std::string>>();
  } catch (const json::exception&) {
    return Error(EINVAL, "exec: argv and env must be arrays of strings");
  }
  if (argv.empty()) return Error(EINVAL, "exec: empty argv");
  std::string cwd = req.value("cwd", "");
  if (cwd.empty()) cwd = "/";
  Started started;
  started.timeout_ms = req.value("timeout_ms", int64_t{0});
  started.caps[0] = req.value("stdout_cap", uint64_t{1} << 20);
  started.caps[1] = req.value("stderr_cap", uint64_t{1} << 20);
  started.kill_leftovers = req.value("kill_leftovers", false);
  started.argv0 = argv[0];
  const bool isolate = req.value("isolate", false);
  const bool isolate_network = req.value("isolate_network", true);
  // The grader's exec stays in the sandbox's cgroup, in the reserve no
  // command can take.
  const std::vector<int> no_cgroups;
  const std::vector<int>& cgroups = req.value("grader", false) ? no_cgroups : command_cgroups_;
  FileRules rules;
  if (req.contains("files")) {
    STRATA_ASSIGN_OR_RETURN(rules, ParseFileRules(req["files"], "exec: files"));
  }
  std::vector<RuleMount> rule_mounts;
  if (!rules.empty()) {
    if (!HaveLandlock()) return Error(ENOSYS, "exec: files: this kernel has no Landlock, which file rules need");
    if (!CallSeccomp()) {
      return Error(ENOENT, "exec: files: no command seccomp program in " + std::string(kAgentSocketDir) +
                               " (without it a command could undo the rules)");
    }
    STRATA_ASSIGN_OR_RETURN(rule_mounts, PlanRuleMounts(rules));
  }
  // Every command runs without the agent's CAP_SYS_ADMIN and under the
  // default seccomp profile (in a container the launcher always writes it).
  const std::string* call_seccomp = CallSeccomp();
  if (isolate) {
    if (!call_seccomp) return Error(ENOENT, "call: no seccomp program in " + std::string(kAgentSocketDir));
    for (const char* dir : {"/tmp", "/proc"}) {
      if (::access(dir, F_OK) != 0) return Error(ENOENT, std::string("call: the image has no ") + dir + " to mount the call's own on");
    }
  }
  // "user": a name of the sandbox's /etc/passwd the command runs as
  // (with its HOME, USER and LOGNAME unless env has them); else the
  // agent's root, as also for a "user_optional" name the image lacks. A
  // cwd "~" is the home of whoever it runs as.
  std::optional<std::pair<uid_t, gid_t>> as;
  std::string home = "/root";
  if (const std::string user = req.value("user", ""); !user.empty()) {
    if (isolate) return Error(ENOTSUP, "exec: user: a function call runs as its pool's root");
    auto found = agent::LookupUser(user);
    if (found.ok()) {
      as = {found->uid, found->gid};
      home = found->home;
    } else if (!req.value("user_optional", false)) {
      return found.status().Annotate("exec");
    }
    const std::string name = as ? user : "root";
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"HOME", home}, {"USER", name}, {"LOGNAME", name}}) {
      bool given = false;
      for (const auto& e : env) given |= e.starts_with(key + "=");
      if (!given) env.push_back(key + "=" + value);
    }
  }
  if (cwd == "~") cwd = ::access(home.c_str(), X_OK) == 0 ? home : "/";
  bool has_path = false;
  for (const auto& e : env) has_path |= e.starts_with("PATH=");
  if (!has_path) env.push_back(std::string("PATH=") + kDefaultPath);

  int out[2], err[2], in[2];
  if (::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC) || ::pipe2(in, O_CLOEXEC)) return ErrnoError(errno, "exec: pipe");
  UniqueFd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]), in_r(in[0]), in_w(in[1]);
  // "pty": {"cols", "rows"}: the command's stdin, stdout and stderr are a
  // new terminal's, which is its controlling one; its output is the
  // terminal's (stdout), its input and size go to the terminal.
  UniqueFd pty_master;
  if (req.contains("pty")) {
    if (isolate) return Error(ENOTSUP, "exec: pty: a function call has no terminal");
    if (started.kill_leftovers) return Error(ENOTSUP, "exec: pty: kill_leftovers moves the command out of the terminal's session");
    auto pty_size = agent::TerminalSize(req["pty"]);
    if (!pty_size.ok()) return pty_size.status().Annotate("exec: pty");
    struct winsize size = *pty_size;
    pty_master.reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!pty_master) return ErrnoError(errno, "exec: pty: open /dev/ptmx");
    char name[64];
    if (::grantpt(pty_master.get()) != 0 || ::unlockpt(pty_master.get()) != 0 || ::ptsname_r(pty_master.get(), name, sizeof name) != 0) {
      return ErrnoError(errno, "exec: pty: unlock its terminal");
    }
    UniqueFd terminal(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!terminal) return ErrnoError(errno, StrCat("exec: pty: open ", name));
    if (::ioctl(pty_master.get(), TIOCSWINSZ, &size) != 0) return ErrnoError(errno, "exec: pty: set its size");
    // The command's three are the terminal; the agent reads and writes its
    // other end (its stderr is the terminal too: no stderr of its own).
    UniqueFd in_copy(::fcntl(terminal.get(), F_DUPFD_CLOEXEC, 0)), err_copy(::fcntl(terminal.get(), F_DUPFD_CLOEXEC, 0));
    UniqueFd master_in(::fcntl(pty_master.get(), F_DUPFD_CLOEXEC, 0));
    if (!in_copy || !err_copy || !master_in) return ErrnoError(errno, "exec: pty: dup");
    out_w = std::move(terminal);
    in_r = std::move(in_copy);
    err_w = std::move(err_copy);
    in_w = std::move(master_in);
    out_r.reset(::fcntl(pty_master.get(), F_DUPFD_CLOEXEC, 0));
    if (!out_r) return ErrnoError(errno, "exec: pty: dup");
    err_r.reset();
  }
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  int exec_error[2];
  if (::pipe2(exec_error, O_CLOEXEC)) return ErrnoError(errno, "exec: pipe");
  UniqueFd err_pipe_r(exec_error[0]), err_pipe_w(exec_error[1]);

  // What the child keeps past 3 (sorted, made before the fork).
  std::vector<int> keep = cgroups;
  keep.push_back(err_pipe_w.get());
  std::sort(keep.begin(), keep.end());
  const bool shepherd = started.kill_leftovers && !isolate;
  started.start = std::chrono::steady_clock::now();
  pid_t pid;
  {
    std::lock_guard lock(mu_);
    // A reaper for the child, started before it (when none runs): if no
    // thread can be made, nothing is forked that nobody would reap. It
    // waits for the lock, so it sees the child registered.
    if (!reaping_) {
      try {
        Spawn([this] { ReapLoop(); });
      } catch (const std::system_error& e) {
        return Error(e.code().value(), StrCat("exec: start the reaper thread: ", e.what()));
      }
      reaping_ = true;
    }
    pid = ::fork();
    if (pid == 0) {
      // Child: async-signal-safe calls only.
      ::setsid();  // its own process group: a timeout kills the whole tree
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);  // the agent ignores it; a command gets the usual default
      ::dup2(in_r.get(), 0);
      ::dup2(out_w.get(), 1);
      ::dup2(err_w.get(), 2);
      if (pty_master && ::ioctl(0, TIOCSCTTY, 0) != 0) FailStart(err_pipe_w.get(), StartStep::kTerminal, errno);
      // Nothing else of the agent's (other requests' files and sockets,
      // other commands' pipes): close-on-exec is not enough for the
      // processes here that never exec (a shepherd, a call's init).
      CloseAllBut(keep);
      if (!shepherd) {
        for (int fd : cgroups) {
          if (::write(fd, "0", 1) != 1) FailStart(err_pipe_w.get(), StartStep::kCgroup, errno);
        }
      }
      if (isolate) RunCall({cargv.data(), cenv.data(), cwd.c_str(), err_pipe_w.get(), isolate_network, call_seccomp, &rule_mounts});
      if (!rule_mounts.empty()) {
        if (::unshare(CLONE_NEWNS) != 0) FailStart(err_pipe_w.get(), StartStep::kNamespaces, errno);
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) FailStart(err_pipe_w.get(), StartStep::kMounts, errno);
        int failed = -1;
        if (int e = MakeRuleMounts(rule_mounts, &failed)) FailStart(err_pipe_w.get(), StartStep::kRules, e, failed);
      }
      if (call_seccomp) {
        if (int e = DropCallPrivileges(*call_seccomp)) FailStart(err_pipe_w.get(), StartStep::kPrivileges, e);
      }
      if (!rule_mounts.empty() && !shepherd) {
        if (int e = EnterLandlockDomain()) FailStart(err_pipe_w.get(), StartStep::kLandlock, e);
      }
      if (as) {
        const gid_t gid = as->second;
        if (::setgroups(1, &gid) != 0 || ::setgid(gid) != 0 || ::setuid(as->first) != 0) {
          FailStart(err_pipe_w.get(), StartStep::kUser, errno);
        }
      }
      if (::chdir(cwd.c_str()) != 0) FailStart(err_pipe_w.get(), StartStep::kChdir, errno);
      if (shepherd) Shepherd(cargv.data(), cenv.data(), err_pipe_w.get(), cgroups, !rule_mounts.empty());
      ::environ = cenv.data();
      ::execvp(cargv[0], cargv.data());
      FailStart(err_pipe_w.get(), StartStep::kExec, errno);
    }
    if (pid > 0) {
      children_[pid] = -1;
      ++spawned_;
      spawned_cv_.notify_one();
    }
  }
  if (pid < 0) return ErrnoError(errno, "exec: fork");
  out_w.reset();
  err_w.reset();
  in_r.reset();
  err_pipe_w.reset();
  StartFailure failed{};
  started.group = pid;
  // (Another command may stop the child before it reports: it is
  // continued while we wait.)
  auto read_report = [&] {
    for (;;) {
      pollfd p{err_pipe_r.get(), POLLIN, 0};
      int rc = ::poll(&p, 1, 100);
      if (rc == 0) {
        ::kill(pid, SIGCONT);
        continue;
      }
      if (rc < 0 && errno == EINTR) continue;
      ssize_t got;
      while ((got = ::read(err_pipe_r.get(), &failed, sizeof failed)) < 0 && errno == EINTR) {
      }
      return got == sizeof failed;
    }
  };
  bool reported = read_report();
  if (reported && failed.step == StartStep::kStarted) {
    started.group = failed.err;  // a shepherd's command, in a group of its own
    reported = read_report();    // then the command's own start
  }
  if (reported) {
    WaitChild(pid);
    std::string where = failed.step == StartStep::kExec ? "exec " + argv[0]
                        : failed.step == StartStep::kChdir ? StrCat("exec ", argv[0], ": working directory ", cwd)
                                                           : StrCat("exec ", argv[0], ": ", StepName(failed.step));
    if (failed.step == StartStep::kRules && failed.rule >= 0 && static_cast<size_t>(failed.rule) < rule_mounts.size()) {
      const RuleMount& m = rule_mounts[static_cast<size_t>(failed.rule)];
      where += StrCat(": ", RuleKindName(m.kind), " ", m.path);
    }
    return ErrnoError(failed.err, where);
  }
  if (!want_stdin) in_w.reset();
  started.pid = pid;
  started.out_r = std::move(out_r);
  started.err_r = std::move(err_r);
  started.in_w = std::move(in_w);
  started.pty = std::move(pty_master);
  return started;
}

// Kills a running command's process group; a shepherd (which the command
// may have stopped) is continued, to kill the rest of the tree and exit.
void Agent::KillCommand(const Started& c) {
  ::kill(-c.group, SIGKILL);
  if (c.group != c.pid) ::kill(c.pid, SIGCONT);
}

json Agent::Pump(Started& c, int conn, const std::function<bool(int, std::string_view)>& emit) {
  const pid_t pid = c.pid;
  // Stdin is written without blocking: a command that fills its stdout
  // before reading all its stdin must not deadlock against us.
  std::string pending_in;
  size_t pending_off = 0;
  UniqueFd& in_w = c.in_w;
  if (in_w) ::fcntl(in_w.get(), F_SETFL, O_NONBLOCK);
  uint64_t sent[2] = {0, 0}, total[2] = {0, 0};
  bool timed_out = false, conn_open = conn >= 0, emitting = true, killed = false;
  UniqueFd* pipes[2] = {&c.out_r, &c.err_r};
  std::vector<char> buf(64 * 1024);
  auto deadline = c.start + std::chrono::milliseconds(c.timeout_ms);
  // Until both pipes close (the command and everything it started let go
  // of them) or the command is gone and its pipes stay quiet.
  bool exited = false;
  int wait_status = 0;
  auto quiet_since = std::chrono::steady_clock::time_point::max();
  while (c.out_r || c.err_r) {
    pollfd fds[4];
    int n = 0;
    for (auto* p : pipes) {
      if (*p) fds[n++] = {p->get(), POLLIN, 0};
    }
    const bool writing = in_w && pending_off < pending_in.size();
    if (writing) fds[n++] = {in_w.get(), POLLOUT, 0};
    // Take more from the launcher only when the last stdin piece is gone.
    if (conn_open && !writing) fds[n++] = {conn, POLLIN, 0};
    int wait_ms = 100;
    // A stopped shepherd is continued until it has killed the tree and
    // gone (a command may stop it again while it is being killed).
    if (killed && !exited && c.group != pid) ::kill(pid, SIGCONT);
    if (c.timeout_ms > 0 && !timed_out) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) {
        timed_out = killed = true;
        KillCommand(c);
      } else {
        wait_ms = static_cast<int>(std::min<int64_t>(left, 100));
      }
    }
    int rc = ::poll(fds, static_cast<nfds_t>(n), wait_ms);
    if (rc < 0 && errno != EINTR) break;
    bool got_data = false;
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      if (fds[i].fd == conn) {
        Frame type;
        std::string payload;
        if (!ReadFrame(conn, &type, &payload).ok()) {
          conn_open = false;  // the launcher went away: nobody wants the result
          killed = true;
          KillCommand(c);
          continue;
        }
        if (type == Frame::kStdin && in_w) {
          pending_in = std::move(payload);
          pending_off = 0;
        } else if (type == Frame::kStdinEof) {
          in_w.reset();  // (a piece still pending is dropped: the launcher sends EOF last)
        } else if (type == Frame::kSignal) {
          auto j = ParseJson(payload);
          if (j.ok()) ::kill(-c.group, j->value("signal", SIGTERM));
        }
        continue;
      }
      if (in_w && fds[i].fd == in_w.get()) {
        ssize_t w = ::write(in_w.get(), pending_in.data() + pending_off, pending_in.size() - pending_off);
        if (w > 0) pending_off += static_cast<size_t>(w);
        else if (w < 0 && errno != EAGAIN && errno != EINTR) in_w.reset();  // the command closed its stdin
        continue;
      }
      int k = (c.out_r && fds[i].fd == c.out_r.get()) ? 0 : 1;
      ssize_t r = ::read(pipes[k]->get(), buf.data(), buf.size());
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        pipes[k]->reset();
        continue;
      }
      got_data = true;
      total[k] += static_cast<uint64_t>(r);
      // Bytes past the cap are read (so the command never blocks) and dropped.
      if (sent[k] < c.caps[k] && emitting) {
        size_t take = static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(r), c.caps[k] - sent[k]));
        emitting = emit(k + 1, std::string_view(buf.data(), take));
        sent[k] += take;
      }
    }
    if (!exited) {
      std::lock_guard lock(mu_);
      if (children_[pid] != -1) {
        exited = true;
        wait_status = children_[pid];
        children_.erase(pid);
        quiet_since = std::chrono::steady_clock::now();
        // Asked for: what the command left behind in its process group goes with it.
        // (With a shepherd, done: it killed the tree before it exited,
        // and the group's id may already be someone else's.)
        if (c.kill_leftovers && c.group == pid) ::kill(-c.group, SIGKILL);
      }
    }
    if (exited) {
      if (got_data) quiet_since = std::chrono::steady_clock::now();
      // The command is gone; something it left behind holds the pipes.
      else if (std::chrono::steady_clock::now() - quiet_since > std::chrono::milliseconds(50)) break;
    }
  }
  if (!exited) wait_status = WaitChild(pid);
  if ((timed_out || c.kill_leftovers) && c.group == pid) ::kill(-c.group, SIGKILL);  // stragglers of the group
  json result = {
      {"exit_code", WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1},
      {"signal", WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0},
      {"timed_out", timed_out},
      {"stdout_bytes", total[0]},
      {"stderr_bytes", total[1]},
      {"stdout_truncated", total[0] > sent[0]},
      {"stderr_truncated", total[1] > sent[1]},
      {"duration_ms", std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - c.start).count()},
  };
  if (conn >= 0 && !conn_open) result["abandoned"] = true;
  return result;
}

Status Agent::Exec(int conn, const json& req) {
  if (req.value("detach", false)) return StartDetached(conn, req);
  auto started = Start(req, req.value("stdin", false));
  if (!started.ok()) return SendError(conn, started.status());
  Status send_status;
  json result = Pump(*started, conn, [&](int stream, std::string_view bytes) {
    send_status = WriteFrame(conn, stream == 1 ? Frame::kStdout : Frame::kStderr, bytes);
    return send_status.ok();
  });
  if (result.value("abandoned", false)) return OkStatus();
  return WriteFrame(conn, Frame::kExit, result.dump());
}

}  // namespace strata::launcher
