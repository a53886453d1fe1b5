// WarmPools: sandboxes made ahead of time for a layer stack, limits and
// network, so that a create that matches takes one at once. Filler threads
// keep each pool at its size while the node's admission allows, and give
// ready sandboxes back when it says memory is short; what they decide is
// warm_policy.h's. A pool is recorded in the lasting registry (it outlives
// a reboot), its ready sandboxes in this boot's (kind "warm"). Thread-safe.
// SandboxManager holds one; a take hands it the sandbox, which it records
// as the create's. docs/api.md, "Warm pools".
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "launcher/node/registry.h"
#include "launcher/sandbox/sandbox.h"

namespace strata::launcher {

class WarmPools {
 public:
  // Whether the node has room for one more warm sandbox: OK, or why not
  // (`shed`: memory is short, so ready ones should go too).
  struct Verdict {
    Status status;
    bool shed = false;
  };
  // A ready sandbox taken for a create, still recorded as the pool's.
  struct Taken {
    std::shared_ptr<Sandbox> sandbox;
    std::string pool;  // the pool's name
  };

  WarmPools(const NodeConfig& node, Registry& registry) : node_(node), registry_(registry) {}
  // Stops the fillers if Stop was not called.
  ~WarmPools();

  // Whether warm pools may keep ready sandboxes of `backend`.
  bool Pooled(const std::string& backend) const;

  // Recovery, before Start: a pool's lasting record (one that cannot be
  // read is forgotten), and a ready sandbox of the pool named `pool`
  // (false: there is no such pool).
  Status Restore(const std::string& key, const nlohmann::json& record);
  // (Takes `sandbox` only then.)
  bool AdoptReady(const std::string& pool, std::unique_ptr<Sandbox>& sandbox);

  // Starts `fillers` filler threads.
  void Start(int fillers);
  // Stops the fillers (abandoning warm-up commands in flight), and lets
  // go of the ready sandboxes: the next daemon adopts them.
  void Stop();

  // Sets a pool's size (0 removes it); returns the pool's description.
  Result<nlohmann::json> Set(SandboxSpec spec, int size);
  nlohmann::json List();
  // How fillers ask for room (null: always). Returns once no call of the
  // one before is running.
  void SetAdmission(std::function<Verdict(size_t held)> admit);

  // A ready sandbox of the pool that matches `spec`, whose agent answers;
  // nullopt when none is ready. The caller records it as the create's
  // (Registry::Rename), then calls Took; or Discard when it cannot.
  std::optional<Taken> Take(const SandboxSpec& spec);
  void Took(const std::string& pool);
  void Discard(Sandbox& sandbox);

  // The memory the ready sandboxes and those being made commit.
  uint64_t CommittedMemory();
  // The most memory one more warm sandbox would commit (the largest of
  // the pools short of their size; 0 if none is).
  uint64_t FillCommit();
  // Whether a pool holds a ready sandbox for `spec`.
  bool ReadyFor(const SandboxSpec& spec);
  // The ids of the ready sandboxes.
  void AddIds(std::set<std::string>& ids);
  // Their gauges and counters, in Prometheus text format.
  void AppendMetrics(std::string& out);

 private:
  // A pool. Ready sandboxes are recorded under their own ids.
  struct Pool {
    std::string name;  // "wp-" and a hash of the key
    std::string key;
    SandboxSpec spec;
    int size = 0;
    std::deque<std::shared_ptr<Sandbox>> ready;
    int filling = 0;
    int removing = 0;  // ready sandboxes being destroyed (shrunk, shed)
    uint64_t taken = 0, made = 0, failures = 0, shed = 0;
    int streak = 0;  // failures in a row (the back-off)
    std::string last_error;
    std::chrono::steady_clock::time_point retry_at{};
    nlohmann::json Info() const;
  };

  Status RecordPool(const Pool& pool);
  // Each filler thread's loop: makes a sandbox for a pool short of ready
  // ones, or removes one no pool wants (shrunk, removed, memory short).
  void Fill();
  // Runs one command in a microVM a pool just made; false if its guest
  // stopped answering (or the pools are stopping).
  bool WarmUpGuest(Sandbox& sb);

  const NodeConfig& node_;
  Registry& registry_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Pool>> pools_;  // by key
  std::mutex admit_mu_;  // held while admit_ runs or changes
  std::function<Verdict(size_t)> admit_;
  std::condition_variable cv_;
  std::vector<std::thread> fillers_;
  bool stopping_ = false;
  // Write ends of the hang-up pipes of warm-up commands in flight (under
  // mu_): stopping closes them, which abandons the commands.
  std::vector<int> warm_up_cancels_;
  std::chrono::steady_clock::time_point last_take_{};
};

// What a ready sandbox must match (the rest a take assigns).
std::string WarmKey(const SandboxSpec& spec);
// A pool's spec as its lasting record keeps it, and back.
nlohmann::json WarmSpecJson(const SandboxSpec& spec);
Result<SandboxSpec> WarmSpecFromJson(const nlohmann::json& j);

}  // namespace strata::launcher
