// Writing a ChangeTree into the image writer.
#include "packdiff/change_tree.h"

#include <sys/stat.h>

#include <algorithm>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"

namespace strata::packdiff {
namespace {

using erofs::FileType;

bool SameTime(const timespec& a, const timespec& b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }

// A published layer's file as the writer's DataSource: its non-hole extents
// in pieces of at most kPiece bytes.
class LayerFileSource {
 public:
  static constexpr size_t kPiece = 1 << 20;

  LayerFileSource(const erofs::Image& image, const erofs::Inode& inode, std::vector<erofs::Extent> extents)
      : image_(image), inode_(inode), extents_(std::move(extents)), buf_(kPiece) {}

  Result<std::optional<erofs::DataPiece>> Next() {
    while (i_ < extents_.size()) {
      const erofs::Extent& e = extents_[i_];
      if (e.hole || done_ >= e.length) {
        ++i_;
        done_ = 0;
        continue;
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf_.size(), e.length - done_));
      const uint64_t at = e.file_offset + done_;
      STRATA_ASSIGN_OR_RETURN(size_t got, image_.Read(inode_, at, std::span<char>(buf_.data(), n)));
      if (got != n) return Error(EIO, StrCat("short read at offset ", at, " of a layer file"));
      done_ += n;
      return std::optional<erofs::DataPiece>(erofs::DataPiece{at, std::span<const char>(buf_.data(), n)});
    }
    return std::optional<erofs::DataPiece>();
  }

 private:
  const erofs::Image& image_;
  const erofs::Inode& inode_;
  std::vector<erofs::Extent> extents_;
  size_t i_ = 0;
  uint64_t done_ = 0;
  std::vector<char> buf_;
};

class TreeWriter {
 public:
  TreeWriter(const LowerStack& parents, const WriteHooks& hooks, erofs::ImageWriter& writer)
      : parents_(parents), hooks_(hooks), writer_(writer) {}

  Result<WriteStats> Run(const ChangeNode& root);

 private:
  struct Frame {
    std::string path;
    const ChangeNode* node;
    std::optional<MergedEntry> lower;  // the parents' directory here, when there is one that shows
  };

  static erofs::Attributes WithOpaque(const ChangeNode& dir) {
    erofs::Attributes attrs = dir.attrs;
    if (dir.opaque) attrs.xattrs.push_back({kOpaqueXattr, "y"});
    return attrs;
  }

  Status WriteEntry(const Frame& dir, const std::string& name, const ChangeNode& node, std::vector<Frame>* subdirs);
  Status WriteFile(const std::string& path, const ChangeNode& node);

  const LowerStack& parents_;
  const WriteHooks& hooks_;
  erofs::ImageWriter& writer_;
  WriteStats stats_;
  std::map<const ChangeNode*, std::string> first_name_;  // non-directories: where they were written first
};

Result<WriteStats> TreeWriter::Run(const ChangeNode& root) {
  STRATA_RETURN_IF_ERROR(writer_.AddDirectory("", WithOpaque(root)));
  ++stats_.directories;
  if (root.opaque) ++stats_.opaque_directories;
  std::optional<MergedEntry> lower;
  if (!root.opaque) {
    STRATA_ASSIGN_OR_RETURN(lower, parents_.Root());
  }
  std::vector<Frame> stack{{"", &root, std::move(lower)}};
  std::vector<Frame> subdirs;
  while (!stack.empty()) {
    Frame dir = std::move(stack.back());
    stack.pop_back();
    subdirs.clear();
    for (const auto& [name, child] : dir.node->children) {
      STRATA_RETURN_IF_ERROR(WriteEntry(dir, name, *child, &subdirs));
    }
    for (auto it = subdirs.rbegin(); it != subdirs.rend(); ++it) stack.push_back(std::move(*it));
  }
  return stats_;
}

Status TreeWriter::WriteEntry(const Frame& dir, const std::string& name, const ChangeNode& node,
                              std::vector<Frame>* subdirs) {
  const std::string path = dir.path.empty() ? name : dir.path + "/" + name;
  switch (node.kind) {
    case EntryKind::kWhiteout: {
      std::optional<MergedEntry> below;
      if (dir.lower) {
        STRATA_ASSIGN_OR_RETURN(below, parents_.LookupChild(*dir.lower, name));
      }
      if (!below) {
        ++stats_.whiteouts_dropped;
        return OkStatus();
      }
      ++stats_.whiteouts;
      return writer_.AddSpecial(path, FileType::kCharDevice, erofs::Attributes{.mode = 0}, 0);
    }
    case EntryKind::kDirectory: {
      STRATA_RETURN_IF_ERROR(writer_.AddDirectory(path, WithOpaque(node)));
      ++stats_.directories;
      if (node.opaque) ++stats_.opaque_directories;
      std::optional<MergedEntry> lower;
      if (dir.lower && !node.opaque) {
        STRATA_ASSIGN_OR_RETURN(lower, parents_.LookupChild(*dir.lower, name));
        if (lower && !lower->is_dir) lower.reset();  // a file below: overlayfs merges nothing here
      }
      subdirs->push_back({path, &node, std::move(lower)});
      return OkStatus();
    }
    default: break;
  }
  auto [first, is_new] = first_name_.emplace(&node, path);
  if (!is_new) {
    ++stats_.hardlinks;
    return writer_.AddHardlink(path, first->second);
  }
  switch (node.kind) {
    case EntryKind::kRegular:
      ++stats_.files;
      stats_.file_bytes += node.size;
      return WriteFile(path, node);
    case EntryKind::kSymlink:
      ++stats_.symlinks;
      return writer_.AddSymlink(path, node.attrs, node.target);
    case EntryKind::kCharDevice:
      ++stats_.specials;
      return writer_.AddSpecial(path, FileType::kCharDevice, node.attrs, node.rdev);
    case EntryKind::kBlockDevice:
      ++stats_.specials;
      return writer_.AddSpecial(path, FileType::kBlockDevice, node.attrs, node.rdev);
    case EntryKind::kFifo:
      ++stats_.specials;
      return writer_.AddSpecial(path, FileType::kFifo, node.attrs);
    case EntryKind::kSocket:
      ++stats_.specials;
      return writer_.AddSpecial(path, FileType::kSocket, node.attrs);
    default: return Error(EFAULT, StrCat("write ", Quote(path), ": unexpected entry kind"));
  }
}

Status TreeWriter::WriteFile(const std::string& path, const ChangeNode& node) {
  if (node.data.layer) {
    const erofs::Image& image = node.data.layer->image();
    auto where = [&] { return StrCat("file ", Quote(path), " from layer ", node.data.layer->digest().Hex()); };
    auto extents = image.MapFile(node.data.inode);
    if (!extents.ok()) return extents.status().Annotate(where());
    LayerFileSource source(image, node.data.inode, std::move(*extents));
    return writer_.AddFile(path, node.attrs, node.size, [&] { return source.Next(); }).Annotate(where());
  }
  if (!hooks_.open_upper) return Error(EFAULT, StrCat("file ", Quote(path), ": no way to open upper files"));
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, hooks_.open_upper(node.data.upper_path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "stat upper file " + Quote(node.data.upper_path));
  if (std::string why = DescribeChange(node.data.listed, st); !why.empty()) {
    return UpperChanged("file", node.data.upper_path, "after it was listed", why);
  }
  STRATA_RETURN_IF_ERROR(writer_.AddFile(path, node.attrs, fd.get()));
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "stat upper file " + Quote(node.data.upper_path));
  if (std::string why = DescribeChange(node.data.listed, st); !why.empty()) {
    return UpperChanged("file", node.data.upper_path, "while it was read", why);
  }
  return OkStatus();
}

}  // namespace

std::string DescribeChange(const struct stat& listed, const struct stat& now) {
  if (listed.st_dev != now.st_dev || listed.st_ino != now.st_ino || (listed.st_mode & S_IFMT) != (now.st_mode & S_IFMT)) {
    return "it was replaced";
  }
  if (listed.st_size != now.st_size) return StrCat("its size went from ", listed.st_size, " to ", now.st_size);
  if (!SameTime(listed.st_mtim, now.st_mtim)) return "it was modified";
  if (!SameTime(listed.st_ctim, now.st_ctim)) return "its attributes changed";
  return "";
}

Status UpperChanged(std::string_view what, const std::string& path, std::string_view when, std::string_view why) {
  return Error(EAGAIN, StrCat("upper ", what, " ", Quote(path.empty() ? "/" : path), " changed ", when, " (", why,
                              "); the upper directory must not change while it is packed: freeze the sandbox, "
                              "or pack a snapshot of it"));
}

std::string_view EntryKindName(EntryKind kind) {
  switch (kind) {
    case EntryKind::kDirectory: return "directory";
    case EntryKind::kRegular: return "regular file";
    case EntryKind::kSymlink: return "symlink";
    case EntryKind::kCharDevice: return "character device";
    case EntryKind::kBlockDevice: return "block device";
    case EntryKind::kFifo: return "FIFO";
    case EntryKind::kSocket: return "socket";
    case EntryKind::kWhiteout: return "whiteout";
  }
  return "?";
}

std::shared_ptr<ChangeNode> NewDirectory(const erofs::Attributes& attrs) {
  auto node = std::make_shared<ChangeNode>();
  node->kind = EntryKind::kDirectory;
  node->attrs = attrs;
  return node;
}

Result<WriteStats> WriteChangeTree(const ChangeNode& root, const LowerStack& parents, const WriteHooks& hooks,
                                   erofs::ImageWriter& writer) {
  if (root.kind != EntryKind::kDirectory) return Error(EINVAL, "write a diff: its root is not a directory");
  return TreeWriter(parents, hooks, writer).Run(root);
}

bool IsOverlayPrivateXattr(std::string_view name) {
  return name.starts_with(kOverlayXattrPrefix) && !name.starts_with(kEscapedOverlayXattrPrefix);
}

Result<erofs::Attributes> LayerAttributes(const erofs::Image& image, const erofs::Inode& inode) {
  erofs::Attributes attrs{.mode = inode.mode & 07777,
                             .uid = inode.uid,
                             .gid = inode.gid,
                             .mtime = inode.mtime,
                             .mtime_nsec = inode.mtime_nsec};
  STRATA_ASSIGN_OR_RETURN(auto xattrs, image.ListXattrs(inode));
  for (auto& x : xattrs) {
    if (!IsOverlayPrivateXattr(x.name)) attrs.xattrs.push_back(std::move(x));
  }
  return attrs;
}

Result<std::shared_ptr<ChangeNode>> LayerNode(const std::shared_ptr<const PublishedLayer>& layer,
                                              const erofs::Inode& inode) {
  auto node = std::make_shared<ChangeNode>();
  const erofs::Image& image = layer->image();
  STRATA_ASSIGN_OR_RETURN(node->attrs, LayerAttributes(image, inode));
  switch (inode.type) {
    case FileType::kRegular:
      node->kind = EntryKind::kRegular;
      node->size = inode.size;
      node->data.layer = layer;
      node->data.inode = inode;
      break;
    case FileType::kSymlink: {
      node->kind = EntryKind::kSymlink;
      STRATA_ASSIGN_OR_RETURN(node->target, image.ReadLink(inode));
      break;
    }
    case FileType::kCharDevice:
      node->kind = EntryKind::kCharDevice;
      node->rdev = inode.rdev;
      break;
    case FileType::kBlockDevice:
      node->kind = EntryKind::kBlockDevice;
      node->rdev = inode.rdev;
      break;
    case FileType::kFifo: node->kind = EntryKind::kFifo; break;
    case FileType::kSocket: node->kind = EntryKind::kSocket; break;
    case FileType::kDirectory:
      return Error(EINVAL, StrCat("layer ", layer->digest().Hex(), ": inode ", inode.nid,
                                  " is a directory, not a single entry"));
  }
  return node;
}

}  // namespace strata::packdiff
