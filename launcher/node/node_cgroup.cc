#include "launcher/node/node_cgroup.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::launcher {

namespace {

Status WriteTo(const std::string& path, const std::string& value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return ErrnoError(errno, "open " + path);
  return WriteFull(fd.get(), value).Annotate("write " + path);
}

}  // namespace

std::string NodeCgroup(const std::string& cgroup_parent) { return cgroup_parent + "-node"; }

Status PlaceNodeProcesses(const std::string& cgroup_parent) {
  if (::access("/sys/fs/cgroup/cpu/cgroup.procs", F_OK) == 0) {  // (else no v1 cpu hierarchy)
    const std::string dir = "/sys/fs/cgroup/cpu/" + NodeCgroup(cgroup_parent);
    STRATA_RETURN_IF_ERROR(MakeDirs(dir, 0755).Annotate("node processes: cgroup"));
    STRATA_RETURN_IF_ERROR(WriteTo(dir + "/cpu.shares", StrCat(kNodeCpuShares)).Annotate("node processes: CPU weight"));
    STRATA_RETURN_IF_ERROR(WriteTo(dir + "/cgroup.procs", StrCat(::getpid())).Annotate("node processes: join " + dir));
  }
  // Lowering it takes CAP_SYS_RESOURCE, which some hosts withhold from root.
  return WriteTo("/proc/self/oom_score_adj", StrCat(kNodeOomScoreAdj))
      .Annotate("node processes: OOM score (needs CAP_SYS_RESOURCE)");
}

Status LimitSandboxMemory(const std::string& cgroup_parent, uint64_t capacity) {
  if (::access("/sys/fs/cgroup/memory/cgroup.procs", F_OK) != 0) {
    return Error(ENOTSUP, "--memory-capacity: no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory");
  }
  const std::string dir = "/sys/fs/cgroup/memory/" + cgroup_parent;
  STRATA_RETURN_IF_ERROR(MakeDirs(dir, 0755).Annotate("--memory-capacity: cgroup"));
  STRATA_RETURN_IF_ERROR(WriteTo(dir + "/memory.limit_in_bytes", StrCat(capacity)).Annotate("--memory-capacity"));
  if (::access((dir + "/memory.memsw.limit_in_bytes").c_str(), F_OK) == 0) {
    STRATA_RETURN_IF_ERROR(WriteTo(dir + "/memory.memsw.limit_in_bytes", StrCat(capacity)).Annotate("--memory-capacity"));
  }
  return OkStatus();
}

uint64_t SandboxMemoryUsage(const std::string& cgroup_parent) {
  auto text = ReadFileToString("/sys/fs/cgroup/memory/" + cgroup_parent + "/memory.usage_in_bytes");
  return text.ok() ? std::strtoull(text->c_str(), nullptr, 10) : 0;
}

}  // namespace strata::launcher
