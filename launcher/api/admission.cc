// The node's admission of one more sandbox.
#include "launcher/api/admission.h"

#include "common/strings.h"

namespace strata::launcher {

Status AdmitOnNode(const NodeLimits& limits, const NodeLoad& load, uint64_t memory) {
  if (limits.max_sandboxes > 0 && load.sandboxes >= limits.max_sandboxes) {
    return Error(EAGAIN, StrCat("node full: ", limits.max_sandboxes, " sandboxes (--max-sandboxes); retry later or elsewhere"));
  }
  if (limits.memory_capacity > 0 && load.memory_committed + memory > limits.memory_capacity) {
    return Error(EAGAIN, StrCat("node full: sandboxes' memory limits would pass ", FormatBytes(limits.memory_capacity),
                                " (--memory-capacity; ", FormatBytes(load.memory_committed), " committed, this one ",
                                FormatBytes(memory), ")"));
  }
  if (limits.disk_reserve > 0 && load.disk_available < limits.disk_reserve) {
    return Error(EAGAIN, StrCat("node low on disk: ", FormatBytes(load.disk_available), " free on the uppers, below the reserve of ",
                                FormatBytes(limits.disk_reserve), " (--disk-reserve)"));
  }
  if (load.inodes_known && load.inodes_available < kInodeReserve) {
    return Error(EAGAIN, StrCat("node low on inodes: ", load.inodes_available, " free on the uppers"));
  }
  if (load.pids_available < kPidReserve) {
    return Error(EAGAIN, StrCat("node near its process limit: ", load.pids_available,
                                " of kernel.pid_max left (`launcher doctor --fix` raises it)"));
  }
  if (limits.memory_reserve > 0 && load.memory_available < limits.memory_reserve) {
    return Error(EAGAIN, StrCat("node low on memory: ", FormatBytes(load.memory_available), " available",
                                limits.memory_capacity > 0 ? " to sandboxes" : "", ", below the reserve of ",
                                FormatBytes(limits.memory_reserve), " (--memory-reserve)"));
  }
  return OkStatus();
}

}  // namespace strata::launcher
