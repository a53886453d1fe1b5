// UpperStore: per-sandbox writable space with a size cap, as btrfs
// subvolumes with qgroup limits on one node-wide btrfs filesystem (this
// kernel has no quota support for XFS or ext4). Subvolume creation and
// removal are single ioctls, so no mkfs per sandbox.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string_view>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::launcher {

inline constexpr const char* kDefaultUppers = "/var/lib/strata/uppers";

// One sandbox's volume: <root>/<name> holding upper/ and work/ for
// overlayfs. Destroyed when the owner goes away.
class UpperVolume {
 public:
  UpperVolume() = default;
  UpperVolume(UpperVolume&& other) noexcept;
  UpperVolume& operator=(UpperVolume&& other) noexcept;
  UpperVolume(const UpperVolume&) = delete;
  UpperVolume& operator=(const UpperVolume&) = delete;
  ~UpperVolume();

  const std::string& path() const { return path_; }
  std::string upper() const { return path_ + "/upper"; }
  std::string work() const { return path_ + "/work"; }
  uint64_t subvolume_id() const { return subvol_id_; }
  // The bytes the volume holds as btrfs accounts them (its qgroup's
  // referenced bytes, which btrfs brings up to date at each transaction
  // commit: within its commit interval, 30 s by default, or a sync).
  Result<uint64_t> UsedBytes() const;
  // Deletes the subvolume (its qgroup goes when btrfs has dropped it).
  Status Destroy();
  // Keeps the volume when the owner goes away (a daemon re-adopts it).
  void Release() { path_.clear(); }

 private:
  friend class UpperStore;
  std::string root_, name_, path_;
  uint64_t subvol_id_ = 0;
};

class UpperStore {
 public:
  // `root` must be a btrfs mount (or a directory on one) with quotas enabled
  // (checked by doctor's CheckUpperFilesystem; Open checks only btrfs, and
  // Create says so when quotas are off).
  static Result<UpperStore> Open(const std::string& root);

  // Creates subvolume `name` limited to `limit_bytes` (0: no limit), with
  // upper/ owned by uid:gid (the sandbox's mapped root) and work/.
  Result<UpperVolume> Create(const std::string& name, uint64_t limit_bytes, uid_t uid, gid_t gid) const;
  // Adopts an existing volume (after a restart).
  Result<UpperVolume> Adopt(const std::string& name) const;
  // Subvolume names under the root.
  Result<std::vector<std::string>> List() const;
  // A read-only snapshot of `source` named `name`, under <root>/.snapshots
  // (List does not show them); its Destroy() deletes it.
  Result<UpperVolume> Snapshot(const UpperVolume& source, const std::string& name) const;
  // Deletes the snapshots (left by a daemon that died while packing one)
  // whose names `mine` accepts.
  Status RemoveSnapshots(const std::function<bool(std::string_view name)>& mine) const;
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

// Whether `path` is on btrfs and has quotas enabled; the error says which
// is missing and how to fix it.
Status CheckUpperFilesystem(const std::string& path);
// Turns quotas on for the btrfs filesystem at `path`.
Status EnableQuotas(const std::string& path);

}  // namespace strata::launcher
