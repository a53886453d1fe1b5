// ID mappings and idmapped mounts: how a layer's root-owned files appear as
// the node's mapped container root (host 100000 by default) without copying.
#pragma once

#include <cstdint>
#include <string>

#include "common/mount.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace strata {

// One contiguous range: container ids [container, container+size) are host
// ids [host, host+size). The same range serves uids and gids.
struct IdMapping {
  uint32_t container = 0;
  uint32_t host = 100000;
  uint32_t size = 65536;

  // "0:100000:65536".
  std::string ToString() const;
  static Result<IdMapping> Parse(std::string_view text);
  // The host id of container id `id`, or -1 when outside the range.
  int64_t ToHost(uint32_t id) const {
    return id >= container && id - container < size ? int64_t{host} + (id - container) : -1;
  }
  friend bool operator==(const IdMapping&, const IdMapping&) = default;
};

// A user namespace with `mapping` for uids and gids, held by the returned
// descriptor (no process stays in it).
Result<UniqueFd> CreateUserNamespace(const IdMapping& mapping);

// Clones the mount at `source` and attaches the clone at `target` with its
// ids mapped through `userns_fd` (open_tree + mount_setattr(MOUNT_ATTR_IDMAP)
// + move_mount: util-linux 2.38's X-mount.idmap is silently ignored).
Result<MountPoint> IdmappedMount(const std::string& source, const std::string& target, int userns_fd);

}  // namespace strata
