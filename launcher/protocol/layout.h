// Where the agent and what it reads live inside every sandbox, and the
// kernel paths it hides: one list that the host (the container's bundle,
// the microVM's initramfs) and the guest agent (its calls' and a VM's own
// masks) both read, so the two cannot drift apart.
#pragma once

namespace strata::launcher {

// Kernel paths hidden from (masked) or read-only to sandboxed programs.
inline constexpr const char* kMaskedPaths[] = {
    "/proc/acpi",  "/proc/asound",      "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"};
inline constexpr const char* kReadonlyPaths[] = {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"};

inline constexpr const char* kAgentPath = "/.strata/agent";
inline constexpr const char* kAgentSocketDir = "/.strata/run";
inline constexpr const char* kAgentSocketName = "agent.sock";
// The seccomp program (raw BPF) the agent loads for each command and call:
// in a container CommandOnAgentSeccompProfile(), in a microVM the default
// profile.
inline constexpr const char* kCommandSeccompName = "command.bpf";

}  // namespace strata::launcher
