// strata-agent: the in-sandbox agent (static; runs as the sandbox's init).
//   strata-agent, its listening unix socket as descriptor 3 (a container)
//   /init of a microVM's initramfs (no descriptor 3): it builds the root
//   from the VM's disks and serves over its virtio-serial port
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>

#include "launcher/protocol/stream_mux.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/vm_init.h"

namespace {
constexpr int kListenFd = 3;

[[noreturn]] void Fatal(const strata::Status& s) {
  std::fprintf(stderr, "strata-agent: %s\n", s.ToString().c_str());
  strata::launcher::PowerOff();
}

// A microVM's init: the root from the disks, then every stream of the
// channel served as a connection. The host may go away and come back (a
// daemon restart): its streams end, detached commands run on.
[[noreturn]] void MicroVmMain() {
  using namespace strata;
  ::signal(SIGPIPE, SIG_IGN);
  auto root = launcher::BootMicroVm();
  if (!root.ok()) Fatal(root.status());
  static launcher::Agent agent({root->command_cgroup.release()});
  static const int upper = root->upper.release();
  static const int initramfs = root->initramfs.release();
  agent.SetMicroVm(
      [] {
        ::sync();
        ::usleep(100000);  // the answer leaves through the channel first
        launcher::PowerOff();
      },
      [](bool freeze) { return launcher::FreezeUpper(upper, freeze); },
      [](const nlohmann::json& identity) { return launcher::ApplyIdentity(initramfs, identity); });
  StreamMux mux({.host = false, .open_local = []() -> Result<UniqueFd> {
                   int pair[2];
                   if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return ErrnoError(errno, "socketpair");
                   agent.ServeConnection(UniqueFd(pair[1]));
                   return UniqueFd(pair[0]);
                 }});
  std::fprintf(stderr, "strata-agent: ready\n");
  while (true) {
    Status s = mux.Run(root->port.get());
    if (!s.ok()) std::fprintf(stderr, "strata-agent: channel: %s\n", s.ToString().c_str());
    // Until the host is back, the port reports a hang-up on every poll.
    while (true) {
      pollfd p{root->port.get(), POLLIN, 0};
      if (::poll(&p, 1, -1) > 0 && !(p.revents & POLLHUP)) break;
      ::usleep(50000);
    }
  }
}
}  // namespace

int main(int argc, char**) {
  // One malloc arena for every thread, given back above 32 KiB of free
  // space at its top: a call's buffers (tens of KiB) would otherwise stay
  // resident in every idle sandbox, in an arena per thread that served one.
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_TRIM_THRESHOLD, 32 << 10);
  if (argc == 1 && strata::launcher::InMicroVm()) MicroVmMain();
  if (argc != 1) {
    std::fprintf(stderr, "usage: strata-agent (with its listening unix socket as descriptor 3)\n");
    return 2;
  }
  // The launcher binds the socket and hands it over (socket activation): it
  // can connect before we run, and its connection waits for our accept.
  int accepting = 0;
  socklen_t len = sizeof accepting;
  if (::getsockopt(kListenFd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) {
    std::fprintf(stderr, "strata-agent: descriptor %d is not a listening socket\n", kListenFd);
    return 1;
  }
  ::fcntl(kListenFd, F_SETFD, FD_CLOEXEC);  // commands must not inherit it
  // Any further descriptors are the commands' cgroup.procs files (one per
  // hierarchy): each command moves itself there before it runs.
  std::vector<int> command_cgroups;
  for (int fd = kListenFd + 1; fd < kListenFd + 16 && ::fcntl(fd, F_GETFD) >= 0; ++fd) {
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    command_cgroups.push_back(fd);
  }
  // Signals: a reaper thread, while there are children, takes them; the
  // launcher ends us with a shutdown request (PID 1 ignores signals it has
  // no handler for).
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // also when not PID 1 (tests)
  strata::launcher::Agent agent(std::move(command_cgroups));
  strata::Status s = agent.Serve(kListenFd);
  std::fprintf(stderr, "strata-agent: %s\n", s.ToString().c_str());
  ::_exit(1);  // (threads may still run: nothing of the agent is destroyed under them)
}
