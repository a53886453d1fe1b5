// SandboxManager: the launcher daemon's sandboxes — create, exec, files,
// pause and resume, snapshot, destroy — with their registry in LMDB so a
// restarted daemon re-adopts the live ones and removes what the dead ones
// left. Thread-safe. It composes the node's units: the registries
// (Registry, registry.h), function-call pools (CallPools, call_pools.h),
// warm pools (WarmPools, warm_pools.h, their policy in warm_policy.h) and
// idempotency keys; its own files hold opening, recovery, creation and
// the node's queries (manager.cc), and execs and the rest of a sandbox's
// life (lifecycle.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/node/call_pools.h"
#include "launcher/node/idempotency.h"
#include "launcher/node/registry.h"
#include "launcher/node/warm_pools.h"
#include "launcher/sandbox/backend.h"
#include "launcher/sandbox/sandbox.h"

namespace strata::launcher {

inline constexpr const char* kDefaultLauncherSocket = "/run/strata/launcher.sock";
inline constexpr const char* kDefaultLauncherState = "/var/lib/strata/launcher";

class SandboxManager {
 public:
  // Opens the registry in `state_dir` and recovers: live sandboxes are
  // adopted, dead or half-made ones removed.
  static Result<std::unique_ptr<SandboxManager>> Open(NodeConfig node, const std::string& state_dir);
  ~SandboxManager();

  // Returns Info() of the new sandbox (id, layers with digests, ...).
  // `owner` is the tenant it belongs to ("" for the operator's); a preset
  // spec.id is used as it is (an idempotent retry names the ids it made).
  Result<nlohmann::json> Create(SandboxSpec spec, const std::string& owner = "");
  Result<ExecResult> Exec(const std::string& id, ExecRequest request, const OutputSink& sink);
  // What Exec would refuse at once (no such sandbox, paused), so a
  // streamed answer can still carry it as its HTTP status.
  Status CheckExec(const std::string& id);

  // Detached commands (the agent's; they outlive this daemon).
  // `pid`: where to put the command's pid as the sandbox sees it (0 from an older agent).
  Result<std::string> StartDetached(const std::string& id, ExecRequest request, const std::string& exec_id,
                                    uint32_t* pid = nullptr);
  Result<std::optional<ExecResult>> Attach(const std::string& id, const std::string& exec_id, uint64_t stdout_offset,
                                           uint64_t stderr_offset, bool follow, const OutputSink& sink, int cancel_fd);
  Result<nlohmann::json> ExecStatus(const std::string& id, const std::string& exec_id, Duration wait);
  Result<nlohmann::json> ListExecs(const std::string& id);
  Status SignalExec(const std::string& id, const std::string& exec_id, int signal);

  // A call on the sandbox: its ttl counts from now.
  void Touch(const std::string& id);
  // The sandbox is destroyed at `deadline_ms` (unix milliseconds; 0: never).
  Status SetDeadline(const std::string& id, int64_t deadline_ms);
  // A call in progress that outlives the handler (a streamed transfer):
  // the ttl does not run out while the returned holder lives, and counts
  // from when it goes. Null when there is no such sandbox.
  std::shared_ptr<void> Hold(const std::string& id);
  // The agent of a container sandbox (for transfers the API layer drives).
  Result<AgentClient> AgentOf(const std::string& id, const char* what);
  // Starts a file upload streamed to the sandbox piece by piece.
  // `user`: the sandbox's user the file is given to (empty: root).
  Result<std::unique_ptr<AgentClient::PutStream>> BeginPut(const std::string& id, const std::string& path, uint32_t mode,
                                                           const std::string& user = "");
  Status Pause(const std::string& id);
  Status Resume(const std::string& id);
  // Freezes the sandbox while its upper volume is snapshotted, thaws it,
  // then packs the snapshot as a diff over the sandbox's stack and
  // publishes it under `tag` (see packdiff). Returns digest, parents,
  // bytes, and how long the sandbox was frozen. The sandbox's denied paths
  // (its hidden files) are left out unless `include_denied`.
  Result<nlohmann::json> Snapshot(const std::string& id, const std::string& tag, std::vector<std::string> excludes,
                                  bool include_denied = false);
  Status Destroy(const std::string& id);
  // The network policy, address and counters; a new policy for a live
  // sandbox (EBADSLT for one without an interface, or of a pool).
  Result<nlohmann::json> Network(const std::string& id);
  Result<nlohmann::json> SetNetwork(const std::string& id, const NetPolicy& policy);
  // What the sandbox uses now (Sandbox::Usage); a function-call sandbox's
  // is its pool's, which all of the pool's sandboxes share ("shared": true).
  Result<nlohmann::json> Usage(const std::string& id);
  Result<nlohmann::json> Info(const std::string& id);
  // Every sandbox, or only those of `owner` when it is set.
  nlohmann::json List(const std::optional<std::string>& owner = std::nullopt);
  size_t Count();
  // Sandboxes by state ("running", "paused"), for the cluster's view.
  std::map<std::string, int64_t> StateCounts();
  // The memory limits (each with the agent's reserve) of every container
  // sandbox, warm pools' ready ones and function-call pools included.
  uint64_t CommittedMemory();
  // The most memory one more warm sandbox would commit (the largest of the
  // pools short of their size; 0 if none is).
  uint64_t WarmFillCommit();
  // Whether a warm pool holds a ready sandbox for `spec` (its memory is in
  // CommittedMemory already; a take may still find it gone).
  bool WarmReadyFor(const SandboxSpec& spec);
  // The sandboxes of `owner`.
  size_t CountOwned(const std::string& owner);
  // The tenant a sandbox belongs to ("" for the operator's), or ENOENT.
  Result<std::string> Owner(const std::string& id);
  // Whether the id is taken (also while the sandbox is made or destroyed).
  bool Exists(const std::string& id);
  // Whether the sandbox is there to be used: not being made or destroyed.
  bool Live(const std::string& id);
  IdempotencyKeys& keys() { return *keys_; }
  // Prometheus text format.
  std::string Metrics();
  const NodeConfig& node() const { return node_; }

  // Warm pools: sandboxes made ahead of time for a layer stack, limits and
  // network, so a create that matches takes one at once (it gets the
  // create's id, env, workdir, file rules and ttl; its upper is unused).
  // Refilled in the background while `WarmAdmission` allows; they give way
  // (their ready sandboxes go) when it says the node is short of memory.
  // Size 0 removes a pool. Returns the pool's description.
  Result<nlohmann::json> SetWarmPool(SandboxSpec spec, int size);
  nlohmann::json WarmPools();
  // Whether the node has room for one more warm sandbox (WarmPools'). Set
  // by the API server, which owns the node's admission settings, and reset
  // to null before it goes (the call returns once no check is running).
  using WarmVerdict = launcher::WarmPools::Verdict;
  void SetWarmAdmission(std::function<WarmVerdict(size_t held)> admit);

  // Recovery report of Open() (for logs and tests).
  struct Recovery {
    int adopted = 0;
    int removed = 0;
    int moved = 0;  // records of an older daemon moved into this boot's registry
  };
  const Recovery& recovery() const { return recovery_; }

 private:
  struct Entry {
    std::mutex mu;  // serializes lifecycle changes (pause, resume, destroy)
    std::shared_ptr<Sandbox> sandbox;  // container back end (an exec keeps a copy)
    std::shared_ptr<CallPools::Pool> pool;  // fncall back end
    SandboxSpec spec;                  // fncall: the caller's (env, workdir)
    std::string id;
    std::string warm_pool;  // the warm pool it was taken from (its sandbox has an id of its own)
    uint64_t memory_commit = 0;  // MemoryCommit of its spec (fixed at create)
    std::string owner;  // tenant; "" for the operator's
    int64_t created = 0;
    int64_t ttl = 0;    // seconds after the last call; 0: none
    std::atomic<int64_t> deadline_ms{0};  // unix milliseconds; 0: none
    std::map<std::string, std::string> labels;
    // Takes the settings a record keeps of `spec` (ttl, deadline, labels).
    void Settle(const SandboxSpec& given);
    // Those settings as a record keeps them, and back.
    static nlohmann::json RecordOf(const SandboxSpec& given);
    void FromRecord(const nlohmann::json& record);
    bool Expired() const;
    std::atomic<int64_t> last_call_ms{0};  // steady clock
    std::atomic<int> busy{0};              // calls in progress
    int64_t ExpiresInMs() const;
    bool gone() const { return !sandbox && !pool; }
    nlohmann::json Info() const;
  };

  struct EntryBusy {
    explicit EntryBusy(Entry& e);
    ~EntryBusy();
    Entry& entry;
  };

  SandboxManager(NodeConfig node) : node_(std::move(node)) {}
  Status Recover();
  // The node's kind of back end named `backend`; null for a name it does
  // not offer.
  const BackendKind* KindOf(const std::string& backend) const;
  Result<nlohmann::json> CreateCall(SandboxSpec spec, const std::string& owner);
  // Destroys sandboxes whose ttl passed.
  void ReapExpired();
  // A ready sandbox of the pool that matches `spec`, made the create's;
  // null when none is ready.
  Result<std::optional<nlohmann::json>> TakeWarm(const SandboxSpec& spec, const std::string& owner);
  Result<std::shared_ptr<Entry>> Find(const std::string& id);
  // The entry's container sandbox, or an error naming why there is none.
  static Result<std::shared_ptr<Sandbox>> Container(Entry& entry, const char* what);
  // A sandbox's record, in this boot's registry (registry_).
  Status Record(const std::string& id, const nlohmann::json& record);
  Status Forget(const std::string& id);

  NodeConfig node_;
  // The lasting registry (warm pools) and this boot's (sandboxes).
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<CallPools> calls_;
  std::unique_ptr<launcher::WarmPools> warm_;
  std::mutex mu_;  // (CallPools' and WarmPools' locks are taken after it, if at all)
  std::map<std::string, std::shared_ptr<Entry>> sandboxes_;
  std::thread reaper_;
  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool stopping_ = false;
  Recovery recovery_;
  std::unique_ptr<IdempotencyKeys> keys_;

  // Metrics.
  std::atomic<uint64_t> snapshot_seq_{0};  // names of snapshot mount points
  std::atomic<uint64_t> creations_{0}, creation_failures_{0}, destructions_{0}, execs_{0}, snapshots_{0};
  std::mutex latency_mu_;
  std::vector<double> exec_ms_;  // recent exec latencies (a ring)
  size_t exec_ms_next_ = 0;
  double exec_ms_sum_ = 0;  // every exec's
};

}  // namespace strata::launcher
