// ChangeTree: a diff layer's entries in memory, in layer terms (whiteouts,
// opaque directories, files whose data lives in an upper directory or in a
// published layer), before they are written. The upper reader and squash
// build one; WriteChangeTree emits it into the image writer, dropping the
// whiteouts that would hide nothing in the parents.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/erofs/writer.h"
#include "packdiff/lower_stack.h"

namespace strata::packdiff {

enum class EntryKind { kDirectory, kRegular, kSymlink, kCharDevice, kBlockDevice, kFifo, kSocket, kWhiteout };
std::string_view EntryKindName(EntryKind kind);

// Where a regular file's bytes come from.
struct FileData {
  // An upper-directory file: its path below the upper root and what lstat
  // said when it was listed. It is re-opened when written, and must still be
  // the same unchanged inode.
  std::string upper_path;
  struct stat listed {};
  // Or an inode of a published layer (a metacopy entry's lower data, a
  // redirected directory's lower files, a diff being squashed).
  std::shared_ptr<const PublishedLayer> layer;
  erofs::Inode inode;
};

struct ChangeNode {
  EntryKind kind = EntryKind::kDirectory;
  // Mode, owner, mtime and xattrs as the layer gets them; overlayfs's own
  // xattrs are not here (the opaque marker is `opaque`).
  erofs::Attributes attrs;
  bool opaque = false;     // directories: hides the parents' directory here
  uint64_t size = 0;       // regular files
  FileData data;           // regular files
  std::string target;      // symlinks
  uint64_t rdev = 0;       // devices, makedev() encoded
  // Directories. Non-directories with several names share one node: they
  // become hardlinks.
  std::map<std::string, std::shared_ptr<ChangeNode>> children;
};

std::shared_ptr<ChangeNode> NewDirectory(const erofs::Attributes& attrs);

struct WriteStats {
  uint64_t directories = 0, opaque_directories = 0, files = 0, file_bytes = 0, symlinks = 0, specials = 0,
           hardlinks = 0, whiteouts = 0;
  uint64_t whiteouts_dropped = 0;  // would have hidden nothing in the parents
};

struct WriteHooks {
  // Opens an upper file for reading (RESOLVE_BENEATH, no symlinks); the
  // upper reader supplies it.
  std::function<Result<UniqueFd>(const std::string& upper_path)> open_upper;
};

// Writes `root` into `writer`: each directory's entries in byte order, then
// its subdirectories, depth first (the order layerctl's directory walk
// uses, so the same tree always gives the same image). Whiteouts are written
// (character device 0/0, mode 0, owner 0:0, mtime 0) only where `parents`
// has something to hide: never inside an opaque or new directory, where
// overlayfs would list them as broken entries. Upper files are checked
// against their listing before and after they are read (EAGAIN naming the
// path when they changed).
Result<WriteStats> WriteChangeTree(const ChangeNode& root, const LowerStack& parents, const WriteHooks& hooks,
                                   erofs::ImageWriter& writer);

// Why an upper entry no longer matches what lstat said when it was listed
// (replaced, resized, written, attributes changed), or "" when it does.
std::string DescribeChange(const struct stat& listed, const struct stat& now);
// EAGAIN: "upper file X changed <when> (<why>); ... freeze the sandbox".
Status UpperChanged(std::string_view what, const std::string& path, std::string_view when, std::string_view why);

// overlayfs's bookkeeping and markers (trusted.overlay.*), which a layer
// does not carry as xattrs; a user's own escaped trusted.overlay.overlay.*
// xattrs are not among them.
bool IsOverlayPrivateXattr(std::string_view name);

// The layer Attributes of a published layer's inode (xattrs included,
// trusted.overlay.opaque left out).
Result<erofs::Attributes> LayerAttributes(const erofs::Image& image, const erofs::Inode& inode);

// A ChangeNode for a published layer's non-directory inode (its data read
// from the layer when written).
Result<std::shared_ptr<ChangeNode>> LayerNode(const std::shared_ptr<const PublishedLayer>& layer,
                                              const erofs::Inode& inode);

}  // namespace strata::packdiff
