// The OCI runtime bundle for a container sandbox: namespaces, id mapping,
// cgroup limits, a default seccomp profile, dropped capabilities, masked
// kernel paths, and the agent as the container's init.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/idmap.h"

namespace strata::launcher {

struct ContainerLimits {
  double cpus = 0;          // CPU quota in cores; 0: none. Shares follow it (oversold CPU)
  uint64_t memory = 0;      // bytes; 0: none (swap is never allowed beyond it)
  int64_t pids = 0;         // 0: none
};

struct ContainerConfig {
  std::string id;
  std::string rootfs;                 // the composed overlay
  std::string hostname;
  IdMapping idmap;
  ContainerLimits limits;
  bool host_network = false;          // else a network namespace: netns_path's, or a new one with loopback only
  std::string netns_path;             // a namespace the node made (sandbox networks)
  std::string resolv_conf;            // host file bound at /etc/resolv.conf (read-only)
  std::string cgroup_path;            // "/strata/<id>"
  std::string agent_binary;           // host path, bind-mounted read-only at kAgentPath
  std::string agent_socket_dir;       // host dir, bind-mounted at kAgentSocketDir
  std::vector<std::string> env;       // the agent's (and its commands' default) environment
  // The default profile compiled to BPF (base64), for runtimes that take it
  // (crun's run.oci.seccomp_bpf_data); the profile stays in linux.seccomp
  // for those that do not.
  std::string seccomp_bpf_base64;
  // A function-call pool's warm container: the root is read-only, and the
  // agent keeps CAP_SYS_ADMIN and CAP_NET_ADMIN (in the container's user
  // namespace) to give each call fresh namespaces, a private /tmp and the
  // masks below; the call itself runs without them, under the default
  // seccomp profile (FncallSeccompProfile() is the agent's, a superset).
  bool fncall = false;
};

// Kernel paths hidden from (masked) or read-only to sandboxed programs.
inline constexpr const char* kMaskedPaths[] = {
    "/proc/acpi",  "/proc/asound",      "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"};
inline constexpr const char* kReadonlyPaths[] = {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"};

inline constexpr const char* kAgentPath = "/.strata/agent";
inline constexpr const char* kAgentSocketDir = "/.strata/run";
inline constexpr const char* kAgentSocketName = "agent.sock";
// The seccomp program (raw BPF) a function-call agent loads for each call.
inline constexpr const char* kCallSeccompName = "call.bpf";

nlohmann::json OciConfig(const ContainerConfig& config);

// A default seccomp profile in OCI form: an allowlist of the system calls
// ordinary programs use (like the Docker/Podman default), with clone limited
// to non-namespace flags and clone3 answering ENOSYS so libc falls back.
nlohmann::json DefaultSeccompProfile();
// The default plus what a function-call agent needs to isolate each call
// (unshare, mount, umount2).
nlohmann::json FncallSeccompProfile();

}  // namespace strata::launcher
