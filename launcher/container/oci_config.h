// The OCI runtime bundle for a container sandbox: namespaces, id mapping,
// cgroup limits, a default seccomp profile, dropped capabilities, masked
// kernel paths, and the agent as the container's init.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/idmap.h"
#include "common/status.h"
#include "launcher/sandbox/spec.h"
#include "launcher/protocol/layout.h"

namespace strata::launcher {

// What the agent keeps beyond the caller's limits, in the sandbox's cgroup
// (its threads, and the grader's execs): the commands' own cgroup below it
// has the caller's limits, so no command can take this.
inline constexpr int64_t kAgentReservePids = 128;
inline constexpr uint64_t kAgentReserveMemory = uint64_t{64} << 20;


// The node's sysfs for sandboxes: mounted once, from a network namespace
// with nothing in it, so /sys/class/net shows no interface of the node's.
inline constexpr const char* kSandboxSysfs = "/run/strata/sysfs";
// An empty read-only tmpfs (one for the node), bound over masked kernel
// directories.
inline constexpr const char* kMaskDir = "/run/strata/empty";
// A tmpfs (one for the node) holding each container's /dev as a directory
// of its own, kSandboxDevs/<id>, bound at /dev: what a sandbox writes there
// (its /dev/shm) is charged to its memory cgroup, as a tmpfs of its own
// would be, without the superblock.
inline constexpr const char* kSandboxDevs = "/run/strata/dev";

struct ContainerConfig {
  std::string id;
  std::string rootfs;                 // the composed overlay
  std::string hostname;
  IdMapping idmap;
  SandboxLimits limits;
  bool host_network = false;          // else a network namespace: netns_path's, or a new one with loopback only
  std::string netns_path;             // a namespace the node made (sandbox networks)
  std::string resolv_conf;            // host file bound at /etc/resolv.conf (read-only)
  std::string cgroup_path;            // "/strata/<id>"
  std::string agent_binary;           // host path, bind-mounted read-only at kAgentPath
  std::string agent_socket_dir;       // host dir, bind-mounted at kAgentSocketDir
  // Node-wide mounts every sandbox binds rather than owning its own (a
  // superblock costs every memory cgroup on the node a slot: see
  // EnsureSharedMounts): /sys, the directories that mask kernel paths, and
  // the tmpfs that holds /dev.
  std::string sysfs = kSandboxSysfs;
  std::string mask_dir = kMaskDir;
  std::string dev_dir;                // the sandbox's directory in kSandboxDevs
  std::vector<std::string> env;       // the agent's (and its commands' default) environment
  // The runtime is crun, and takes what goes beyond the spec: masked
  // kernel directories as binds of mask_dir inside /proc (other runtimes
  // refuse mounts there, and get linux.maskedPaths: a read-only tmpfs, a
  // superblock, per directory), and seccomp_bpf_base64.
  bool crun = true;
  // The default profile compiled to BPF (base64), for crun
  // (run.oci.seccomp_bpf_data); the profile stays in linux.seccomp for
  // the runtimes that compile it themselves.
  std::string seccomp_bpf_base64;
  // A function-call pool's warm container: the root is read-only, and the
  // agent also keeps CAP_NET_ADMIN to give each call fresh namespaces, a
  // private /tmp and the masks below. (Every agent keeps CAP_SYS_ADMIN in
  // the container's user namespace, for file rules; commands and calls run
  // without either, under the default seccomp profile, which the agent's,
  // AgentSeccompProfile(), extends.)
  bool fncall = false;
};

// The bundle. Needs EnsureSharedMounts() to have run on this node (the
// runtime binds config.sysfs and config.mask_dir).
nlohmann::json OciConfig(const ContainerConfig& config);

// Makes kSandboxSysfs, kMaskDir and kSandboxDevs if they are not there yet (they stay for
// the node's lifetime, like the pool of network namespaces). Sandboxes bind
// them instead of mounting a sysfs and a tmpfs per masked directory of
// their own: each superblock registers a memory-cgroup-aware shrinker, and
// every memory cgroup on the node keeps a slot (8 bytes and a bit, in
// kmalloc-1k blocks of 64) for every such shrinker that has existed at
// once since boot — per sandbox a cost that grows with the number of
// sandboxes (docs/benchmarks.md, "density").
Status EnsureSharedMounts();

// The host's devices every container's /dev binds (see MakeSandboxDev).
inline constexpr const char* kSandboxDevices[] = {"null", "zero", "full", "random", "urandom", "tty"};

// A container's /dev: kSandboxDevs/<id>/dev, owned by the sandbox's root
// (uid), with shm (mode 1777), pts and mqueue in it, the usual symlinks,
// and an empty file of the host's root for each of kSandboxDevices, which
// the bundle binds from the host's /dev; <id> (mode 0700) is the sandbox
// root's. Made afresh (whatever was there is removed first). Returns the
// path to bind. RemoveSandboxDev deletes <id> and all in it (the binds are
// gone with the container's mount namespace).
Result<std::string> MakeSandboxDev(const std::string& id, uid_t uid);
Status RemoveSandboxDev(const std::string& id);

}  // namespace strata::launcher
