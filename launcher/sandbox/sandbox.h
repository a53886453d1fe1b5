// Sandbox: one sandbox's whole life, whatever runs it. Create() resolves
// the layer stack, has lazyfs mount it (once per node, shared), records
// everything in <run>/<id>/state.json as it goes, and has its Backend
// (backend.h: a container or a microVM) build the root and start the
// agent; a failed step leaves what was made to Destroy(), which (or the
// destructor) removes everything the sandbox made. Adopt() takes a sandbox
// over after a daemon restart.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/catalog.h"
#include "launcher/sandbox/agent_client.h"
#include "launcher/net/node_network.h"
#include "launcher/sandbox/ids.h"
#include "launcher/sandbox/spec.h"
#include "launcher/sandbox/upper_store.h"

namespace strata::launcher {

class Backend;
struct BackendKind;

class Sandbox {
 public:
  static Result<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec, const NodeConfig& node);
  // Takes over a managed sandbox from its state directory (after a daemon
  // restart); nothing is created. ENOENT when there is no such sandbox.
  static Result<std::unique_ptr<Sandbox>> Adopt(const std::string& id, const NodeConfig& node);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  const std::string& id() const { return id_; }
  const std::vector<cache::StackLayer>& layers() const { return stack_; }
  AgentClient& agent() { return *agent_; }
  // The protocol version its agent speaks (asked once, then kept: an
  // agent does not change under a sandbox).
  Result<int> AgentVersion();

  // Runs a command through the agent; env and workdir default to the spec's.
  // The sandbox's env, workdir and isolation for a request that leaves them empty.
  void FillDefaults(ExecRequest& request) const;
  Result<ExecResult> Exec(ExecRequest request, const OutputSink& sink);
  // Refuses a request the sandbox's agent would not honour (file rules
  // for an agent older than protocol 3). `request` has its defaults.
  Status CheckAgentFor(const ExecRequest& request);
  // Whether the kernel's OOM killer killed a process in the sandbox.
  bool OomKilled() const;
  // Kills every process in the sandbox (its exec returns).
  void Interrupt();
  // Whether the sandbox's agent answers.
  bool Alive();
  // Whether a warm pool may hand it out (cheaper than Alive where it can).
  bool Takeable();
  // Stops every process (a container's cgroup freezer; a microVM whole)
  // and continues them.
  Status Pause();
  Status Resume();
  bool paused() const { return paused_; }
  // id, backend, layers, limits, state, created: what `ls` and the API show.
  nlohmann::json Info() const;
  const SandboxSpec& spec() const { return spec_; }
  // What kind of back end runs it (its entry in the node's table).
  const BackendKind& kind() const { return *kind_; }
  const std::string& dir() const { return dir_; }
  const NodeConfig& node() const { return node_; }
  // What it uses now, as the node sees it (a microVM: its QEMU, guest RAM
  // and page cache included): {"time": unix seconds, "cpu": {"seconds"
  // used since it started, "limit"}, "created" (Info's), "memory": {"used", "cache" (of used),
  // "limit"}, "disk": {"used" (UpperVolume::UsedBytes), "limit"}}; a
  // figure the node cannot read is left out; a limit of 0 is none.
  nlohmann::json Usage() const;
  // The network policy, with address and counters when it has an interface.
  nlohmann::json NetworkInfo() const;
  // The policy and address only (what Info() shows).
  nlohmann::json NetworkSummary() const;
  // Changes the policy of a sandbox that has an interface (modes allow and
  // open); EBADSLT for one without.
  Status SetNetwork(const NetPolicy& policy);
  // A read-only snapshot of the upper volume, taken while no write can be
  // half on disk (a container's processes or a guest's filesystem frozen,
  // for as short as the snapshot takes). ENOTSUP without an upper.
  Result<UpperVolume> CaptureUpper();
  const std::string& store_url() const { return store_url_; }
  // Gives a sandbox made ahead of time (a warm pool's) the settings of the
  // create that takes it: env, workdir, file rules, kill_leftovers and the
  // time it counts as created from. Its layers, limits and network stay.
  // In memory only: the caller records the returned assignment with the
  // take (its state.json keeps the pool's settings), and after a restart
  // hands it to Reassign.
  nlohmann::json Assign(const SandboxSpec& spec);
  // What Assign gave it, from the take's record.
  Status Reassign(const nlohmann::json& assignment);
  // Removes everything; idempotent. The first error is returned, but every
  // step is attempted.
  Status Destroy();
  // Lets go of the sandbox without removing anything (daemon shutdown: a
  // restarted daemon adopts it again).
  void Release();

 private:
  Sandbox() = default;
  Status Start(const SandboxSpec& spec);
  // A namespace, veth, address and rules of the node's network (modes allow
  // and open), recorded in the state at once.
  Result<SandboxNet> AttachNetwork(const NetPolicy& policy);
  // Merges `changes` into state.json.
  Status SaveState(const nlohmann::json& changes);

  NodeConfig node_;
  SandboxSpec spec_;
  std::string id_, dir_, store_url_;
  int64_t created_ = 0;
  bool paused_ = false;
  std::vector<cache::StackLayer> stack_;
  std::vector<Digest128> held_;       // layers acquired from lazyfs
  std::optional<SandboxNet> net_;     // an interface of its own (allow, open)
  const BackendKind* kind_ = nullptr;  // in node_.backends
  std::unique_ptr<Backend> backend_;  // what runs the root
  std::unique_ptr<AgentClient> agent_;
  bool destroyed_ = false;
  std::atomic<int> agent_version_{0};  // its ping's, once asked
};

// Cleans up after sandboxes whose launcher died (kill -9, power loss):
// every sandbox directory whose owner process is gone.
Status SweepStaleSandboxes(const NodeConfig& node);

// Kills a runtime still creating the container of `bundle` after the daemon
// that started it died: it would finish after the cleanup and leave a
// container nobody owns. (Reads every process's command line.)
void KillRuntimeStragglers(const std::string& bundle);

}  // namespace strata::launcher
