// The attack on hidden grader files that the file-rule tests run from
// inside a sandbox (a container's, tests/launcher/file_rules_test.cc, and
// a microVM's, tests/launcher/microvm_test.cc).
#pragma once

namespace strata::launcher {

inline constexpr const char* kSecret = "the answer is 42";
// What any route that leaks the secret prints (all of it, or grep's
// "answer is 42"); a bare "42" can be a pid in an error message
// ("/proc/42/root/...").
inline constexpr const char* kLeakMark = "is 42";

// What `strata-test-prober syscalls` prints in a sandbox whose commands
// are held to the default seccomp profile. Each call is made so that the
// kernel itself would answer EFAULT or EINVAL (or succeed): the EPERM and
// ENOSYS come from the seccomp programs. The 32-bit entry's lines,
// mount32 and unshare32, are checked apart (a guest's kernel may lack it).
inline constexpr const char* kRefusedSyscalls[] = {
    "mount: err EPERM",  "umount2: err EPERM", "mount_setattr: err EPERM", "unshare: err EPERM",
    "keyctl: err EPERM", "bpf: err EPERM",     "clone3: err ENOSYS",      "clone_newuser: err EPERM",
    "getpid: ok",        "clone: ok"};

// Every route to /grader/secret we know of, tried by one shell script; the
// output holds the secret if any route leaks it. Each attempt prints a
// label first, so a test can see the route was really tried.
inline constexpr const char* kAttack = R"sh(
echo direct; cat /grader/secret
echo list; ls -A /grader
echo symlink; ln -s /grader/secret /tmp/sl; cat /tmp/sl
echo hardlink; ln /grader/secret /tmp/hl && cat /tmp/hl
echo copy; cp -r /grader /tmp/copy; cat /tmp/copy/secret
echo bind; mkdir -p /tmp/bind; mount --bind /grader /tmp/bind && cat /tmp/bind/secret
echo proc
for p in /proc/[0-9]*; do
  cat $p/root/grader/secret $p/cwd/secret 2>&1
  for f in $p/fd/*; do
    case "$(readlink $f 2>/dev/null)" in pipe:*|socket:*|anon_inode:*) ;; *) head -c 100 $f 2>&1; cat $f/secret $f/grader/secret 2>&1 ;; esac
  done
done
echo openat2; prober openat2 / grader/secret
echo passed; prober fetch /tmp/fds secret; prober fetch /tmp/fds grader/secret
echo parent; ls /proc/$PPID/fd 2>&1 | head -c 300
echo tree; (setsid sh -c 'sleep 0.2; cat /grader/secret /proc/1/root/grader/secret > /tmp/daemon.out 2>&1' &); sleep 0.6; cat /tmp/daemon.out
echo end
)sh";

}  // namespace strata::launcher
