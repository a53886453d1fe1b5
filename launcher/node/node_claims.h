// NodeClaims: the per-node settings a launcher daemon must not share with
// another daemon on the same host (its state, run directory, uppers,
// lazyfs socket and cache, cgroup parent, node name, API socket). Each is
// claimed with a lock file under /run/strata/claims for as long as the
// daemon lives (the kernel drops the lock when it dies, kill -9 included),
// so a second daemon given one of them by mistake refuses to start and
// names it and the daemon that holds it.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "launcher/sandbox/sandbox.h"

namespace strata::launcher {

inline constexpr const char* kClaimsDir = "/run/strata/claims";

class NodeClaims {
 public:
  struct Setting {
    std::string what;   // "--state", "STRATA_UPPERS", "--node": named in the error
    std::string value;  // a path (made absolute and resolved where it exists) or a name
    bool is_path = true;
  };
  // Claims every setting (all or none). EADDRINUSE names the first one
  // another live daemon holds, with that daemon's pid and state directory.
  static Result<NodeClaims> Take(const std::vector<Setting>& settings, const std::string& holder,
                                 const std::string& dir = kClaimsDir);

 private:
  std::vector<UniqueFd> locks_;
};

// Claims every per-node setting a node daemon of `node` uses.
Result<NodeClaims> ClaimDaemonSettings(const NodeConfig& node, const std::string& state_dir, const std::string& api_socket);

}  // namespace strata::launcher
