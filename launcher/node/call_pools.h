// CallPools: the node's function-call pools. One warm, read-only sandbox
// per layer stack, limits and tenant, shared by every fncall sandbox
// created with them; each exec is a fresh, isolated call in it. A pool is
// kept warm for a grace period after its last user goes, and recorded in
// this boot's registry (kind "pool") so a restarted daemon re-adopts it.
// Thread-safe. SandboxManager holds one and keeps the fncall sandboxes
// themselves (their entries point at their pool).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "launcher/node/registry.h"
#include "launcher/sandbox/sandbox.h"

namespace strata::launcher {

class CallPools {
 public:
  struct Pool {
    std::string key;
    std::shared_ptr<Sandbox> warm;
    int users = 0;  // (under CallPools' lock)
    std::chrono::steady_clock::time_point idle_since;
  };

  CallPools(const NodeConfig& node, Registry& registry) : node_(node), registry_(registry) {}

  // The pool for `spec` and `owner` with one more user: an existing one,
  // or one made now (a pool whose warm sandbox stopped answering is
  // retired, and goes once its last user does).
  Result<std::shared_ptr<Pool>> Join(const SandboxSpec& spec, const std::string& owner);
  // One user fewer; the grace period starts with the last.
  void Leave(Pool& pool);
  // Destroys the pools unused for longer than the grace period (every
  // unused one with `all`), and retired pools without users.
  void Reap(bool all);
  // The daemon stops: the pools left let go of their sandboxes (the next
  // daemon adopts them).
  void ReleaseAll();

  // Recovery: a pool's warm sandbox, recorded under `key`; and a fncall
  // sandbox of the pool whose warm sandbox is `warm_id` joining it (null:
  // no such pool).
  void Adopt(const std::string& key, std::shared_ptr<Sandbox> warm);
  std::shared_ptr<Pool> Rejoin(const std::string& warm_id);

  size_t Count();
  // The memory the pools' warm sandboxes commit (MemoryCommit).
  uint64_t CommittedMemory();
  // The ids of the pools' warm sandboxes.
  void AddIds(std::set<std::string>& ids);

 private:
  const NodeConfig& node_;
  Registry& registry_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Pool>> pools_;  // by key
  // Pools whose warm sandbox died while sandboxes still used them: no new
  // user joins; removed once the last one is destroyed.
  std::vector<std::shared_ptr<Pool>> retired_;
};

// Function-call pools are not shared across tenants (their calls share a
// cgroup).
std::string PoolKey(const SandboxSpec& spec, const std::string& owner);

}  // namespace strata::launcher
