// A deterministic, symlink-proof walk of a directory tree into the writer.
#include "layerctl/dir_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <utility>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::layerctl {
namespace {

erofs::Attributes AttributesOf(const struct stat& st) {
  return erofs::Attributes{.mode = st.st_mode & 07777,
                    .uid = st.st_uid,
                    .gid = st.st_gid,
                    .mtime = st.st_mtim.tv_sec,
                    .mtime_nsec = static_cast<uint32_t>(st.st_mtim.tv_nsec)};
}

class TreeReader {
 public:
  TreeReader(std::string root, erofs::ImageWriter& writer) : root_(std::move(root)), writer_(writer) {}
  Status Run();

 private:
  std::string Full(const std::string& rel) const { return rel.empty() ? root_ : JoinPath(root_, rel); }
  // Adds every entry of directory `rel`; appends its subdirectories.
  Status ReadDir(const std::string& rel, std::vector<std::string>* subdirs);
  Status AddEntry(int dir_fd, const std::string& name, const std::string& rel, std::vector<std::string>* subdirs);

  std::string root_;
  erofs::ImageWriter& writer_;
  UniqueFd root_fd_;
  // Inodes with several links: the first name they were added under.
  std::map<std::pair<dev_t, ino_t>, std::string> links_;
};

Status TreeReader::Run() {
  STRATA_ASSIGN_OR_RETURN(root_fd_, OpenFile(root_, O_RDONLY | O_DIRECTORY));
  struct stat st;
  if (::fstat(root_fd_.get(), &st) != 0) return ErrnoError(errno, "stat " + root_);
  erofs::Attributes attrs = AttributesOf(st);
  STRATA_ASSIGN_OR_RETURN(attrs.xattrs, ReadXattrs(root_fd_.get(), root_, root_));
  STRATA_RETURN_IF_ERROR(writer_.AddDirectory("", attrs));
  // Depth first; each directory's subdirectories pushed in reverse so they
  // come off the stack in order.
  std::vector<std::string> stack{""};
  std::vector<std::string> subdirs;
  while (!stack.empty()) {
    std::string rel = std::move(stack.back());
    stack.pop_back();
    subdirs.clear();
    STRATA_RETURN_IF_ERROR(ReadDir(rel, &subdirs));
    for (auto it = subdirs.rbegin(); it != subdirs.rend(); ++it) stack.push_back(std::move(*it));
  }
  return OkStatus();
}

Status TreeReader::ReadDir(const std::string& rel, std::vector<std::string>* subdirs) {
  int fd;
  if (rel.empty()) {
    fd = ::dup(root_fd_.get());
  } else {
    open_how how{};
    how.flags = O_DIRECTORY | O_RDONLY | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    do {
      fd = static_cast<int>(::syscall(SYS_openat2, root_fd_.get(), rel.c_str(), &how, sizeof how));
    } while (fd < 0 && errno == EINTR);
  }
  if (fd < 0) return ErrnoError(errno, "open directory " + Full(rel));
  UniqueFd dir_fd(fd);
  // Read the names through a second descriptor: closedir closes it.
  int list_fd = ::dup(dir_fd.get());
  if (list_fd < 0) return ErrnoError(errno, "open directory " + Full(rel));
  DIR* d = ::fdopendir(list_fd);
  if (!d) {
    ::close(list_fd);
    return ErrnoError(errno, "open directory " + Full(rel));
  }
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoError(err, "list directory " + Full(rel));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    STRATA_RETURN_IF_ERROR(AddEntry(dir_fd.get(), name, rel.empty() ? name : rel + "/" + name, subdirs));
  }
  return OkStatus();
}

Status TreeReader::AddEntry(int dir_fd, const std::string& name, const std::string& rel,
                            std::vector<std::string>* subdirs) {
  const std::string full = Full(rel);
  struct stat st;
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return ErrnoError(errno, "stat " + full);
  erofs::Attributes attrs = AttributesOf(st);

  if (S_ISDIR(st.st_mode)) {
    int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "open directory " + full);
    UniqueFd dir(fd);
    STRATA_ASSIGN_OR_RETURN(attrs.xattrs, ReadXattrs(dir.get(), full, full));
    STRATA_RETURN_IF_ERROR(writer_.AddDirectory(rel, attrs));
    subdirs->push_back(rel);
    return OkStatus();
  }

  if (st.st_nlink > 1) {
    auto [it, first] = links_.emplace(std::make_pair(st.st_dev, st.st_ino), rel);
    if (!first) return writer_.AddHardlink(rel, it->second);
  }

  if (S_ISREG(st.st_mode)) {
    // O_NOATIME keeps the walk from touching atimes; only the owner (or
    // CAP_FOWNER) may ask for it.
    int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOATIME);
    if (fd < 0 && errno == EPERM) fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "open " + full);
    UniqueFd file(fd);
    struct stat now;
    if (::fstat(file.get(), &now) != 0) return ErrnoError(errno, "stat " + full);
    if (now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
      return Error(EAGAIN, StrCat("read ", full, ": it was replaced during the walk"));
    }
    STRATA_ASSIGN_OR_RETURN(attrs.xattrs, ReadXattrs(file.get(), full, full));
    return writer_.AddFile(rel, attrs, file.get());
  }

  // Symlinks and special files cannot be opened: their xattrs are read by
  // name, relative to the directory we hold, so no symlink is followed.
  STRATA_ASSIGN_OR_RETURN(attrs.xattrs, ReadXattrs(-1, StrCat("/proc/self/fd/", dir_fd, "/", name), full));
  if (S_ISLNK(st.st_mode)) {
    std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
    while (true) {
      ssize_t n = ::readlinkat(dir_fd, name.c_str(), target.data(), target.size());
      if (n < 0) return ErrnoError(errno, "read symlink " + full);
      if (static_cast<size_t>(n) < target.size()) {
        target.resize(static_cast<size_t>(n));
        break;
      }
      target.resize(target.size() * 2);  // it grew meanwhile
    }
    return writer_.AddSymlink(rel, attrs, target);
  }
  if (S_ISCHR(st.st_mode)) return writer_.AddSpecial(rel, erofs::FileType::kCharDevice, attrs, st.st_rdev);
  if (S_ISBLK(st.st_mode)) return writer_.AddSpecial(rel, erofs::FileType::kBlockDevice, attrs, st.st_rdev);
  if (S_ISFIFO(st.st_mode)) return writer_.AddSpecial(rel, erofs::FileType::kFifo, attrs);
  if (S_ISSOCK(st.st_mode)) return writer_.AddSpecial(rel, erofs::FileType::kSocket, attrs);
  return Error(EINVAL, StrCat("read ", full, ": unknown file type 0", st.st_mode & S_IFMT));
}

}  // namespace

Result<std::vector<erofs::Xattr>> ReadXattrs(int fd, const std::string& access, const std::string& path) {
  auto list = [&](char* buf, size_t size) {
    return fd >= 0 ? ::flistxattr(fd, buf, size) : ::llistxattr(access.c_str(), buf, size);
  };
  auto get = [&](const char* name, void* buf, size_t size) {
    return fd >= 0 ? ::fgetxattr(fd, name, buf, size) : ::lgetxattr(access.c_str(), name, buf, size);
  };
  std::vector<erofs::Xattr> out;
  std::string names;
  while (true) {
    ssize_t n = list(nullptr, 0);
    if (n < 0 && (errno == ENOTSUP || errno == ENODATA)) return out;
    if (n < 0) return ErrnoError(errno, "list xattrs of " + path);
    names.resize(static_cast<size_t>(n));
    n = list(names.data(), names.size());
    if (n < 0 && errno == ERANGE) continue;
    if (n < 0) return ErrnoError(errno, "list xattrs of " + path);
    names.resize(static_cast<size_t>(n));
    break;
  }
  for (size_t pos = 0; pos < names.size();) {
    const std::string name(names.c_str() + pos);
    pos += name.size() + 1;
    std::string value;
    while (true) {
      ssize_t n = get(name.c_str(), nullptr, 0);
      if (n < 0 && errno == ENODATA) break;  // removed meanwhile
      if (n < 0) return ErrnoError(errno, StrCat("read xattr ", name, " of ", path));
      value.resize(static_cast<size_t>(n));
      n = get(name.c_str(), value.data(), value.size());
      if (n < 0 && errno == ERANGE) continue;
      if (n < 0) return ErrnoError(errno, StrCat("read xattr ", name, " of ", path));
      value.resize(static_cast<size_t>(n));
      out.push_back({name, std::move(value)});
      break;
    }
  }
  return out;
}

Status AddDirectoryTree(const std::string& root, erofs::ImageWriter& writer) { return TreeReader(root, writer).Run(); }

}  // namespace strata::layerctl
