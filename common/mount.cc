// Owned mounts.
#include "common/mount.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "common/strings.h"

namespace strata {

Result<MountPoint> MountPoint::Mount(const std::string& source, const std::string& target, const std::string& fstype,
                                     unsigned long flags, const std::string& data) {
  if (::mount(source.c_str(), target.c_str(), fstype.c_str(), flags, data.empty() ? nullptr : data.c_str()) != 0) {
    return ErrnoError(errno, StrCat("mount ", fstype, " ", source, " at ", target, data.empty() ? "" : " (" + data + ")"));
  }
  return MountPoint(target);
}

MountPoint& MountPoint::operator=(MountPoint&& other) noexcept {
  if (this != &other) {
    Unmount().IgnoreError();
    target_ = std::move(other.target_);
    other.target_.clear();
  }
  return *this;
}

MountPoint::~MountPoint() {
  Status s = Unmount();
  if (!s.ok()) STRATA_LOG(kWarn) << s.ToString();
}

Status MountPoint::Unmount() {
  if (target_.empty()) return OkStatus();
  std::string target = std::exchange(target_, std::string());
  if (::umount2(target.c_str(), UMOUNT_NOFOLLOW) == 0) return OkStatus();
  int err = errno;
  if (err == EINVAL || err == ENOENT) return OkStatus();  // already gone
  if (::umount2(target.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0) {
    return ErrnoError(err, StrCat("unmount ", target, " (detached instead; it goes away when no longer used)"));
  }
  return ErrnoError(errno, StrCat("unmount ", target));
}

namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

std::vector<MountEntry> ListMounts() {
  std::vector<MountEntry> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // id parent dev root mount-point options [optional fields...] - fstype source super-options
    std::istringstream fields(line);
    std::string id, parent, dev, root, mount_point, options, field;
    fields >> id >> parent >> dev >> root >> mount_point >> options;
    while (fields >> field && field != "-") {
    }
    MountEntry e;
    e.mount_point = Unescape(mount_point);
    fields >> e.fstype >> e.source >> e.super_options;
    e.source = Unescape(e.source);
    out.push_back(std::move(e));
  }
  return out;
}

bool IsMountPoint(const std::string& path) {
  // The kernel says so without a read of the mount table, whose length is
  // the node's number of sandboxes. No attributes are asked for and none
  // are synced, so a FUSE server is not asked (one that is gone, or not yet
  // serving, must not hang this); where statx cannot answer, the table
  // decides.
  struct statx stx;
  if (::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC, 0, &stx) == 0) {
    if (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) return (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
  } else if (errno == ENOENT || errno == ENOTDIR) {
    return false;
  }
  for (const auto& m : ListMounts()) {
    if (m.mount_point == path) return true;
  }
  return false;
}

std::vector<std::string> MountsBelow(const std::string& dir) {
  std::vector<std::string> out;
  const std::string prefix = dir.ends_with('/') ? dir : dir + "/";
  for (auto& m : ListMounts()) {
    if (m.mount_point.starts_with(prefix)) out.push_back(std::move(m.mount_point));
  }
  std::stable_sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return out;
}

}  // namespace strata
