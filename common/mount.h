// MountPoint: an owned mount. The owner unmounts it when it goes away (lazily
// with MNT_DETACH if it is busy), so no error path leaves a mount behind.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace strata {

class MountPoint {
 public:
  // mount(2) without mount(8): no helper runs, no loop device appears.
  static Result<MountPoint> Mount(const std::string& source, const std::string& target, const std::string& fstype,
                                  unsigned long flags, const std::string& data);
  // Takes ownership of an existing mount at `target`.
  static MountPoint Adopt(std::string target) { return MountPoint(std::move(target)); }

  MountPoint() = default;
  MountPoint(MountPoint&& other) noexcept : target_(std::move(other.target_)) { other.target_.clear(); }
  MountPoint& operator=(MountPoint&& other) noexcept;
  MountPoint(const MountPoint&) = delete;
  MountPoint& operator=(const MountPoint&) = delete;
  ~MountPoint();

  const std::string& target() const { return target_; }
  bool mounted() const { return !target_.empty(); }
  // Unmounts now; a busy mount is detached (MNT_DETACH) and the error says so.
  Status Unmount();
  // Gives up ownership without unmounting.
  std::string Release() { return std::exchange(target_, std::string()); }

 private:
  explicit MountPoint(std::string target) : target_(std::move(target)) {}
  std::string target_;
};

// Whether `path` is a mount point (statx's STATX_ATTR_MOUNT_ROOT; where
// that cannot answer, whether /proc/self/mountinfo lists it).
bool IsMountPoint(const std::string& path);

// One line of /proc/self/mountinfo, unescaped.
struct MountEntry {
  std::string mount_point;
  std::string fstype;
  std::string source;
  std::string super_options;  // the filesystem's own options, comma-separated
};
std::vector<MountEntry> ListMounts();
// Mount points strictly below `dir`, deepest first (the order to unmount in).
std::vector<std::string> MountsBelow(const std::string& dir);

}  // namespace strata
