// An overlayfs upper directory, read in layer terms.
#include "packdiff/upper_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "layerctl/dir_reader.h"

namespace strata::packdiff {

// A directory still to read: where it is, its node, and the path its
// merged lower directory has in the parents (nullopt when nothing below
// shows through it).
struct UpperReader::Pending {
  std::string rel;
  ChangeNode* node = nullptr;
  std::optional<std::string> lower;
  bool materialize = false;  // its lower content is not at its own path: copy it in
};

namespace {

constexpr const char* kProtattrXattr = "trusted.overlay.protattr";

std::string Join2(std::string_view dir, std::string_view name) {
  return dir.empty() ? std::string(name) : StrCat(dir, "/", name);
}

int OpenBeneath(int root_fd, const std::string& rel, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  int fd;
  do {
    fd = static_cast<int>(::syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof how));
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// The lower path (relative to the layers' root, "" for the root) a
// trusted.overlay.redirect value names, as overlayfs follows it: absolute
// from the root of the layers, or relative: another name in the lower
// directory of the entry's parent. nullopt when a relative redirect sits
// in a directory that has nothing below it.
Result<std::optional<std::string>> RedirectTarget(const std::string& rel, std::string_view redirect,
                                                  const std::optional<std::string>& parent_lower) {
  auto bad = [&](std::string_view why) {
    return Error(EINVAL, StrCat("upper entry ", Quote(rel), ": trusted.overlay.redirect ", Quote(redirect), " ", why,
                                "; refusing an entry overlayfs would not resolve inside the layers"));
  };
  if (redirect.empty()) return bad("is empty");
  if (redirect.find('\0') != std::string_view::npos) return bad("contains a NUL byte");
  if (redirect.front() != '/') {
    if (redirect.find('/') != std::string_view::npos) return bad("is relative but has a '/'");
    if (redirect == "." || redirect == "..") return bad("names . or ..");
    if (!parent_lower) return std::optional<std::string>();
    return std::optional<std::string>(Join2(*parent_lower, redirect));
  }
  std::vector<std::string> parts = Split(redirect.substr(1), '/');
  for (const std::string& part : parts) {
    if (part.empty()) return bad("has an empty component");
    if (part == "." || part == "..") return bad("has a . or .. component");
  }
  return std::optional<std::string>(Join(parts, "/"));
}

}  // namespace

bool Excluded(const std::vector<std::string>& globs, std::string_view rel) {
  const std::string path(rel);
  const std::string base(Basename(rel));
  for (std::string glob : globs) {
    while (glob.size() > 1 && glob.back() == '/') glob.pop_back();
    if (glob.find('/') == std::string::npos) {
      if (::fnmatch(glob.c_str(), base.c_str(), 0) == 0) return true;
      continue;
    }
    while (!glob.empty() && glob.front() == '/') glob.erase(0, 1);
    if (::fnmatch(glob.c_str(), path.c_str(), 0) == 0) return true;
  }
  return false;
}

Result<std::unique_ptr<UpperReader>> UpperReader::Open(const UpperOptions& options, const LowerStack& parents) {
  std::unique_ptr<UpperReader> r(new UpperReader(options, parents));
  STRATA_ASSIGN_OR_RETURN(r->root_fd_, strata::OpenFile(options.upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  return r;
}

Result<UniqueFd> UpperReader::OpenDir(const std::string& rel) const {
  int fd = rel.empty() ? ::fcntl(root_fd_.get(), F_DUPFD_CLOEXEC, 0) : OpenBeneath(root_fd_.get(), rel, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ErrnoError(errno, StrCat("open upper directory ", Quote(Join2(options_.upper, rel))));
  return UniqueFd(fd);
}

Result<UniqueFd> UpperReader::OpenFile(const std::string& rel) const {
  // O_NOATIME keeps the read from touching atimes; only the owner (or
  // CAP_FOWNER) may ask for it.
  int fd = OpenBeneath(root_fd_.get(), rel, O_RDONLY | O_NOFOLLOW | O_NOATIME);
  if (fd < 0 && errno == EPERM) fd = OpenBeneath(root_fd_.get(), rel, O_RDONLY | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT || errno == ELOOP || errno == EXDEV) {
      return UpperChanged("file", rel, "after it was listed", "it is gone, or a symlink now stands in its path");
    }
    return ErrnoError(errno, StrCat("open upper file ", Quote(Join2(options_.upper, rel))));
  }
  return UniqueFd(fd);
}

Result<std::shared_ptr<ChangeNode>> UpperReader::Read() {
  struct stat st;
  if (::fstat(root_fd_.get(), &st) != 0) return ErrnoError(errno, "stat upper directory " + options_.upper);
  STRATA_ASSIGN_OR_RETURN(auto xattrs, layerctl::ReadXattrs(root_fd_.get(), options_.upper, options_.upper));
  std::string opaque;
  std::vector<erofs::Xattr> kept;
  for (auto& x : xattrs) {
    if (x.name == kOpaqueXattr) opaque = x.value;
    if (!IsOverlayPrivateXattr(x.name)) kept.push_back(std::move(x));
  }
  STRATA_ASSIGN_OR_RETURN(erofs::Attributes attrs, Attributes("", st, std::move(kept)));
  auto root = NewDirectory(attrs);
  root->opaque = opaque == "y";
  std::vector<Pending> stack;
  stack.push_back({"", root.get(), root->opaque ? std::nullopt : std::optional<std::string>(""), false});
  std::vector<Pending> subdirs;
  while (!stack.empty()) {
    Pending dir = std::move(stack.back());
    stack.pop_back();
    subdirs.clear();
    STRATA_RETURN_IF_ERROR(ReadDir(dir, &subdirs));
    for (auto it = subdirs.rbegin(); it != subdirs.rend(); ++it) stack.push_back(std::move(*it));
  }
  return root;
}

Status UpperReader::ReadDir(Pending& dir, std::vector<Pending>* subdirs) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenDir(dir.rel));
  ListedDir listed{dir.rel, {}, {}};
  if (::fstat(fd.get(), &listed.st) != 0) return ErrnoError(errno, "stat upper directory " + Quote(dir.rel));
  // Read the names through a second descriptor: closedir closes it.
  int list_fd = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  DIR* d = list_fd < 0 ? nullptr : ::fdopendir(list_fd);
  if (!d) {
    const int err = errno;
    if (list_fd >= 0) ::close(list_fd);
    return ErrnoError(err, "list upper directory " + Quote(Join2(options_.upper, dir.rel)));
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
  if (err != 0) return ErrnoError(err, "list upper directory " + Quote(Join2(options_.upper, dir.rel)));
  std::sort(names.begin(), names.end());

  for (const std::string& name : names) {
    const std::string rel = Join2(dir.rel, name);
    if (Excluded(options_.excludes, rel)) {
      ++stats_.excluded;
      continue;
    }
    struct stat st;
    if (::fstatat(fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return UpperChanged("entry", rel, "while it was listed", "it is gone");
      return ErrnoError(errno, "stat upper entry " + Quote(rel));
    }
    listed.entries.push_back({name, st});
    ++stats_.entries;
    const bool whiteout_device = S_ISCHR(st.st_mode) && st.st_rdev == 0;
    const bool linked = !S_ISDIR(st.st_mode) && st.st_nlink > 1 && !whiteout_device;
    if (linked) {
      auto it = links_.find({st.st_dev, st.st_ino});
      if (it != links_.end()) {
        dir.node->children[name] = it->second;
        continue;
      }
    }
    std::shared_ptr<ChangeNode> node;
    std::optional<std::string> child_lower;
    STRATA_RETURN_IF_ERROR(Translate(rel, st, fd.get(), name, dir, &node, &child_lower));
    dir.node->children[name] = node;
    if (linked && node->kind != EntryKind::kWhiteout) links_[{st.st_dev, st.st_ino}] = node;
    if (node->kind == EntryKind::kDirectory) {
      const bool materialize = child_lower && *child_lower != rel;
      if (materialize) node->opaque = true;
      subdirs->push_back({rel, node.get(), std::move(child_lower), materialize});
    }
  }
  listed_.push_back(std::move(listed));

  if (dir.materialize) {
    STRATA_ASSIGN_OR_RETURN(std::optional<MergedEntry> lower, parents_.Lookup(*dir.lower));
    if (lower && lower->is_dir) {
      STRATA_RETURN_IF_ERROR(AddLower(*dir.node, *lower, dir.rel).Annotate(
          StrCat("upper directory ", Quote(dir.rel), ": copy in what it showed from ", Quote("/" + *dir.lower),
                 " in the parents")));
    }
  }
  return OkStatus();
}

Status UpperReader::Translate(const std::string& rel, const struct stat& st, int dir_fd, const std::string& name,
                              const Pending& parent, std::shared_ptr<ChangeNode>* out,
                              std::optional<std::string>* child_lower) {
  auto node = std::make_shared<ChangeNode>();
  *out = node;
  if (S_ISCHR(st.st_mode) && st.st_rdev == 0) {
    node->kind = EntryKind::kWhiteout;
    return OkStatus();
  }
  if (S_ISSOCK(st.st_mode)) {
    // A socket outlives nothing that listened on it: not packed. As a
    // whiteout it also hides whatever the parents have at this path (it is
    // dropped when they have nothing).
    ++stats_.sockets;
    node->kind = EntryKind::kWhiteout;
    return OkStatus();
  }
  const std::string full = Join2(options_.upper, rel);
  STRATA_ASSIGN_OR_RETURN(auto xattrs, layerctl::ReadXattrs(-1, StrCat("/proc/self/fd/", dir_fd, "/", name), full));
  std::optional<std::string> opaque, redirect;
  bool metacopy = false, xwhiteout = false, protattr = false;
  std::vector<erofs::Xattr> kept;
  for (auto& x : xattrs) {
    if (x.name == kOpaqueXattr) opaque = x.value;
    if (x.name == kRedirectXattr) redirect = x.value;
    if (x.name == kMetacopyXattr) metacopy = true;
    if (x.name == kWhiteoutXattr) xwhiteout = true;
    if (x.name == kProtattrXattr) protattr = true;
    if (!IsOverlayPrivateXattr(x.name)) kept.push_back(std::move(x));
  }
  if (S_ISREG(st.st_mode) && st.st_size == 0 && xwhiteout) {
    node->kind = EntryKind::kWhiteout;
    return OkStatus();
  }
  if (protattr) {
    ++stats_.flags_dropped;
    STRATA_LOG(kWarn) << "upper entry " << Quote(rel)
                      << ": its immutable/append-only flags (trusted.overlay.protattr) are not packed; "
                         "EROFS layers cannot hold inode flags";
  }
  STRATA_ASSIGN_OR_RETURN(node->attrs, Attributes(rel, st, std::move(kept)));

  if (S_ISDIR(st.st_mode)) {
    node->kind = EntryKind::kDirectory;
    node->opaque = opaque == "y";
    if (node->opaque) {
      child_lower->reset();
    } else if (redirect) {
      STRATA_ASSIGN_OR_RETURN(*child_lower, RedirectTarget(rel, *redirect, parent.lower));
      ++stats_.redirects_resolved;
    } else if (parent.lower) {
      *child_lower = Join2(*parent.lower, name);
    }
    return OkStatus();
  }
  if (S_ISREG(st.st_mode)) {
    node->kind = EntryKind::kRegular;
    node->size = static_cast<uint64_t>(st.st_size);
    if (!metacopy) {
      node->data.upper_path = rel;
      node->data.listed = st;
      return OkStatus();
    }
    // Metadata only: the data is the lower file overlayfs found for it.
    std::optional<std::string> data_path;
    if (redirect) {
      STRATA_ASSIGN_OR_RETURN(data_path, RedirectTarget(rel, *redirect, parent.lower));
    } else if (parent.lower) {
      data_path = Join2(*parent.lower, name);
    }
    auto missing = [&](std::string_view why) {
      return Error(ENOENT, StrCat("upper file ", Quote(rel),
                                  " is a metacopy entry (its data stayed in a lower layer), but ", why,
                                  "; pack it with --parent naming the layers the upper was made on"));
    };
    if (!data_path) return missing("no lower directory shows through its parent");
    STRATA_ASSIGN_OR_RETURN(std::optional<MergedEntry> lower, parents_.Lookup(*data_path));
    if (!lower || lower->is_dir || lower->top().inode.type != erofs::FileType::kRegular) {
      return missing(StrCat("the parents have no regular file at ", Quote("/" + *data_path)));
    }
    const LayerInode& data = lower->top();
    if (data.inode.size != node->size) {
      return Error(EINVAL, StrCat("upper file ", Quote(rel), " is a metacopy entry of ", node->size,
                                  " bytes, but its data at ", Quote("/" + *data_path), " in the parents has ",
                                  data.inode.size, "; pack it with the layers the upper was made on"));
    }
    node->data.layer = parents_.layers()[data.layer];
    node->data.inode = data.inode;
    ++stats_.metacopy_resolved;
    return OkStatus();
  }
  if (S_ISLNK(st.st_mode)) {
    node->kind = EntryKind::kSymlink;
    std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
    while (true) {
      ssize_t n = ::readlinkat(dir_fd, name.c_str(), target.data(), target.size());
      if (n < 0) return ErrnoError(errno, "read upper symlink " + Quote(rel));
      if (static_cast<size_t>(n) < target.size()) {
        target.resize(static_cast<size_t>(n));
        break;
      }
      target.resize(target.size() * 2);  // it grew meanwhile
    }
    node->target = std::move(target);
    return OkStatus();
  }
  if (S_ISFIFO(st.st_mode)) {
    node->kind = EntryKind::kFifo;
    return OkStatus();
  }
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
    const char* type = S_ISCHR(st.st_mode) ? "character" : "block";
    if (!options_.keep_devices) {
      return Error(EPERM, StrCat("upper entry ", Quote(rel), " is a ", type, " device ", major(st.st_rdev), ":",
                                 minor(st.st_rdev),
                                 ", not a whiteout; a diff layer holds no device nodes unless asked "
                                 "(remove it, --exclude it, or pass --keep-devices)"));
    }
    node->kind = S_ISCHR(st.st_mode) ? EntryKind::kCharDevice : EntryKind::kBlockDevice;
    node->rdev = st.st_rdev;
    return OkStatus();
  }
  return Error(EINVAL, StrCat("upper entry ", Quote(rel), ": unknown file type 0", st.st_mode & S_IFMT));
}

Result<erofs::Attributes> UpperReader::Attributes(const std::string& rel, const struct stat& st,
                                                     std::vector<erofs::Xattr> xattrs) const {
  erofs::Attributes attrs{.mode = st.st_mode & 07777,
                             .uid = st.st_uid,
                             .gid = st.st_gid,
                             .mtime = st.st_mtim.tv_sec,
                             .mtime_nsec = static_cast<uint32_t>(st.st_mtim.tv_nsec),
                             .xattrs = std::move(xattrs)};
  if (options_.id_shift) {
    const IdShift& shift = *options_.id_shift;
    const std::string shown = rel.empty() ? "/" : rel;
    STRATA_ASSIGN_OR_RETURN(attrs.uid, shift.ToContainer(st.st_uid, StrCat("the owner of ", Quote(shown))));
    STRATA_ASSIGN_OR_RETURN(attrs.gid, shift.ToContainer(st.st_gid, StrCat("the group of ", Quote(shown))));
    for (auto& x : attrs.xattrs) {
      STRATA_ASSIGN_OR_RETURN(x.value, shift.ShiftXattr(x.name, x.value, shown));
    }
  }
  return attrs;
}

Status UpperReader::AddLower(ChangeNode& dir, const MergedEntry& lower, const std::string& rel) {
  STRATA_ASSIGN_OR_RETURN(auto entries, parents_.ReadDir(lower));
  for (auto& [name, entry] : entries) {
    if (dir.children.count(name)) continue;  // the upper's entry (or whiteout) wins
    const std::string child_rel = Join2(rel, name);
    if (entry.is_dir) {
      const LayerInode& top = entry.top();
      STRATA_ASSIGN_OR_RETURN(erofs::Attributes attrs, LayerAttributes(parents_.image(top.layer), top.inode));
      auto node = NewDirectory(attrs);
      STRATA_RETURN_IF_ERROR(AddLower(*node, entry, child_rel));
      dir.children[name] = std::move(node);
      continue;
    }
    STRATA_ASSIGN_OR_RETURN(dir.children[name], LowerNode(entry.top(), child_rel));
  }
  return OkStatus();
}

Result<std::shared_ptr<ChangeNode>> UpperReader::LowerNode(const LayerInode& inode, const std::string& rel) {
  const std::pair<size_t, uint64_t> key{inode.layer, inode.inode.nid};
  if (auto it = lower_links_.find(key); it != lower_links_.end()) return it->second;
  auto node = LayerNode(parents_.layers()[inode.layer], inode.inode);
  if (!node.ok()) return node.status().Annotate(StrCat("lower entry ", Quote(rel)));
  if (inode.inode.nlink > 1) lower_links_[key] = *node;
  return node;
}

Status UpperReader::CheckUnchanged() const {
  for (const ListedDir& dir : listed_) {
    auto fd = OpenDir(dir.rel);
    if (!fd.ok()) return UpperChanged("directory", dir.rel, "while it was packed", "it is gone or was replaced");
    struct stat st;
    if (::fstat(fd->get(), &st) != 0) return ErrnoError(errno, "stat upper directory " + Quote(dir.rel));
    if (std::string why = DescribeChange(dir.st, st); !why.empty()) {
      if (why == "it was modified") why = "entries were added, removed or renamed";
      return UpperChanged("directory", dir.rel, "while it was packed", why);
    }
    for (const Listed& e : dir.entries) {
      const std::string rel = Join2(dir.rel, e.name);
      if (::fstatat(fd->get(), e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return UpperChanged("entry", rel, "while it was packed", "it is gone");
        return ErrnoError(errno, "stat upper entry " + Quote(rel));
      }
      if (std::string why = DescribeChange(e.st, st); !why.empty()) {
        return UpperChanged("entry", rel, "while it was packed", why);
      }
    }
  }
  return OkStatus();
}

}  // namespace strata::packdiff
