// The node's own processes (the daemon, and the lazyfs daemon, runtimes
// and tools it starts) beside the sandboxes, not among them: a cgroup of
// their own with a larger CPU weight than all sandboxes together, and an
// OOM score that keeps the kernel's OOM killer on sandboxes first.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata::launcher {

// CPU weight of the node's cgroup: against the sandboxes' parent (1024,
// shared by every sandbox), the daemon gets 8/9 of the CPU when both want
// all of it.
inline constexpr int kNodeCpuShares = 8192;
// The daemon's and lazyfs's oom_score_adj (the kubelet's choice): the last
// processes of the node to go. Sandboxes are set back to 0 (OCI oomScoreAdj).
inline constexpr int kNodeOomScoreAdj = -999;

// The node cgroup's name beside `cgroup_parent` (the sandboxes' parent).
std::string NodeCgroup(const std::string& cgroup_parent);

// Moves this process (all its threads; what it starts later follows) into
// the node cgroup of the cgroup v1 cpu hierarchy, made with
// kNodeCpuShares, then sets its oom_score_adj (on a host without a v1
// cpu hierarchy only that). The error names the step that failed; the
// steps before it hold.
Status PlaceNodeProcesses(const std::string& cgroup_parent);

// Caps the memory of all sandboxes together (their parent cgroup in the
// v1 memory hierarchy, made if missing) at `capacity`: however they
// behave, the kernel reclaims and OOM-kills among them, not the node's
// processes, which are outside it.
Status LimitSandboxMemory(const std::string& cgroup_parent, uint64_t capacity);
// What all sandboxes together use now (their parent's memory.usage_in_bytes; 0 when unknown).
uint64_t SandboxMemoryUsage(const std::string& cgroup_parent);

}  // namespace strata::launcher
