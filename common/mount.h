// MountPoint: an owned mount. The owner unmounts it when it goes away (lazily
// with MNT_DETACH if it is busy), so no error path leaves a mount behind.
#pragma once

#include <string>

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

// Whether `path` is the root of a mount (its device differs from its parent's,
// or /proc/self/mountinfo lists it).
bool IsMountPoint(const std::string& path);

}  // namespace strata
