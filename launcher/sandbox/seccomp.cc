// Compiling OCI seccomp profiles with libseccomp.
#include "launcher/sandbox/seccomp.h"

#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/fs.h"
#include "common/hash.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::launcher {
namespace {

struct CtxDeleter {
  void operator()(scmp_filter_ctx ctx) const { seccomp_release(ctx); }
};

Result<uint32_t> Action(const std::string& name, int errno_ret) {
  if (name == "SCMP_ACT_ALLOW") return SCMP_ACT_ALLOW;
  if (name == "SCMP_ACT_ERRNO") return SCMP_ACT_ERRNO(static_cast<uint16_t>(errno_ret));
  if (name == "SCMP_ACT_KILL" || name == "SCMP_ACT_KILL_THREAD") return SCMP_ACT_KILL;
  if (name == "SCMP_ACT_KILL_PROCESS") return SCMP_ACT_KILL_PROCESS;
  if (name == "SCMP_ACT_LOG") return SCMP_ACT_LOG;
  return Error(EINVAL, "seccomp profile: unsupported action " + Quote(name));
}

Result<scmp_compare> Op(const std::string& name) {
  if (name == "SCMP_CMP_NE") return SCMP_CMP_NE;
  if (name == "SCMP_CMP_LT") return SCMP_CMP_LT;
  if (name == "SCMP_CMP_LE") return SCMP_CMP_LE;
  if (name == "SCMP_CMP_EQ") return SCMP_CMP_EQ;
  if (name == "SCMP_CMP_GE") return SCMP_CMP_GE;
  if (name == "SCMP_CMP_GT") return SCMP_CMP_GT;
  if (name == "SCMP_CMP_MASKED_EQ") return SCMP_CMP_MASKED_EQ;
  return Error(EINVAL, "seccomp profile: unsupported comparison " + Quote(name));
}

Result<uint32_t> Arch(const std::string& name) {
  if (name == "SCMP_ARCH_X86_64") return SCMP_ARCH_X86_64;
  if (name == "SCMP_ARCH_X86") return SCMP_ARCH_X86;
  if (name == "SCMP_ARCH_X32") return SCMP_ARCH_X32;
  if (name == "SCMP_ARCH_AARCH64") return SCMP_ARCH_AARCH64;
  if (name == "SCMP_ARCH_ARM") return SCMP_ARCH_ARM;
  return Error(EINVAL, "seccomp profile: unsupported architecture " + Quote(name));
}

}  // namespace

Result<std::string> CompileSeccomp(const nlohmann::json& profile) {
  try {
    const int default_errno = profile.value("defaultErrnoRet", 1);
    STRATA_ASSIGN_OR_RETURN(uint32_t default_action, Action(profile.at("defaultAction").get<std::string>(), default_errno));
    std::unique_ptr<void, CtxDeleter> ctx(seccomp_init(default_action));
    if (!ctx) return Error(ENOMEM, "seccomp_init");
    for (const auto& a : profile.value("architectures", nlohmann::json::array())) {
      STRATA_ASSIGN_OR_RETURN(uint32_t arch, Arch(a.get<std::string>()));
      int rc = seccomp_arch_add(ctx.get(), arch);
      if (rc != 0 && rc != -EEXIST) return ErrnoError(-rc, "seccomp: add architecture " + a.get<std::string>());
    }
    for (const auto& rule : profile.at("syscalls")) {
      STRATA_ASSIGN_OR_RETURN(uint32_t action,
                              Action(rule.at("action").get<std::string>(), rule.value("errnoRet", default_errno)));
      std::vector<scmp_arg_cmp> args;
      for (const auto& arg : rule.value("args", nlohmann::json::array())) {
        STRATA_ASSIGN_OR_RETURN(scmp_compare op, Op(arg.at("op").get<std::string>()));
        args.push_back({arg.at("index").get<unsigned>(), op, arg.at("value").get<uint64_t>(), arg.value("valueTwo", uint64_t{0})});
      }
      for (const auto& name : rule.at("names")) {
        int nr = seccomp_syscall_resolve_name(name.get<std::string>().c_str());
        if (nr == __NR_SCMP_ERROR) continue;  // not a system call on these architectures
        int rc = seccomp_rule_add_array(ctx.get(), action, nr, static_cast<unsigned>(args.size()), args.data());
        if (rc != 0 && rc != -EEXIST && rc != -EACCES) {
          return ErrnoError(-rc, "seccomp: add rule for " + name.get<std::string>());
        }
      }
    }
    UniqueFd mem(::memfd_create("strata-seccomp", MFD_CLOEXEC));
    if (!mem) return ErrnoError(errno, "memfd_create");
    int rc = seccomp_export_bpf(ctx.get(), mem.get());
    if (rc != 0) return ErrnoError(-rc, "seccomp: export BPF");
    off_t size = ::lseek(mem.get(), 0, SEEK_END);
    std::string bpf(static_cast<size_t>(size), '\0');
    STRATA_ASSIGN_OR_RETURN(size_t n, PreadFull(mem.get(), bpf, 0));
    bpf.resize(n);
    return Base64Encode(bpf);
  } catch (const nlohmann::json::exception& e) {
    return Error(EINVAL, StrCat("seccomp profile: ", e.what()));
  }
}

Result<std::string> CompiledSeccompBase64(const nlohmann::json& profile, const std::string& cache_dir) {
  const std::string path = StrCat(cache_dir, "/", HashBytes(profile.dump()).Hex(), ".bpf64");
  if (auto cached = ReadFileToString(path); cached.ok() && !cached->empty()) return *cached;
  STRATA_ASSIGN_OR_RETURN(std::string compiled, CompileSeccomp(profile));
  if (MakeDirs(cache_dir, 0700).ok()) WriteFileAtomic(path, compiled, false).IgnoreError();
  return compiled;
}

using nlohmann::json;

namespace {

// System calls allowed by default, following the widely used container
// default profile; anything else fails with EPERM.
const char* const kAllowedSyscalls[] = {
    "accept", "accept4", "access", "adjtimex", "alarm", "arch_prctl", "bind", "brk", "cachestat", "capget", "capset",
    "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64", "clock_getres", "clock_getres_time64",
    "clock_gettime", "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "close", "close_range", "connect",
    "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old",
    "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "execve", "execveat", "exit",
    "exit_group", "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fanotify_mark", "fchdir",
    "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr",
    "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64",
    "fsync", "ftruncate", "ftruncate64", "futex", "futex_requeue", "futex_time64", "futex_wait", "futex_waitv",
    "futex_wake", "futimesat", "getcpu", "getcwd", "getdents", "getdents64", "getegid", "getegid32", "geteuid",
    "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer", "getpeername", "getpgid", "getpgrp",
    "getpid", "getppid", "getpriority", "getrandom", "getresgid", "getresgid32", "getresuid", "getresuid32",
    "getrlimit", "get_robust_list", "getrusage", "getsid", "getsockname", "getsockopt", "get_thread_area", "gettid",
    "gettimeofday", "getuid", "getuid32", "getxattr", "inotify_add_watch", "inotify_init", "inotify_init1",
    "inotify_rm_watch", "io_cancel", "ioctl", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64",
    "ioprio_get", "ioprio_set", "io_setup", "io_submit", "ipc", "kill", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self", "lchown", "lchown32", "lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr",
    "_llseek", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "madvise", "map_shadow_stack", "membarrier",
    "memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall",
    "mmap", "mmap2", "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "mremap", "msgctl", "msgget",
    "msgrcv", "msgsnd", "msync", "munlock", "munlockall", "munmap", "name_to_handle_at", "nanosleep", "newfstatat",
    "_newselect", "open", "openat", "openat2", "pause", "pidfd_getfd", "pidfd_open", "pidfd_send_signal", "pipe",
    "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl", "pread64", "preadv",
    "preadv2", "prlimit64", "process_mrelease", "pselect6", "pselect6_time64", "pwrite64", "pwritev", "pwritev2",
    "read", "readahead", "readlink", "readlinkat", "readv", "recv", "recvfrom", "recvmmsg", "recvmmsg_time64",
    "recvmsg", "remap_file_pages", "removexattr", "rename", "renameat", "renameat2", "restart_syscall", "rmdir",
    "rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr",
    "sched_getparam", "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval",
    "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler",
    "sched_yield", "seccomp", "select", "semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "send",
    "sendfile", "sendfile64", "sendmmsg", "sendmsg", "sendto", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32",
    "setgid", "setgid32", "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid", "setregid32",
    "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32", "setrlimit", "set_robust_list",
    "setsid", "setsockopt", "set_thread_area", "set_tid_address", "setuid", "setuid32", "setxattr", "shmat", "shmctl",
    "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask", "sigreturn", "socket",
    "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64", "statx", "symlink", "symlinkat",
    "sync", "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time", "timer_create", "timer_delete",
    "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create",
    "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times", "tkill", "truncate",
    "truncate64", "ugetrlimit", "umask", "uname", "unlink", "unlinkat", "utime", "utimensat", "utimensat_time64",
    "utimes", "vfork", "vmsplice", "wait4", "waitid", "waitpid", "write", "writev", "chroot", "ptrace",
    "personality", "process_vm_readv", "process_vm_writev",
};

// What the agent's profile allows beyond the default (to give a command or
// a call mount and other namespaces of its own).
const std::vector<std::string> kAgentOnlySyscalls = {"mount", "mount_setattr", "umount2", "unshare"};

// CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
// CLONE_NEWPID | CLONE_NEWNET: clone may not make namespaces.
constexpr uint64_t kNamespaceFlags = 0x7E020000;

}  // namespace

json DefaultSeccompProfile() {
  json names = json::array();
  for (const char* n : kAllowedSyscalls) names.push_back(n);
  return {
      {"defaultAction", "SCMP_ACT_ERRNO"},
      {"defaultErrnoRet", 1},  // EPERM
      {"architectures", {"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}},
      {"syscalls",
       {
           {{"names", names}, {"action", "SCMP_ACT_ALLOW"}},
           {{"names", {"clone"}},
            {"action", "SCMP_ACT_ALLOW"},
            {"args", {{{"index", 0}, {"value", kNamespaceFlags}, {"valueTwo", 0}, {"op", "SCMP_CMP_MASKED_EQ"}}}}},
           {{"names", {"clone3"}}, {"action", "SCMP_ACT_ERRNO"}, {"errnoRet", 38}},  // ENOSYS: use clone
       }},
  };
}

json AgentSeccompProfile() {
  json profile = DefaultSeccompProfile();
  profile["syscalls"].push_back({{"names", kAgentOnlySyscalls}, {"action", "SCMP_ACT_ALLOW"}});
  return profile;
}

json CommandOnAgentSeccompProfile() {
  return {
      {"defaultAction", "SCMP_ACT_ALLOW"},
      {"architectures", DefaultSeccompProfile()["architectures"]},
      {"syscalls", {{{"names", kAgentOnlySyscalls}, {"action", "SCMP_ACT_ERRNO"}, {"errnoRet", 1}}}},
  };
}

}  // namespace strata::launcher
