// The agent: requests in, processes out.
#include "launcher/agent/agent.h"

#include "launcher/agent/vm_init.h"

#include <fcntl.h>
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
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "launcher/protocol/file_rules.h"
#include "launcher/protocol/protocol.h"
#include "launcher/protocol/layout.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

Status SendError(int conn, const Status& s) {
  return WriteFrame(conn, Frame::kError, json{{"error", s.ToString()}, {"errno", s.code()}}.dump());
}

Result<json> ParseJson(const std::string& payload) {
  json j = json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error(EINVAL, "agent: request is not a JSON object");
  return j;
}

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
enum class StartStep : int { kExec, kChdir, kNamespaces, kMounts, kLoopback, kPrivileges, kFork, kRules, kLandlock, kCgroup,
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

void Agent::ReapLoop() {
  while (true) {
    uint64_t seen;
    {
      std::lock_guard lock(mu_);
      seen = spawned_;
    }
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      // ECHILD: no children at all (orphans of our children are ours
      // before they are reaped, so none can come). Unless a command is
      // started meanwhile, or within kLinger, this thread ends; the next
      // command starts another.
      std::unique_lock lock(mu_);
      if (spawned_cv_.wait_for(lock, kLinger, [&] { return spawned_ != seen; })) continue;
      reaping_ = false;
      return;
    }
    std::lock_guard lock(mu_);  // taken only after Exec registered its child
    auto it = children_.find(pid);
    if (it != children_.end()) {
      it->second = status;
      cv_.notify_all();
    }
    // Anything else was an orphan reparented to us: reaped, forgotten.
  }
}

int Agent::WaitChild(pid_t pid) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return children_[pid] != -1; });
  int status = children_[pid];
  children_.erase(pid);
  return status;
}

// A command forked and not yet waited for.
struct Agent::Started {
  pid_t pid = -1;
  UniqueFd out_r, err_r, in_w;
  std::chrono::steady_clock::time_point start;
  int64_t timeout_ms = 0;
  uint64_t caps[2] = {0, 0};
  bool kill_leftovers = false;
  std::string argv0;
  pid_t group = -1;  // the process group signals go to: pid's, or a shepherd's command's
};

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
  bool has_path = false;
  for (const auto& e : env) has_path |= e.starts_with("PATH=");
  if (!has_path) env.push_back(std::string("PATH=") + kDefaultPath);

  int out[2], err[2], in[2];
  if (::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC) || ::pipe2(in, O_CLOEXEC)) return ErrnoError(errno, "exec: pipe");
  UniqueFd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]), in_r(in[0]), in_w(in[1]);
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

// ---- Detached commands (protocol version 2): they belong to the agent,
// not to a connection, so they outlive the launcher's connection and the
// launcher itself.

json Agent::Detached::Describe() const {
  json j = {{"id", id}, {"argv", argv}, {"started", started}, {"state", done ? "exited" : "running"},
            {"stdout_bytes", out.size()}, {"stderr_bytes", err.size()}};
  if (done) j["exit"] = exit;
  return j;
}

Status Agent::StartDetached(int conn, const json& req) {
  std::shared_ptr<Detached> d;
  {
    std::lock_guard lock(detached_mu_);
    // Room for a new one: forget the oldest finished ones past the limit.
    while (detached_.size() >= kMaxDetached) {
      auto oldest = detached_.end();
      for (auto it = detached_.begin(); it != detached_.end(); ++it) {
        std::lock_guard l(it->second->mu);
        if (it->second->done && (oldest == detached_.end() || it->second->seq < oldest->second->seq)) oldest = it;
      }
      if (oldest == detached_.end()) {
        return SendError(conn, Error(EAGAIN, StrCat("exec: ", kMaxDetached, " detached commands run already")));
      }
      detached_.erase(oldest);
    }
    d = std::make_shared<Detached>();
    d->seq = ++detached_seq_;
    std::string id = req.value("exec_id", "");
    if (id.empty() || detached_.count(id)) id = StrCat("ex-", ::getpid(), "-", d->seq);
    d->id = id;
    // Its slot and name are taken now, under the same lock as the check
    // (it is not yet signalled: no pid).
    detached_[d->id] = d;
  }
  d->argv = req.value("argv", json::array());
  d->started = static_cast<int64_t>(::time(nullptr));
  std::optional<std::string> input;
  if (req.contains("stdin_b64") && req["stdin_b64"].is_string()) {
    input = Base64Decode(req["stdin_b64"].get<std::string>());
  }
  auto started = input || !req.contains("stdin_b64") ? Start(req, input.has_value())
                                                     : Result<Started>(Error(EINVAL, "exec: stdin_b64 is not base64"));
  if (!started.ok()) {
    std::lock_guard lock(detached_mu_);
    detached_.erase(d->id);
    return SendError(conn, started.status());
  }
  {
    std::lock_guard lock(d->mu);
    d->pid = started->group;
  }
  // The pump runs on its own thread; stdin, if any, is written by another
  // so a command that fills its output first never stalls on it.
  auto command = std::make_shared<Started>(std::move(*started));
  if (input) {
    int in = command->in_w.release();
    Spawn([in, data = std::move(*input)] {
      WriteFull(in, data).IgnoreError();
      ::close(in);
    });
  }
  Spawn([this, d, command] {
    json result = Pump(*command, -1, [&](int stream, std::string_view bytes) {
      std::lock_guard lock(d->mu);
      (stream == 1 ? d->out : d->err).append(bytes);
      d->cv.notify_all();
      return true;
    });
    std::lock_guard lock(d->mu);
    d->done = true;
    d->exit = result;
    d->cv.notify_all();
  });
  return WriteFrame(conn, Frame::kOk, json{{"exec_id", d->id}}.dump());
}

std::shared_ptr<Agent::Detached> Agent::FindDetached(const std::string& id) {
  std::lock_guard lock(detached_mu_);
  auto it = detached_.find(id);
  return it == detached_.end() ? nullptr : it->second;
}

Status Agent::Attach(int conn, const json& req) {
  auto d = FindDetached(req.value("exec_id", ""));
  if (!d) return SendError(conn, Error(ENOENT, "exec " + Quote(req.value("exec_id", "")) + ": no such detached command"));
  uint64_t at[2] = {req.value("stdout_offset", uint64_t{0}), req.value("stderr_offset", uint64_t{0})};
  const bool follow = req.value("follow", true);
  while (true) {
    std::string pieces[2];
    bool done;
    json exit;
    {
      std::unique_lock lock(d->mu);
      auto ready = [&] { return d->done || d->out.size() > at[0] || d->err.size() > at[1]; };
      // Wake now and then to notice a launcher that went away.
      if (follow) d->cv.wait_for(lock, std::chrono::milliseconds(500), ready);
      for (int k = 0; k < 2; ++k) {
        const std::string& buf = k == 0 ? d->out : d->err;
        if (buf.size() > at[k]) pieces[k] = buf.substr(at[k]);
        at[k] = std::max<uint64_t>(at[k], buf.size());
      }
      done = d->done;
      exit = d->exit;
    }
    for (int k = 0; k < 2; ++k) {
      for (size_t off = 0; off < pieces[k].size(); off += kMaxFrame) {
        STRATA_RETURN_IF_ERROR(WriteFrame(conn, k == 0 ? Frame::kStdout : Frame::kStderr,
                                          std::string_view(pieces[k]).substr(off, kMaxFrame)));
      }
    }
    if (done) return WriteFrame(conn, Frame::kExit, exit.dump());
    if (!follow) return WriteFrame(conn, Frame::kOk, json{{"state", "running"}}.dump());
    pollfd p{conn, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLIN))) return OkStatus();  // gone (or talking out of turn)
  }
}

Status Agent::ExecStatus(int conn, const json& req) {
  auto d = FindDetached(req.value("exec_id", ""));
  if (!d) return SendError(conn, Error(ENOENT, "exec " + Quote(req.value("exec_id", "")) + ": no such detached command"));
  const int64_t wait_ms = req.value("wait_ms", int64_t{0});
  std::unique_lock lock(d->mu);
  if (wait_ms > 0) d->cv.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return d->done; });
  return WriteFrame(conn, Frame::kOk, d->Describe().dump());
}

Status Agent::ListExecs(int conn) {
  std::vector<std::shared_ptr<Detached>> all;
  {
    std::lock_guard lock(detached_mu_);
    for (auto& [id, d] : detached_) all.push_back(d);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->seq < b->seq; });
  json list = json::array();
  for (auto& d : all) {
    std::lock_guard lock(d->mu);
    list.push_back(d->Describe());
  }
  return WriteFrame(conn, Frame::kOk, json{{"execs", list}}.dump());
}

Status Agent::SignalExec(int conn, const json& req) {
  auto d = FindDetached(req.value("exec_id", ""));
  if (!d) return SendError(conn, Error(ENOENT, "exec " + Quote(req.value("exec_id", "")) + ": no such detached command"));
  const int sig = req.value("signal", SIGTERM);
  {
    std::lock_guard lock(d->mu);
    // (ESRCH: it is exiting and its pump has not seen it yet.)
    if (!d->done && d->pid > 0 && ::kill(-d->pid, sig) != 0 && errno != ESRCH) {
      return SendError(conn, ErrnoError(errno, "signal " + d->id));
    }
  }
  return WriteFrame(conn, Frame::kOk, "{}");
}

Status Agent::Put(int conn, const json& req) {
  const std::string path = req.value("path", "");
  if (path.empty() || path[0] != '/') return SendError(conn, Error(EINVAL, "put: path must be absolute"));
  // Into a temporary file beside the target, renamed over it only once
  // every byte is in: a transfer cut short leaves the target as it was.
  const std::string tmp = StrCat(Dirname(path), "/.strata-put-", ::getpid(), "-", ::syscall(SYS_gettid));
  Status s = MakeDirs(Dirname(path));
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
  if (s.ok() && req.contains("uid") && ::fchown(fd.get(), req.value("uid", 0u), req.value("gid", 0u)) != 0) {
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

void Agent::HandleConnection(UniqueFd conn) {
  // The agent is the sandbox's init: nothing a request brings (a name that
  // is not UTF-8, memory running out) may end it.
  active_connections_.fetch_add(1);
  try {
    HandleRequest(conn.get());
  } catch (const std::exception& e) {
    SendError(conn.get(), Error(EIO, StrCat("agent: ", e.what()))).IgnoreError();
  }
  // The last call is over: what its buffers took goes back to the kernel
  // (free pages in the middle of the heap too), so an idle sandbox's agent
  // keeps only what it holds.
  if (active_connections_.fetch_sub(1) == 1) ::malloc_trim(0);
}

void Agent::HandleRequest(int fd) {
  UniqueFd conn(::fcntl(fd, F_DUPFD_CLOEXEC, 0));  // (closed here; the caller's copy closes after)
  Frame type;
  std::string payload;
  if (!ReadFrame(conn.get(), &type, &payload).ok()) return;
  auto req = ParseJson(payload.empty() ? "{}" : payload);
  if (!req.ok()) {
    SendError(conn.get(), req.status()).IgnoreError();
    return;
  }
  Status s;
  switch (type) {
    case Frame::kExec: s = Exec(conn.get(), *req); break;
    case Frame::kPut: s = Put(conn.get(), *req); break;
    case Frame::kGet: s = Get(conn.get(), *req); break;
    case Frame::kPing: s = WriteFrame(conn.get(), Frame::kOk, json{{"pid", ::getpid()}, {"version", kAgentProtocolVersion}}.dump()); break;
    case Frame::kAttach: s = Attach(conn.get(), *req); break;
    case Frame::kExecStatus: s = ExecStatus(conn.get(), *req); break;
    case Frame::kListExecs: s = ListExecs(conn.get()); break;
    case Frame::kSignalExec: s = SignalExec(conn.get(), *req); break;
    case Frame::kPutTree: s = PutTree(conn.get(), *req); break;
    case Frame::kGetTree: s = GetTree(conn.get(), *req); break;
    case Frame::kShutdown: {
      {
        std::lock_guard lock(mu_);
        shutting_down_ = true;
      }
      ::kill(-1, SIGKILL);  // as PID 1: every other process of the sandbox
      WriteFrame(conn.get(), Frame::kOk, "{}").IgnoreError();
      if (power_off_) power_off_();
      ::_exit(0);
    }
    case Frame::kFreeze:
      if (!freeze_) {
        s = SendError(conn.get(), Error(ENOTSUP, "freeze: only a microVM's agent freezes its upper disk"));
        break;
      }
      s = freeze_(req->value("freeze", true));
      s = s.ok() ? WriteFrame(conn.get(), Frame::kOk, "{}") : SendError(conn.get(), s);
      break;
    case Frame::kIdentity:
      if (!identify_) {
        s = SendError(conn.get(), Error(ENOTSUP, "identity: only a microVM's agent takes one"));
        break;
      }
      s = identify_(*req);
      s = s.ok() ? WriteFrame(conn.get(), Frame::kOk, "{}") : SendError(conn.get(), s);
      break;
    default: s = SendError(conn.get(), Error(EPROTO, "agent: unknown request type"));
  }
  (void)s;  // a failed send means the launcher went away; nothing to tell it
}

Agent::~Agent() {
  std::lock_guard lock(threads_mu_);
  for (auto& t : threads_) t.detach();
}

void Agent::Spawn(std::function<void()> fn) {
  JoinEnded();
  std::lock_guard lock(threads_mu_);
  auto it = threads_.emplace(threads_.end());
  try {
    *it = std::thread([this, it, fn = std::move(fn)] {
      fn();
      std::lock_guard ended_lock(threads_mu_);  // (held by Spawn until *it is set)
      ended_.push_back(it);
      if (ended_fd_) ::eventfd_write(ended_fd_.get(), 1);
    });
  } catch (...) {
    threads_.erase(it);
    throw;
  }
}

void Agent::JoinEnded() {
  std::list<std::thread> ended;
  {
    std::lock_guard lock(threads_mu_);
    for (auto it : ended_) ended.splice(ended.end(), threads_, it);
    ended_.clear();
  }
  for (auto& t : ended) t.join();  // (each has only its exit left)
}

void Agent::ServeConnection(UniqueFd conn) {
  {
    std::lock_guard lock(connections_mu_);
    if (waiting_connections_.size() < idle_connection_threads_) {
      waiting_connections_.push_back(conn.release());
      connections_cv_.notify_one();
      return;
    }
  }
  Spawn([this, fd = conn.release()] { ConnectionThread(UniqueFd(fd)); });
}

void Agent::ConnectionThread(UniqueFd conn) {
  while (true) {
    HandleConnection(std::move(conn));
    std::unique_lock lock(connections_mu_);
    ++idle_connection_threads_;
    connections_cv_.wait_for(lock, kLinger, [&] { return !waiting_connections_.empty(); });
    --idle_connection_threads_;
    if (waiting_connections_.empty()) return;
    conn = UniqueFd(waiting_connections_.back());
    waiting_connections_.pop_back();
  }
}

Status Agent::Serve(int listen_fd) {
  if (int flags = ::fcntl(listen_fd, F_GETFL); flags < 0 || ::fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return ErrnoError(errno, "agent: make the listening socket non-blocking");
  }
  if (!ended_fd_) return Error(EMFILE, "agent: no eventfd for ended threads");
  while (true) {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {ended_fd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "agent: poll");
    }
    if (fds[1].revents & POLLIN) {
      eventfd_t n;
      ::eventfd_read(ended_fd_.get(), &n);
      JoinEnded();
    }
    if (fds[0].revents & (POLLNVAL | POLLERR | POLLHUP)) return Error(EIO, "agent: the listening socket failed");
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      return ErrnoError(errno, "agent: accept");
    }
    // Requests come from the node, outside the sandbox's PID namespace
    // (where the peer's pid reads as 0). A process of the sandbox could
    // otherwise reach the socket through /.strata/run and ask for what
    // only the API caller may: an exec without file rules, a shutdown.
    ucred peer{};
    socklen_t len = sizeof peer;
    if (::getpid() == 1 && (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.pid != 0)) {
      SendError(fd, Error(EACCES, "agent: requests come from the node, not from processes in the sandbox")).IgnoreError();
      ::close(fd);
      continue;
    }
    ServeConnection(UniqueFd(fd));
  }
}

}  // namespace strata::launcher
