// The agent as a microVM's init: before it serves, it builds the sandbox's
// root from the disks the launcher attached (docs/vmm.md, "The guest").
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::launcher {

// Whether this process is a microVM's init: PID 1 with no listening
// socket handed over (in a container the launcher passes one).
bool InMicroVm();

// Mounts /proc, /sys and /dev; each layer's EROFS image (disks "l<i>m",
// blob "l<i>b", bottom first, strata.layers=N on the kernel command line)
// read-only; the upper disk ("upper", ext4); the overlay of them all; then
// makes that the root with /proc, /sys, /dev, /dev/pts, /dev/shm and /tmp
// as a container has them, and cgroup2 at /sys/fs/cgroup with a
// "commands" cgroup whose memory limit leaves the agent and the kernel a
// reserve (so a command that eats the guest's memory meets the OOM killer
// at once, not after the guest thrashed its page cache). The error names
// the step (the launcher reads it from the console).
struct MicroVmRoot {
  // The agent channel: the virtio-serial port named "strata.agent",
  // opened before the switch (the sandbox's /dev has no such node).
  UniqueFd port;
  // The commands' cgroup.procs (for Agent's command cgroups).
  UniqueFd command_cgroup;
  // The upper disk's root directory, which the new root does not show.
  UniqueFd upper;
  // The initramfs's root (O_PATH), hidden by the switch too.
  UniqueFd initramfs;
};
Result<MicroVmRoot> BootMicroVm();

// What the launcher tells the guest once it answers (Frame::kIdentity):
// the sandbox's hostname, the node's clock, entropy for the random
// generator (then reseeded), and its network (once: the address and
// gateway on eth0, the DNS proxy in /etc/resolv.conf). A guest restored
// from a saved state is the saved guest until then; a booted one is
// named "sandbox" and has loopback only.
Status ApplyIdentity(int initramfs, const nlohmann::json& identity);

// What the agent and the kernel keep of a microVM's RAM beside commands.
inline constexpr uint64_t kVmAgentReserve = uint64_t{40} << 20;

// Freezes (true) or thaws (false) the upper disk's filesystem (`upper`:
// MicroVmRoot::upper), for a snapshot of the disk taken from outside.
Status FreezeUpper(int upper, bool freeze);

// Powers the machine off at once (after a fatal error; the console holds why).
[[noreturn]] void PowerOff();

}  // namespace strata::launcher
