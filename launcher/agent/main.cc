// strata-agent: the in-sandbox agent (static; runs as the sandbox's init).
//   strata-agent, its listening unix socket as descriptor 3
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "launcher/agent/agent.h"

namespace {
constexpr int kListenFd = 3;
}  // namespace

int main(int argc, char**) {
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
  // Signals: the reaper thread takes children; the launcher ends us with a
  // shutdown request (PID 1 ignores signals it has no handler for).
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // also when not PID 1 (tests)
  strata::launcher::Agent agent(std::move(command_cgroups));
  std::thread([&agent] { agent.ReapLoop(); }).detach();
  strata::Status s = agent.Serve(kListenFd);
  std::fprintf(stderr, "strata-agent: %s\n", s.ToString().c_str());
  return 1;
}
