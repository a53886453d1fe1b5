// The settings of a node (NodeConfig) and of one sandbox (SandboxSpec),
// which Sandbox and every Backend share.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/idmap.h"
#include "common/status.h"
#include "launcher/protocol/file_rules.h"
#include "launcher/net/node_network.h"
#include "launcher/net/policy.h"
#include "launcher/sandbox/upper_store.h"

namespace strata::launcher {

class BackendTable;

// The back end of a sandbox whose create names none (the API's default).
inline constexpr const char* kDefaultBackend = "container";

// Node-wide settings (not per sandbox).
struct NodeConfig {
  std::string run_dir = "/run/strata/sandboxes";
  std::string uppers = kDefaultUppers;
  std::string lazyfs_socket = "/run/strata/lazyfs.sock";
  std::string cache_dir;        // for starting lazyfs; empty: its default
  std::string agent_binary;     // empty: beside this executable, then /usr/local/lib/strata
  // The OCI runtime of containers and function-call pools whose create
  // names none: a name found on PATH or a path (any runtime taking
  // `run --bundle DIR ID`, the spec's verbs and its config).
  std::string runtime = "crun";
  // The others a create may name (SandboxSpec::runtime): by name only, so
  // no caller of the API picks a program of its own. FromEnvironment fills
  // it with STRATA_RUNTIMES (comma-separated), else with those of crun and
  // runc that are installed.
  std::vector<std::string> runtimes;
  // Containers: strata-nsexec, which the runtime is started through (it
  // mounts the sandbox's root in a mount namespace of its own). Empty:
  // beside this executable, then /usr/local/lib/strata.
  std::string nsexec_binary;
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
  // Templates kept (launcher/vm/vm_templates.h): a microVM of a stack and
  // shape seen before resumes from a saved state instead of booting. 0: off
  // (STRATA_VM_TEMPLATES, `serve --vm-templates`).
  size_t vm_templates = 8;
  // The back ends this node offers (launcher/backends/ composes them);
  // null: none, and every create fails saying so.
  std::shared_ptr<const BackendTable> backends;

  // Fills the defaults that depend on the environment (STRATA_* variables,
  // the agent's location).
  static NodeConfig FromEnvironment();

  // The runtime a create naming `requested` runs: `runtime` when empty or
  // when it names it (by name or path), else the entry of `runtimes` of
  // that name. EINVAL naming those there are for any other.
  Result<std::string> RuntimeFor(const std::string& requested) const;
  // The names a create may give: runtime's, then the others'.
  std::vector<std::string> RuntimeNames() const;
};

// What a sandbox may use (each back end enforces it its own way).
struct SandboxLimits {
  double cpus = 0;          // CPU quota in cores; 0: none. Shares follow it (oversold CPU)
  uint64_t memory = 0;      // bytes; 0: none (swap is never allowed beyond it)
  int64_t pids = 0;         // 0: none
};

struct SandboxSpec {
  std::string id;                   // empty: a new random "sb-..." id
  std::vector<std::string> layers;  // REFs, bottom first
  std::string backend = kDefaultBackend;  // a name of the node's BackendTable
  // The OCI runtime (back ends that run one: containers, function-call
  // pools): a name of NodeConfig::RuntimeNames(); empty: the node's. A
  // created sandbox's spec holds the one it runs.
  std::string runtime;
  std::string store;                // empty: $STRATA_STORE or the default
  SandboxLimits limits;
  uint64_t disk = uint64_t{10} << 30;
  NetPolicy network;                // none (loopback only), allow, open, host
  std::vector<std::string> env;     // for commands
  std::string workdir = "/";
  // The daemon destroys the sandbox this long after the last call on it
  // (0: never). Kept by the daemon, not the sandbox.
  int64_t ttl_seconds = 0;
  // The daemon destroys the sandbox at this time (unix milliseconds),
  // whatever calls it has (0: never); a caller may move it.
  int64_t deadline_ms = 0;
  // The caller's names for it (metadata): kept by the daemon, shown in its
  // description, and what a listing may be filtered by.
  std::map<std::string, std::string> labels;
  // What every command but the grader's may not see or change.
  FileRules files;
  // The default of its execs' kill_leftovers.
  bool kill_leftovers = false;
};

}  // namespace strata::launcher
