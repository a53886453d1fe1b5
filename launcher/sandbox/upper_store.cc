// UpperStore on btrfs ioctls.
#include "launcher/sandbox/upper_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::launcher {
namespace {

constexpr uint64_t kFirstFreeObjectId = 256;  // BTRFS_FIRST_FREE_OBJECTID: a subvolume's root directory

Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > BTRFS_PATH_NAME_MAX || name.find('/') != std::string::npos || name[0] == '.') {
    return Error(EINVAL, StrCat("upper volume name ", Quote(name), " is not valid"));
  }
  return OkStatus();
}

// The filesystem's id as sysfs names it (/sys/fs/btrfs/<uuid>).
Result<std::string> FilesystemUuid(int fd) {
  btrfs_ioctl_fs_info_args info{};
  if (::ioctl(fd, BTRFS_IOC_FS_INFO, &info) != 0) return ErrnoError(errno, "ask btrfs for its filesystem id");
  std::string uuid;
  for (int i = 0; i < BTRFS_FSID_SIZE; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    static const char kHex[] = "0123456789abcdef";
    uuid += kHex[info.fsid[i] >> 4];
    uuid += kHex[info.fsid[i] & 15];
  }
  return uuid;
}

Result<uint64_t> SubvolumeId(int fd) {
  btrfs_ioctl_ino_lookup_args args{};
  args.treeid = 0;
  args.objectid = kFirstFreeObjectId;
  if (::ioctl(fd, BTRFS_IOC_INO_LOOKUP, &args) != 0) return ErrnoError(errno, "look up subvolume id");
  return static_cast<uint64_t>(args.treeid);
}

Status DestroySubvolume(const std::string& root, const std::string& name) {
  UniqueFd parent(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent) return ErrnoError(errno, "open " + root);
  btrfs_ioctl_vol_args args{};
  std::strncpy(args.name, name.c_str(), BTRFS_PATH_NAME_MAX);
  if (::ioctl(parent.get(), BTRFS_IOC_SNAP_DESTROY, &args) != 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoError(errno, StrCat("delete subvolume ", root, "/", name));
  }
  return OkStatus();
}

Status QuotasOff(const std::string& path) {
  return Error(ENOTCONN, StrCat("btrfs quotas are off at ", path, " (run `launcher doctor --fix` or `btrfs quota enable ", path, "`)"));
}

// btrfs at `path` (a statfs; no write).
Status CheckBtrfs(const std::string& path) {
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0) {
    return ErrnoError(errno, StrCat("sandbox uppers at ", path, " (run `launcher doctor --fix` to create them)"));
  }
  if (static_cast<unsigned long>(fs.f_type) != BTRFS_SUPER_MAGIC) {
    return Error(ENOTSUP, StrCat("sandbox uppers at ", path,
                                 " are not on btrfs: per-sandbox size caps need btrfs qgroups (run `launcher doctor --fix`)"));
  }
  return OkStatus();
}

}  // namespace

Status CheckUpperFilesystem(const std::string& path) {
  STRATA_RETURN_IF_ERROR(CheckBtrfs(path));
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return ErrnoError(errno, "open " + path);
  // A limit on the top-level qgroup fails with ENOTCONN when quotas are off.
  btrfs_ioctl_qgroup_limit_args probe{};
  probe.qgroupid = 5;  // the top level's own qgroup, which always exists
  probe.lim.flags = 0;
  if (::ioctl(fd.get(), BTRFS_IOC_QGROUP_LIMIT, &probe) != 0 && errno == ENOTCONN) return QuotasOff(path);
  return OkStatus();
}

Status EnableQuotas(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return ErrnoError(errno, "open " + path);
  btrfs_ioctl_quota_ctl_args args{};
  args.cmd = BTRFS_QUOTA_CTL_ENABLE;
  if (::ioctl(fd.get(), BTRFS_IOC_QUOTA_CTL, &args) != 0) return ErrnoError(errno, "enable btrfs quotas on " + path);
  return OkStatus();
}

Result<UpperStore> UpperStore::Open(const std::string& root) {
  // Only the filesystem type: the quota probe is a btrfs write transaction,
  // too dear for every sandbox; Create finds quotas off by itself.
  STRATA_RETURN_IF_ERROR(CheckBtrfs(root));
  UpperStore store;
  store.root_ = root;
  return store;
}

Result<UpperVolume> UpperStore::Create(const std::string& name, uint64_t limit_bytes, uid_t uid, gid_t gid) const {
  STRATA_RETURN_IF_ERROR(CheckName(name));
  UniqueFd parent(::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent) return ErrnoError(errno, "open " + root_);
  btrfs_ioctl_vol_args args{};
  std::strncpy(args.name, name.c_str(), BTRFS_PATH_NAME_MAX);
  if (::ioctl(parent.get(), BTRFS_IOC_SUBVOL_CREATE, &args) != 0) {
    return ErrnoError(errno, StrCat("create subvolume ", root_, "/", name));
  }
  UpperVolume volume;
  volume.root_ = root_;
  volume.name_ = name;
  volume.path_ = root_ + "/" + name;  // from here on the destructor removes it
  UniqueFd sub(::open(volume.path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!sub) return ErrnoError(errno, "open " + volume.path_);
  STRATA_ASSIGN_OR_RETURN(volume.subvol_id_, SubvolumeId(sub.get()));
  if (limit_bytes) {
    btrfs_ioctl_qgroup_limit_args limit{};
    limit.qgroupid = 0;  // the subvolume of the descriptor
    limit.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
    limit.lim.max_rfer = limit_bytes;
    if (::ioctl(sub.get(), BTRFS_IOC_QGROUP_LIMIT, &limit) != 0) {
      if (errno == ENOTCONN) return QuotasOff(root_);
      return ErrnoError(errno, StrCat("limit ", volume.path_, " to ", FormatBytes(limit_bytes)));
    }
  }
  for (const char* d : {"upper", "work"}) {
    if (::mkdirat(sub.get(), d, 0755) != 0) return ErrnoError(errno, StrCat("create ", volume.path_, "/", d));
  }
  if (::fchownat(sub.get(), "upper", uid, gid, 0) != 0) return ErrnoError(errno, "chown " + volume.upper());
  return volume;
}

Result<UpperVolume> UpperStore::Adopt(const std::string& name) const {
  STRATA_RETURN_IF_ERROR(CheckName(name));
  UpperVolume volume;
  volume.root_ = root_;
  volume.name_ = name;
  std::string path = root_ + "/" + name;
  UniqueFd sub(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!sub) return ErrnoError(errno, "open " + path);
  STRATA_ASSIGN_OR_RETURN(volume.subvol_id_, SubvolumeId(sub.get()));
  volume.path_ = path;
  return volume;
}

Result<UpperVolume> UpperStore::Snapshot(const UpperVolume& source, const std::string& name) const {
  STRATA_RETURN_IF_ERROR(CheckName(name));
  const std::string dir = root_ + "/.snapshots";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError(errno, "create " + dir);
  UniqueFd parent(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent) return ErrnoError(errno, "open " + dir);
  UniqueFd src(::open(source.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!src) return ErrnoError(errno, "open " + source.path());
  btrfs_ioctl_vol_args_v2 args{};
  args.fd = src.get();
  args.flags = BTRFS_SUBVOL_RDONLY;
  std::strncpy(args.name, name.c_str(), BTRFS_SUBVOL_NAME_MAX);
  if (::ioctl(parent.get(), BTRFS_IOC_SNAP_CREATE_V2, &args) != 0) {
    return ErrnoError(errno, StrCat("snapshot ", source.path(), " as ", dir, "/", name));
  }
  UpperVolume volume;
  volume.root_ = dir;
  volume.name_ = name;
  volume.path_ = dir + "/" + name;  // from here on the destructor removes it
  UniqueFd sub(::open(volume.path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!sub) return ErrnoError(errno, "open " + volume.path_);
  STRATA_ASSIGN_OR_RETURN(volume.subvol_id_, SubvolumeId(sub.get()));
  return volume;
}

Status UpperStore::RemoveSnapshots(const std::function<bool(std::string_view name)>& mine) const {
  const std::string dir = root_ + "/.snapshots";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return errno == ENOENT ? OkStatus() : ErrnoError(errno, "list " + dir);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.' && mine(e->d_name)) names.push_back(e->d_name);
  }
  ::closedir(d);
  Status first;
  for (const auto& name : names) {
    Status s = DestroySubvolume(dir, name);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Result<std::vector<std::string>> UpperStore::List() const {
  std::vector<std::string> out;
  DIR* dir = ::opendir(root_.c_str());
  if (!dir) return ErrnoError(errno, "list " + root_);
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.' && e->d_type == DT_DIR) out.push_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

UpperVolume::UpperVolume(UpperVolume&& other) noexcept
    : root_(std::move(other.root_)), name_(std::move(other.name_)), path_(std::move(other.path_)), subvol_id_(other.subvol_id_) {
  other.path_.clear();
}

UpperVolume& UpperVolume::operator=(UpperVolume&& other) noexcept {
  if (this != &other) {
    Destroy().IgnoreError();
    root_ = std::move(other.root_);
    name_ = std::move(other.name_);
    path_ = std::move(other.path_);
    subvol_id_ = other.subvol_id_;
    other.path_.clear();
  }
  return *this;
}

UpperVolume::~UpperVolume() {
  Status s = Destroy();
  if (!s.ok()) STRATA_LOG(kWarn) << s.ToString();
}

Result<uint64_t> UpperVolume::UsedBytes() const {
  if (path_.empty()) return Error(ENOENT, "upper volume: none");
  UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(errno, StrCat("open ", path_));
  STRATA_ASSIGN_OR_RETURN(std::string uuid, FilesystemUuid(fd.get()));
  const std::string file = StrCat("/sys/fs/btrfs/", uuid, "/qgroups/0_", subvol_id_, "/referenced");
  auto text = ReadFileToString(file);
  if (!text.ok()) return std::move(text).status().Annotate(StrCat("the disk use of ", path_));
  return static_cast<uint64_t>(std::strtoull(text->c_str(), nullptr, 10));
}

Status UpperVolume::Destroy() {
  if (path_.empty()) return OkStatus();
  path_.clear();
  // The subvolume's qgroup is removed by btrfs once its cleaner has dropped
  // the subvolume (Linux 6.x removes the qgroups of deleted subvolumes).
  return DestroySubvolume(root_, name_);
}

}  // namespace strata::launcher
