// strata-agent: the in-sandbox agent (static; runs as the sandbox's init).
//   strata-agent --socket PATH
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "launcher/agent.h"

int main(int argc, char** argv) {
  std::string socket_path;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--socket") socket_path = argv[i + 1];
  }
  if (socket_path.empty()) {
    std::fprintf(stderr, "usage: strata-agent --socket PATH\n");
    return 2;
  }
  // Signals: the reaper thread takes children; the launcher ends us with a
  // shutdown request (PID 1 ignores signals it has no handler for).
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGPIPE);
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // also when not PID 1 (tests)

  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || socket_path.size() >= sizeof addr.sun_path) {
    std::fprintf(stderr, "strata-agent: socket %s: %s\n", socket_path.c_str(), std::strerror(errno));
    return 1;
  }
  std::strcpy(addr.sun_path, socket_path.c_str());
  std::string tmp = socket_path + ".tmp";
  std::strcpy(addr.sun_path, tmp.c_str());
  ::unlink(tmp.c_str());
  // Bind under a temporary name and rename: the launcher sees the socket
  // only once it accepts connections.
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0 ||
      ::rename(tmp.c_str(), socket_path.c_str()) != 0) {
    std::fprintf(stderr, "strata-agent: listen on %s: %s\n", socket_path.c_str(), std::strerror(errno));
    return 1;
  }
  strata::launcher::Agent agent;
  std::thread([&agent] { agent.ReapLoop(); }).detach();
  strata::Status s = agent.Serve(fd);
  std::fprintf(stderr, "strata-agent: %s\n", s.ToString().c_str());
  return 1;
}
