// Sandbox: one container sandbox's whole life. Create() composes the layers
// (shared, idmapped lazyfs mounts), an overlay over them with a size-capped
// upper volume, an OCI bundle, and starts the runtime with the agent as
// init; every step is undone in reverse when a later one fails, and
// Destroy() (or the destructor) removes everything the sandbox made.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/catalog.h"
#include "common/idmap.h"
#include "common/mount.h"
#include "common/subprocess.h"
#include "launcher/agent_client.h"
#include "launcher/container/oci_config.h"
#include "launcher/container/upper_store.h"
#include "launcher/net/node_network.h"
#include "launcher/vm/microvm.h"

namespace strata::launcher {

// Node-wide settings (not per sandbox).
struct NodeConfig {
  std::string run_dir = "/run/strata/sandboxes";
  std::string uppers = kDefaultUppers;
  std::string lazyfs_socket = "/run/strata/lazyfs.sock";
  std::string cache_dir;        // for starting lazyfs; empty: its default
  std::string agent_binary;     // empty: beside this executable, then /usr/local/lib/strata
  std::string runtime = "crun";  // any OCI runtime taking `run --bundle DIR ID`
  IdMapping idmap;
  std::string cgroup_parent = "strata";
  // The node's name in a cluster (`serve --node`): sandbox ids carry it
  // ("sb-<name>-<hex>") so a gateway routes a call by the id alone. Empty:
  // ids are "sb-<hex>".
  std::string name;
  // Sandboxes of the launcher daemon: the runtime runs detached (no process
  // per sandbox waits on it), and a restarted daemon re-adopts them, so the
  // sweep of dead one-shot launchers leaves them alone.
  bool managed = false;
  // Sandbox networks (modes allow and open): the daemon's; null elsewhere.
  std::shared_ptr<NodeNetwork> network;
  std::string network_off_reason;  // why `network` is null in a daemon
  // microVMs: the guest kernel (vmlinux), the accelerator ("kvm" or
  // "tcg", as `launcher doctor` found), strata-jail, and where the
  // initramfs is cached.
  std::string vm_kernel = "/var/cache/strata/guest-kernel/vmlinux";
  std::string vm_accel;  // empty: what doctor recorded, else tcg
  std::string jail_binary;
  std::string vm_cache = "/var/cache/strata/vm";
  // How long a create waits for a booting guest's agent before it fails
  // (STRATA_VM_BOOT_TIMEOUT, seconds): TCG on a busy node takes seconds.
  std::chrono::seconds vm_boot_timeout{90};

  // Fills the defaults that depend on the environment (STRATA_* variables,
  // the agent's location).
  static NodeConfig FromEnvironment();
};

struct SandboxSpec {
  std::string id;                   // empty: a new random "sb-..." id
  std::vector<std::string> layers;  // REFs, bottom first
  std::string backend = "container";  // or "fncall", "microvm"
  std::string store;                // empty: $STRATA_STORE or the default
  ContainerLimits limits;
  uint64_t disk = uint64_t{10} << 30;
  NetPolicy network;                // none (loopback only), allow, open, host
  std::vector<std::string> env;     // for commands
  std::string workdir = "/";
  // The daemon destroys the sandbox this long after the last call on it
  // (0: never). Kept by the daemon, not the sandbox.
  int64_t ttl_seconds = 0;
  // What every command but the grader's may not see or change.
  FileRules files;
  // The default of its execs' kill_leftovers.
  bool kill_leftovers = false;
};

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
  const std::string& rootfs() const { return rootfs_; }
  AgentClient& agent() { return *agent_; }

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
  // Freezes or thaws every process (cgroup freezer, through the runtime).
  Status Pause();
  Status Resume();
  bool paused() const { return paused_; }
  // id, backend, layers, limits, state, created: what `ls` and the API show.
  nlohmann::json Info() const;
  const SandboxSpec& spec() const { return spec_; }
  const std::string& dir() const { return dir_; }
  // The upper volume (for snapshots).
  const std::optional<UpperVolume>& upper() const { return upper_; }
  const NodeConfig& node() const { return node_; }
  // The network policy, with address and counters when it has an interface.
  nlohmann::json NetworkInfo() const;
  // The policy and address only (what Info() shows).
  nlohmann::json NetworkSummary() const;
  // Changes the policy of a sandbox that has an interface (modes allow and
  // open); EBADSLT for one without.
  Status SetNetwork(const NetPolicy& policy);
  // A read-only snapshot of the upper volume, taken with every process of
  // the sandbox frozen (for as short as the snapshot takes).
  Result<UpperVolume> CaptureUpper();
  const std::string& store_url() const { return store_url_; }
  // Gives a sandbox made ahead of time (a warm pool's) the settings of the
  // create that takes it: env, workdir, file rules, kill_leftovers and the
  // time it counts as created from. Its layers, limits and network stay.
  Status Assign(const SandboxSpec& spec);
  // Removes everything; idempotent. The first error is returned, but every
  // step is attempted.
  Status Destroy();
  // Lets go of the sandbox without removing anything (daemon shutdown: a
  // restarted daemon adopts it again).
  void Release();

 private:
  Sandbox() = default;
  Status Start(const SandboxSpec& spec);
  // The microVM back end's steps 3-6 (the layers are acquired): an upper
  // disk, the guest, its agent.
  Status StartMicroVm(const SandboxSpec& spec, const nlohmann::json& layers);
  // A namespace, veth, address and rules of the node's network (modes allow
  // and open), recorded in the state at once.
  Status AttachNetwork(const NetPolicy& policy);
  // An error for a call on a microVM whose guest is gone (null if it runs).
  Status VmGone() const;
  std::string CgroupDir(const std::string& controller) const;
  // Merges `changes` into state.json.
  Status SaveState(const nlohmann::json& changes);

  NodeConfig node_;
  SandboxSpec spec_;
  std::string id_, dir_, rootfs_, store_url_;
  int64_t created_ = 0;
  bool paused_ = false;
  std::vector<cache::StackLayer> stack_;
  std::vector<Digest128> held_;       // layers acquired from lazyfs
  std::optional<UpperVolume> upper_;
  std::optional<SandboxNet> net_;     // an interface of its own (allow, open)
  MountPoint overlay_;
  std::optional<Subprocess> runtime_;
  std::unique_ptr<AgentClient> agent_;
  std::unique_ptr<MicroVm> vm_;       // the microVM back end's guest
  bool destroyed_ = false;
  std::atomic<int> agent_version_{0};  // its ping's, once asked
};

// What a microVM takes beside its guest RAM (QEMU; vmm::QemuOverhead under TCG).
inline constexpr uint64_t kVmOverheadCommit = uint64_t{160} << 20;

// What a container sandbox of `spec` takes of the node's memory capacity:
// its cgroup's limit, the memory limit and the agent's reserve beside it;
// none without a limit (and none for a function call, whose pool holds it).
inline uint64_t MemoryCommit(const SandboxSpec& spec) {
  if (spec.backend == "microvm") return (spec.limits.memory ? spec.limits.memory : kDefaultVmMemory) + kVmOverheadCommit;
  return spec.limits.memory > 0 && spec.backend == "container" ? spec.limits.memory + kAgentReserveMemory : 0;
}

// A new random sandbox id: "sb-" and 12 hex digits, or with a node name
// "sb-<node>-" and 12 hex digits.
std::string NewSandboxId(std::string_view node = {});
// The node a sandbox id names ("" for an id without one, or not an id).
std::string SandboxIdNode(std::string_view id);
// Whether `name` may be a node name: 1-20 of a-z, 0-9 and '-', starting
// with a letter or digit (sandbox ids and their socket paths stay short).
Status CheckNodeName(std::string_view name);

// Cleans up after sandboxes whose launcher died (kill -9, power loss):
// every sandbox directory whose owner process is gone.
Status SweepStaleSandboxes(const NodeConfig& node);

// Kills a runtime still creating the container of `bundle` after the daemon
// that started it died: it would finish after the cleanup and leave a
// container nobody owns. (Reads every process's command line.)
void KillRuntimeStragglers(const std::string& bundle);

}  // namespace strata::launcher
