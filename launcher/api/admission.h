// Whether the node takes one more sandbox: its limits (--max-sandboxes,
// --memory-capacity, --disk-reserve, --memory-reserve, and the inode and
// process reserves) against what it holds and has left. A pure function
// of the figures, so it is tested without a node (admission_test.cc);
// LauncherServer gathers the figures, reserves the slot, and answers a
// refusal with 503 and Retry-After. docs/api.md, "Node".
#pragma once

#include <cstdint>

#include "common/status.h"

namespace strata::launcher {

struct NodeLimits {
  int64_t max_sandboxes = 0;     // 0: no limit
  uint64_t memory_capacity = 0;  // of the sandboxes' memory limits; 0: none
  uint64_t disk_reserve = 0;     // free bytes the uppers keep; 0: none
  uint64_t memory_reserve = 0;   // MemAvailable (to sandboxes) kept; 0: none
};

// Creations are refused with fewer free inodes on the uppers (where the
// filesystem counts them) or process ids left under kernel.pid_max.
inline constexpr uint64_t kInodeReserve = 4096;
inline constexpr uint64_t kPidReserve = 4096;

// What the node holds and has left.
struct NodeLoad {
  int64_t sandboxes = 0;           // running, and admitted creations under way
  uint64_t memory_committed = 0;   // their memory limits, under way ones too
  uint64_t memory_available = 0;   // to sandboxes (read when memory_reserve is set)
  uint64_t disk_available = 0;     // on the uppers
  bool inodes_known = false;       // (btrfs makes inodes as it goes)
  uint64_t inodes_available = 0;
  uint64_t pids_available = UINT64_MAX;
};

// OK, or EAGAIN naming the limit a creation that commits `memory` would
// pass (the first of: sandboxes, memory capacity, disk, inodes, process
// ids, memory reserve).
Status AdmitOnNode(const NodeLimits& limits, const NodeLoad& load, uint64_t memory);

}  // namespace strata::launcher
