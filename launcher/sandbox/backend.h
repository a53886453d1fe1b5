// Backend: what runs a sandbox's root. Sandbox (sandbox.h) keeps what
// every back end shares — its directory and state.json, the layers it holds
// of lazyfs, its network namespace, the agent client (whose socket,
// <dir>/agent/agent.sock, is the same in all of them: a microVM's relay
// listens there) — and asks its Backend for the rest: the root over the
// layers, the upper volume, the machine that runs the agent, and taking
// them down again.
//
//   ContainerBackend (launcher/container/): overlayfs on the host over the
//     idmapped layers and a btrfs upper volume, an OCI runtime (crun) with
//     the agent as init. "container", and "fncall" (the stack read-only,
//     no upper: a function-call pool's).
//   MicroVmBackend (launcher/vm/): a jailed QEMU whose guest mounts the
//     layers' files itself over an ext4 upper disk (vmm/).
//
// Each is listed in the node's BackendTable (below) under the names it
// serves; a new back end (a full VM) adds its kind there, and the daemon,
// the API and the recovery do not change with it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/mount.h"
#include "common/status.h"
#include "launcher/sandbox/agent_client.h"
#include "launcher/net/node_network.h"
#include "launcher/sandbox/spec.h"
#include "launcher/sandbox/upper_store.h"

namespace strata::launcher {

// What Sandbox hands Backend::Start.
struct BackendStart {
  const SandboxSpec& spec;
  // lazyfs's answer to acquire: per layer, bottom first, its idmapped
  // mount ("path") and its two files ("meta", "blob").
  const nlohmann::json& layers;
  // Connects to <dir>/agent/agent.sock, where the back end's agent answers.
  AgentClient& agent;
  // Gives the sandbox a network of the node's (modes allow and open),
  // recorded in its state at once; Sandbox removes it.
  std::function<Result<SandboxNet>()> attach_network;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Whether lazyfs mounts the layers idmapped for the node's range (a
  // container's root is the mapped one; a guest reads the files as they are).
  virtual bool IdmappedLayers() const = 0;
  // Makes the root and starts the agent; returns once the agent answers.
  // What it made before a failure is Destroy's to remove.
  virtual Status Start(const BackendStart& start) = 0;
  // Takes over what an earlier launcher's Start made, from the sandbox's
  // state.json; what is gone stays gone (calls fail, Destroy cleans up).
  virtual void Adopt(const nlohmann::json& state) = 0;

  // OK while the machine that runs the agent is there; else an error
  // (EHOSTDOWN) that says it is gone, and why if it can tell.
  virtual Status Gone() const = 0;
  // Whether the sandbox is there and its agent answers (or, paused, would).
  virtual bool Alive(AgentClient& agent, bool paused) = 0;
  // Whether a warm pool may hand out this running sandbox: its agent is
  // there. Alive where the back end has nothing cheaper.
  virtual bool Takeable(AgentClient& agent) { return Alive(agent, false); }
  // Stops every process (or the whole machine) and continues it.
  virtual Status Pause() = 0;
  virtual Status Resume() = 0;
  // Whether an OOM killer killed a command of the sandbox.
  virtual bool OomKilled(AgentClient& agent) const = 0;

  // The writable layer: a volume on the uppers filesystem (none for fncall).
  virtual const std::optional<UpperVolume>& upper() const = 0;
  // Whether CaptureUpper needs the sandbox paused (Sandbox pauses it, as
  // a caller's pause, for as long as it takes).
  virtual bool SnapshotsWhilePaused() const = 0;
  // A read-only snapshot of the upper volume named `name`, taken while no
  // write can be half on disk; `paused` is the sandbox's state, kept.
  virtual Result<UpperVolume> CaptureUpper(AgentClient& agent, bool paused, const std::string& name) = 0;

  // Stops the machine and removes the root, the upper volume and the
  // cgroups; idempotent. Every step is tried; the first error is returned
  // (each is logged). `agent` is null when there is none to ask to stop.
  virtual Status Destroy(AgentClient* agent) = 0;
  // Lets go of everything without removing it (a restarted daemon adopts it).
  virtual void Release() = 0;
};

// A captured upper opened for reading (packdiff): the directory, the ids
// its files carry (the node's mapped range for a container's, the guest's
// own for a disk image's), and what must stay mounted while it is read.
struct OpenedUpper {
  std::string dir;
  uint32_t id_base = 0, id_count = 0;  // host ids id_base.. are the sandbox's 0..
  MountPoint mount;                    // unmounted (and its directory removed) when it goes
  OpenedUpper() = default;
  OpenedUpper(OpenedUpper&&) = default;
  OpenedUpper& operator=(OpenedUpper&& other) noexcept {
    if (this != &other) {
      Close();
      dir = std::move(other.dir);
      id_base = other.id_base;
      id_count = other.id_count;
      mount = std::move(other.mount);
    }
    return *this;
  }
  ~OpenedUpper() { Close(); }
  // Unmounts `mount` and removes its directory (logged, not returned: the
  // caller has what it read by then).
  void Close();
};

// A kind of back end as the node's table lists it: what it is called, what
// makes one, and what generic code (the daemon, the API, the recovery) asks
// of it instead of comparing names. Each back end's library fills in its
// own (container/, vm/); the node composes the table (launcher/backends/).
struct BackendKind {
  std::string name;
  // The back end of the sandbox `id` whose directory is `dir`.
  std::function<std::unique_ptr<Backend>(const NodeConfig& node, const std::string& id, const std::string& dir)> make;
  // OK when this node can run it; else why not (no guest kernel, ...).
  std::function<Status(const NodeConfig& node)> available = [](const NodeConfig&) { return OkStatus(); };
  // What a sandbox of `spec` takes of the node's memory capacity
  // (--memory-capacity): 0 when it commits none of its own.
  std::function<uint64_t(const SandboxSpec& spec)> memory_commit = [](const SandboxSpec&) { return uint64_t{0}; };
  // Opens what CaptureUpper made, for packdiff; `scratch` is a directory
  // path the kind may mount at (outside the sandbox's directory, which a
  // destroy meanwhile removes). Null: the volume's upper/ as it is, with the
  // node's mapped ids.
  std::function<Result<OpenedUpper>(const NodeConfig& node, const UpperVolume& captured, const std::string& scratch)>
      open_upper;
  // Cleans up what a sandbox of this kind made beside what Sandbox removes
  // itself (cgroups, upper volume, layers, directory), after its launcher
  // died (SweepStaleSandboxes); `state` is its state.json. Null: nothing.
  std::function<void(const NodeConfig& node, const std::string& id, const nlohmann::json& state)> sweep;
  // Every exec is a call: a fresh process in fresh namespaces of one warm,
  // read-only sandbox that the daemon shares among all sandboxes of the
  // same stack and limits (its call pools). Such a sandbox has no upper,
  // and its network is its pool's, fixed at create.
  bool calls = false;
  // Runs an OCI runtime: a create may name one (SandboxSpec::runtime);
  // for other kinds naming one is an error.
  bool oci_runtime = false;
  // Warm pools may keep ready sandboxes of this kind.
  bool warm_pools = false;
  // A warm pool runs one command in a sandbox it made before it counts as
  // ready (a guest's first command pages its agent in).
  bool warm_up = false;
  // Runs a guest machine under the node's accelerator (NodeConfig::vm_accel),
  // which the node's cluster record shows.
  bool machine = false;
};

// The OCI runtime a sandbox of `kind` runs when its create names
// `requested` (NodeConfig::RuntimeFor); empty for a kind that runs none,
// and EINVAL when such a create names one.
Result<std::string> RuntimeOf(const BackendKind& kind, const NodeConfig& node, const std::string& requested);

// The back ends a node offers, by name. Filled once at start; read-only
// (and so safe to share between threads) after.
class BackendTable {
 public:
  // EEXIST for a name already there.
  Status Add(BackendKind kind);
  // The kind named `name`, or EINVAL naming the ones there are.
  Result<const BackendKind*> Find(std::string_view name) const;
  // Every name, in the order added.
  std::vector<std::string> Names() const;
  void ForEach(const std::function<void(const BackendKind&)>& f) const {
    for (const auto& k : kinds_) f(k);
  }
  // The names of those `node` can run now (BackendKind::available).
  std::vector<std::string> Available(const NodeConfig& node) const;

 private:
  std::vector<BackendKind> kinds_;
};

// Runs the sweep of the kind that `state` (a state.json, or null when it is
// lost) names, or of every kind when it names none the node knows (each
// sweep must be harmless where its kind made nothing): what a dead
// launcher's sandbox `id` left beside the generic parts.
void SweepBackend(const NodeConfig& node, const std::string& id, const nlohmann::json& state);

// What a sandbox of `spec` takes of the node's memory capacity: its kind's
// memory_commit (0 for a name the node does not offer).
uint64_t MemoryCommit(const NodeConfig& node, const SandboxSpec& spec);

// Times each step of a sandbox's life: logs it (STRATA_LOG=debug) and adds
// it to the process's sums, which the daemon's metrics show per path and
// step (strata_sandbox_step_seconds; docs/operations.md). `path` names what
// the steps belong to ("create", "container create", "destroy", ...);
// `path` and the step names are string literals.
class StepTimer {
 public:
  StepTimer(std::string id, const char* path) : id_(std::move(id)), path_(path), last_(std::chrono::steady_clock::now()) {}
  void Step(const char* name);

 private:
  std::string id_;
  const char* path_;
  std::chrono::steady_clock::time_point last_;
};

// The sums of every step timed in this process, as Prometheus text: the
// summary strata_sandbox_step_seconds{path, step} (its _sum and _count).
std::string StepMetrics();

// Collects the first error of a sequence of cleanup steps, logging each.
class FirstError {
 public:
  explicit FirstError(std::string what) : what_(std::move(what)) {}
  // Keeps `s` if it is the first error, without logging it (its maker did).
  void Keep(Status s) {
    if (!s.ok() && first_.ok()) first_ = std::move(s);
  }
  void Note(Status s) {
    if (s.ok()) return;
    STRATA_LOG(kWarn) << what_ << ": " << s.ToString();
    if (first_.ok()) first_ = std::move(s);
  }
  Status Take() { return std::move(first_); }

 private:
  std::string what_;
  Status first_;
};

// The sandbox's cgroups (cgroup v1: commands/ below the sandbox's in the
// hierarchies of kCommandControllers, where the caller set a limit there).
inline constexpr const char* kCommandCgroup = "commands";
inline constexpr const char* kCommandControllers[] = {"pids", "memory"};
// Removes the cgroups <parent>/<id> ("relative") in every hierarchy, the
// commands' first: whatever still runs inside is a leftover of the sandbox
// and is killed first.
void RemoveSandboxCgroups(const std::string& relative);

// Merges `changes` into <dir>/state.json (replaced atomically), which
// Sandbox::Adopt and Backend::Adopt read after a restart.
Status MergeSandboxState(const std::string& dir, const nlohmann::json& changes);

// The commands' seccomp program as BPF, compiled once per node and cached
// beside the run directory: what holds a command to the default profile,
// on top of the agent's AgentSeccompProfile() when `agent_filtered` (a
// container's), alone otherwise (a microVM's agent).
Result<std::string> CommandSeccompProgram(const NodeConfig& node, bool agent_filtered);

}  // namespace strata::launcher
