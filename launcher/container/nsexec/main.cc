// strata-nsexec: starts a container runtime in a mount namespace of its
// own, in which it first mounts the sandbox's root (its overlay), so that
// no namespace of the node's ever holds a sandbox's root. The runtime's
// container namespace starts as a copy of this one (the root and what the
// node had); this one ends when the runtime exits (`run --detach` at once).
// Without it every create's runtime copied, and walked, a namespace that
// grew with the node's sandboxes (docs/benchmarks.md, "density").
//   strata-nsexec --overlay DIR OPTIONS [--read-only] -- PROGRAM ARG...
// Descriptors 3 and up pass through to PROGRAM unchanged. A failure before
// the exec says which step failed on stderr and exits 125. Static: it
// links nothing but libc and libstdc++, so it starts in well under a
// millisecond (posix_spawn cannot unshare, hence a program of its own).
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

[[noreturn]] void Die(const std::string& step) {
  std::fprintf(stderr, "strata-nsexec: %s: %s\n", step.c_str(), std::strerror(errno));
  std::_Exit(125);
}

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr, "strata-nsexec: %s\nusage: strata-nsexec --overlay DIR OPTIONS [--read-only] -- PROGRAM ARG...\n", why);
  std::_Exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const char* dir = nullptr;
  const char* options = nullptr;
  unsigned long flags = 0;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--read-only") {
      flags |= MS_RDONLY;
    } else if (a == "--overlay") {
      if (i + 2 >= argc) Usage("--overlay wants DIR and OPTIONS");
      dir = argv[++i];
      options = argv[++i];
    } else {
      Usage(("unknown option " + a).c_str());
    }
  }
  if (!dir || dir[0] != '/') Usage("--overlay wants an absolute directory");
  if (i >= argc) Usage("no program after --");
  if (::unshare(CLONE_NEWNS) != 0) Die("make a mount namespace (unshare)");
  // Slave, not shared: the root mounted below stays in this namespace
  // (and the runtime's copy) instead of propagating back to the node's.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) Die("make the copied mounts slaves");
  if (::mount("overlay", dir, "overlay", flags, options) != 0) {
    Die(std::string("mount the sandbox's root (overlay on ") + dir + ", " + options + ")");
  }
  ::execvp(argv[i], argv + i);
  Die(std::string("exec ") + argv[i]);
}
