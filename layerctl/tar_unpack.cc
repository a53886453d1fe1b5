// Tar extraction with libarchive, hardened against path escapes.
#include "layerctl/tar_unpack.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::layerctl {
namespace {

constexpr std::string_view kWhiteoutPrefix = ".wh.";
constexpr std::string_view kOpaqueMarker = ".wh..wh..opq";

// Reads the archive from a descriptor and hashes every byte it hands over.
struct Input {
  int fd = -1;
  Hasher hasher;
  uint64_t bytes = 0;
  std::vector<char> buffer = std::vector<char>(1 << 20);
  int error = 0;
};

la_ssize_t ReadCallback(archive*, void* data, const void** out) {
  auto* in = static_cast<Input*>(data);
  while (true) {
    ssize_t n = ::read(in->fd, in->buffer.data(), in->buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      in->error = errno;
      return -1;
    }
    in->hasher.Update(std::span<const char>(in->buffer.data(), static_cast<size_t>(n)));
    in->bytes += static_cast<uint64_t>(n);
    *out = in->buffer.data();
    return n;
  }
}

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_read_free(a); }
};

// Normalizes a tar path to its components: drops "." and empty parts and a
// leading "./"; fails on absolute names and "..".
Result<std::vector<std::string>> Components(std::string_view name, std::string_view what) {
  if (name.starts_with("/")) {
    return Error(EPERM, StrCat(what, " ", Quote(name), ": absolute name would land outside the root; refused"));
  }
  std::vector<std::string> parts;
  for (auto& part : Split(name, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") return Error(EPERM, StrCat(what, " ", Quote(name), ": \"..\" would leave the root; refused"));
    if (part.size() > 255) return Error(ENAMETOOLONG, StrCat(what, " ", Quote(name), ": a component is longer than 255 bytes"));
    parts.push_back(std::move(part));
  }
  return parts;
}

std::string JoinParts(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) out.push_back('/');
    out += parts[i];
  }
  return out.empty() ? "." : out;
}

int OpenBeneath(int root_fd, const std::string& path) {
  open_how how{};
  how.flags = O_DIRECTORY | O_RDONLY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  return static_cast<int>(::syscall(SYS_openat2, root_fd, path.c_str(), &how, sizeof how));
}

class Unpacker {
 public:
  Unpacker(std::string input_name, std::string root) : input_name_(std::move(input_name)), root_(std::move(root)) {}

  Result<UnpackStats> Run(int input_fd);

 private:
  struct DeferredDir {
    std::vector<std::string> parts;
    mode_t mode;
    timespec mtime;
  };

  std::string Where(std::string_view entry) const { return StrCat("unpack ", input_name_, ": entry ", Quote(entry)); }
  // The directory holding parts[0..n), created (0755) where missing. Never
  // follows a symlink.
  Result<UniqueFd> OpenParent(const std::vector<std::string>& parts, size_t n, std::string_view entry);
  Status Extract(archive* a, archive_entry* e);
  Status ApplyMetadata(int parent_fd, const std::string& base, archive_entry* e, bool is_dir, bool is_symlink,
                       std::string_view entry);
  Status RemoveExisting(int parent_fd, const std::vector<std::string>& parts, std::string_view entry);

  std::string input_name_;
  std::string root_;
  UniqueFd root_fd_;
  UnpackStats stats_;
  std::vector<DeferredDir> dirs_;
};

Result<UniqueFd> Unpacker::OpenParent(const std::vector<std::string>& parts, size_t n, std::string_view entry) {
  std::string path = JoinParts(parts, n);
  int fd = OpenBeneath(root_fd_.get(), path);
  if (fd >= 0) return UniqueFd(fd);
  if (errno != ENOENT) {
    if (errno == ELOOP || errno == EXDEV || errno == ENOTDIR) {
      return Error(EPERM, StrCat(Where(entry), ": parent ", Quote(path),
                                 " is a symlink or not a directory; extraction never follows links"));
    }
    return ErrnoError(errno, StrCat(Where(entry), ": open parent ", Quote(path)));
  }
  // Create the missing directories one by one, each beneath the last.
  UniqueFd dir(::dup(root_fd_.get()));
  for (size_t i = 0; i < n; ++i) {
    if (::mkdirat(dir.get(), parts[i].c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError(errno, StrCat(Where(entry), ": create directory ", Quote(JoinParts(parts, i + 1))));
    }
    int next = OpenBeneath(dir.get(), parts[i]);
    if (next < 0) {
      return Error(EPERM, StrCat(Where(entry), ": parent ", Quote(JoinParts(parts, i + 1)),
                                 " is a symlink or not a directory; extraction never follows links"));
    }
    dir.reset(next);
  }
  return dir;
}

Status Unpacker::RemoveExisting(int parent_fd, const std::vector<std::string>& parts, std::string_view entry) {
  const std::string& base = parts.back();
  struct stat st;
  if (::fstatat(parent_fd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return OkStatus();
  if (S_ISDIR(st.st_mode)) return RemoveTree(JoinPath(root_, JoinParts(parts, parts.size())));
  if (::unlinkat(parent_fd, base.c_str(), 0) != 0) return ErrnoError(errno, StrCat(Where(entry), ": replace existing entry"));
  return OkStatus();
}

Status Unpacker::ApplyMetadata(int parent_fd, const std::string& base, archive_entry* e, bool is_dir, bool is_symlink,
                               std::string_view entry) {
  const char* name = base.empty() ? "." : base.c_str();
  if (::fchownat(parent_fd, name, static_cast<uid_t>(archive_entry_uid(e)), static_cast<gid_t>(archive_entry_gid(e)),
                 AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoError(errno, StrCat(Where(entry), ": set owner"));
  }
  // chown clears setuid/setgid, so the mode comes after it; capabilities
  // (an xattr) come after both for the same reason.
  if (!is_symlink && !is_dir && ::fchmodat(parent_fd, name, archive_entry_perm(e), 0) != 0) {
    return ErrnoError(errno, StrCat(Where(entry), ": set mode"));
  }
  std::string proc_path = StrCat("/proc/self/fd/", parent_fd, "/", name);
  archive_entry_xattr_reset(e);
  const char* xname;
  const void* value;
  size_t size;
  while (archive_entry_xattr_next(e, &xname, &value, &size) == ARCHIVE_OK) {
    if (::lsetxattr(proc_path.c_str(), xname, value, size, 0) != 0) {
      return ErrnoError(errno, StrCat(Where(entry), ": set xattr ", xname));
    }
  }
  if (!is_dir) {
    timespec times[2] = {{archive_entry_mtime(e), archive_entry_mtime_nsec(e)},
                         {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}};
    if (::utimensat(parent_fd, name, times, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoError(errno, StrCat(Where(entry), ": set mtime"));
    }
  }
  return OkStatus();
}

Status Unpacker::Extract(archive* a, archive_entry* e) {
  const char* raw = archive_entry_pathname(e);
  std::string entry = raw ? raw : "";
  STRATA_ASSIGN_OR_RETURN(auto parts, Components(entry, StrCat("unpack ", input_name_, ": entry")));
  ++stats_.entries;
  const mode_t type = archive_entry_filetype(e);

  if (parts.empty()) {  // "./": the root directory's own attributes
    if (type != AE_IFDIR) return Error(EINVAL, StrCat(Where(entry), ": the root must be a directory"));
    STRATA_RETURN_IF_ERROR(ApplyMetadata(root_fd_.get(), "", e, true, false, entry));
    dirs_.push_back({{}, archive_entry_perm(e), {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}});
    return OkStatus();
  }

  STRATA_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(parts, parts.size() - 1, entry));
  std::string base = parts.back();

  if (base == kOpaqueMarker) {
    if (::fsetxattr(parent.get(), "trusted.overlay.opaque", "y", 1, 0) != 0) {
      return ErrnoError(errno, StrCat(Where(entry), ": mark directory opaque"));
    }
    return OkStatus();
  }
  if (base.starts_with(kWhiteoutPrefix)) {
    parts.back() = base.substr(kWhiteoutPrefix.size());
    if (parts.back().empty()) return Error(EINVAL, StrCat(Where(entry), ": whiteout without a name"));
    STRATA_RETURN_IF_ERROR(RemoveExisting(parent.get(), parts, entry));
    if (::mknodat(parent.get(), parts.back().c_str(), S_IFCHR | 0, makedev(0, 0)) != 0) {
      return ErrnoError(errno, StrCat(Where(entry), ": create whiteout"));
    }
    return OkStatus();
  }

  if (const char* link = archive_entry_hardlink(e)) {
    STRATA_ASSIGN_OR_RETURN(auto target, Components(link, StrCat(Where(entry), ": hardlink target")));
    if (target.empty()) return Error(EPERM, StrCat(Where(entry), ": hardlink to the root directory; refused"));
    STRATA_ASSIGN_OR_RETURN(UniqueFd target_parent, OpenParent(target, target.size() - 1, entry));
    STRATA_RETURN_IF_ERROR(RemoveExisting(parent.get(), parts, entry));
    if (::linkat(target_parent.get(), target.back().c_str(), parent.get(), base.c_str(), 0) != 0) {
      return ErrnoError(errno, StrCat(Where(entry), ": hardlink to ", Quote(link)));
    }
    return OkStatus();
  }

  struct stat existing;
  bool exists = ::fstatat(parent.get(), base.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0;
  if (exists && !(type == AE_IFDIR && S_ISDIR(existing.st_mode))) {
    STRATA_RETURN_IF_ERROR(RemoveExisting(parent.get(), parts, entry));
  }

  switch (type) {
    case AE_IFREG: {
      int fd = ::openat(parent.get(), base.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) return ErrnoError(errno, StrCat(Where(entry), ": create file"));
      UniqueFd file(fd);
      const void* buf;
      size_t size;
      la_int64_t offset;
      while (true) {
        int r = archive_read_data_block(a, &buf, &size, &offset);
        if (r == ARCHIVE_EOF) break;
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
          return Error(EIO, StrCat(Where(entry), ": read data: ", archive_error_string(a)));
        }
        STRATA_RETURN_IF_ERROR(PwriteFull(file.get(), std::span<const char>(static_cast<const char*>(buf), size),
                                          static_cast<uint64_t>(offset)));
      }
      // Trailing holes of sparse files: the size comes from the header.
      if (::ftruncate(file.get(), archive_entry_size(e)) != 0) {
        return ErrnoError(errno, StrCat(Where(entry), ": set size"));
      }
      ++stats_.regular_files;
      stats_.bytes += static_cast<uint64_t>(archive_entry_size(e));
      break;
    }
    case AE_IFDIR:
      if (!exists && ::mkdirat(parent.get(), base.c_str(), 0700) != 0) {
        return ErrnoError(errno, StrCat(Where(entry), ": create directory"));
      }
      dirs_.push_back({parts, archive_entry_perm(e), {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}});
      break;
    case AE_IFLNK: {
      const char* target = archive_entry_symlink(e);
      if (!target || ::symlinkat(target, parent.get(), base.c_str()) != 0) {
        return ErrnoError(target ? errno : EINVAL, StrCat(Where(entry), ": create symlink"));
      }
      break;
    }
    case AE_IFCHR:
    case AE_IFBLK:
    case AE_IFIFO:
      if (::mknodat(parent.get(), base.c_str(), type | 0600, archive_entry_rdev(e)) != 0) {
        return ErrnoError(errno, StrCat(Where(entry), ": create device or FIFO"));
      }
      break;
    default:
      return Error(EINVAL, StrCat(Where(entry), ": unsupported entry type 0", type));
  }
  return ApplyMetadata(parent.get(), base, e, type == AE_IFDIR, type == AE_IFLNK, entry);
}

Result<UnpackStats> Unpacker::Run(int input_fd) {
  STRATA_ASSIGN_OR_RETURN(root_fd_, OpenFile(root_, O_RDONLY | O_DIRECTORY));
  Input input;
  input.fd = input_fd;
  std::unique_ptr<archive, ArchiveDeleter> a(archive_read_new());
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  archive_read_support_format_gnutar(a.get());
  if (archive_read_open(a.get(), &input, nullptr, ReadCallback, nullptr) != ARCHIVE_OK) {
    return Error(EINVAL, StrCat("unpack ", input_name_, ": ", archive_error_string(a.get())));
  }
  while (true) {
    archive_entry* e;
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      int code = input.error ? input.error : EINVAL;
      return Error(code, StrCat("unpack ", input_name_, ": read archive after ", stats_.entries, " entries: ",
                                archive_error_string(a.get())));
    }
    STRATA_RETURN_IF_ERROR(Extract(a.get(), e));
  }
  // The digest covers the whole input, trailing padding included.
  const void* ignored;
  while (ReadCallback(a.get(), &input, &ignored) > 0) {
  }
  // Directory modes and mtimes last, deepest first, so creating children
  // does not disturb them.
  std::sort(dirs_.begin(), dirs_.end(), [](const DeferredDir& x, const DeferredDir& y) {
    return x.parts.size() > y.parts.size();
  });
  for (const auto& d : dirs_) {
    int fd = d.parts.empty() ? ::dup(root_fd_.get()) : OpenBeneath(root_fd_.get(), JoinParts(d.parts, d.parts.size()));
    if (fd < 0) continue;  // replaced by a later entry
    UniqueFd dir(fd);
    timespec times[2] = {d.mtime, d.mtime};
    if (::fchmod(dir.get(), d.mode) != 0 || ::futimens(dir.get(), times) != 0) {
      return ErrnoError(errno, StrCat("unpack ", input_name_, ": set mode and mtime of directory ",
                                      Quote(JoinParts(d.parts, d.parts.size()))));
    }
  }
  stats_.source = input.hasher.Finish();
  stats_.source_bytes = input.bytes;
  return stats_;
}

}  // namespace

Result<UnpackStats> UnpackTar(const std::string& input, const std::string& root) {
  if (input == "-") return Unpacker("stdin", root).Run(STDIN_FILENO);
  auto fd = OpenFile(input, O_RDONLY);
  if (!fd.ok()) return fd.status().Annotate("unpack tar");
  return Unpacker(input, root).Run(fd->get());
}

}  // namespace strata::layerctl
