// The lazyfs supervisor and its link to the serving process.
//
// `lazyfs daemon` is a small supervisor. It holds the daemon's lock, the
// control socket's listening descriptor and a copy of the /dev/fuse
// descriptor of every FUSE mount, and runs the serving process
// (`lazyfs serve`, the Daemon of daemon.h) as its child. The child sends
// the supervisor every descriptor it should keep (SCM_RIGHTS over a
// SOCK_SEQPACKET socketpair, with the mount's recorded INIT); when the
// child dies — crash, kill -9, OOM — the FUSE connections live on in the
// supervisor's copies, their readers wait, and the supervisor starts a new
// child at once and hands it every descriptor; the child takes the mounts
// over (FuseMount::Adopt) with the state the dead one left in the state
// directory (daemon.h). An upgrade is the same handover to another binary.
//
// The supervisor does no I/O to stores, mounts nothing and parses only its
// own messages, so it has few reasons to crash; if it is killed anyway the
// child dies with it (PR_SET_PDEATHSIG), every connection is cut, and its
// mounts answer errors until `lazyfs umount` or the next daemon removes
// them — the behaviour of a daemon without supervisor.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::lazyfs {

// What the supervisor and the serving process speak; an upgrade to a
// binary that speaks another is refused (the old binary serves on).
inline constexpr int kSupervisorProtocol = 1;
// The serving process exits with this to be replaced (upgrade).
inline constexpr int kExitHandover = 75;

// One message: a JSON object and at most one descriptor.
Status SendMessage(int sock, const nlohmann::json& message, int fd = -1);
// ENODATA when the peer has closed its end.
Result<nlohmann::json> ReceiveMessage(int sock, UniqueFd* fd);

struct SupervisorOptions {
  std::string socket_path;
  std::string state_dir;
  std::string binary;                   // the serving process's executable
  std::vector<std::string> serve_args;  // after `BINARY serve --supervisor-fd N`
  // Called once: when the first serving process serves, or with why none does.
  std::function<void(const Status&)> ready;
};

// Runs until SIGTERM/SIGINT/SIGHUP (passed to the serving process, which
// unmounts everything) or until the serving process exits cleanly.
// Returns the exit code.
int RunSupervisor(const SupervisorOptions& options);

// The serving process's end.
class SupervisorLink {
 public:
  struct Kept {
    UniqueFd fd;
    nlohmann::json meta;
  };
  // Says hello on `fd` (inherited) and receives the welcome and every
  // descriptor the supervisor keeps.
  static Result<std::unique_ptr<SupervisorLink>> Join(int fd);

  // 0 for the first serving process of this supervisor.
  int generation() const { return welcome_.value("generation", 0); }
  const nlohmann::json& welcome() const { return welcome_; }
  // The descriptors handed over, by name ("control", "fuse", "tree:<digest>").
  std::map<std::string, Kept>& kept() { return kept_; }

  // The supervisor keeps a copy of `fd` under `name` (replacing one).
  Status Keep(const std::string& name, int fd, const nlohmann::json& meta = nlohmann::json::object());
  Status Drop(const std::string& name);
  Status Ready();
  // The next serving process runs `binary`; this one exits kExitHandover.
  Status Upgrade(const std::string& binary);

 private:
  Status Send(const nlohmann::json& message, int fd = -1);
  UniqueFd sock_;
  std::mutex mu_;  // one sender at a time
  nlohmann::json welcome_;
  std::map<std::string, Kept> kept_;
};

}  // namespace strata::lazyfs
