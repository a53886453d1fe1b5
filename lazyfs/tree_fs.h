// TreeFs: lazyfs's fuse mode. One FUSE mount per layer whose files are the
// layer's tree, read with strata's own EROFS reader (common/erofs/reader.h):
// device 0 is the metadata image (the pinned cache chunk), device 1 the
// blob through ServedLayer::ReadBlob, so data reads go through the same
// chunk cache, stats, access recording and prefetch as in kernel mode.
//
// The tree is immutable, so the kernel may cache everything: entries
// (negative ones too), attributes, symlink targets, directory listings and
// file pages are kept with timeouts of a year. Inode numbers are EROFS nids
// (st_ino is the nid, as the kernel's EROFS reports it; the FUSE node id
// of the root is FUSE_ROOT_ID), so hardlinks share one inode and numbers
// are the same in every mount of the layer. Whiteouts (0/0 character
// devices) and trusted.overlay.* xattrs are served as they are stored.
//
// Errors: a name that is not there is ENOENT, a missing xattr ENODATA;
// anything the reader or the cache fails with (a corrupt image, a chunk
// that cannot be fetched in time) is EIO to the caller and one log line
// naming the layer, the inode and the step. No FUSE operation throws into
// libfuse or blocks past the cache's fetch deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/erofs/reader.h"
#include "lazyfs/fuse_mount.h"
#include "lazyfs/served_layer.h"

namespace strata::lazyfs {

class TreeFs {
 public:
  // Opens the layer's image (its metadata image must be loaded: see
  // ServedLayer::Load) and mounts its tree read-only at `mountpoint`
  // (created if missing). Fails when the image is not one the reader
  // supports, naming the layer and the reason.
  static Result<std::unique_ptr<TreeFs>> Mount(std::shared_ptr<ServedLayer> layer, const std::string& mountpoint);
  // Takes over the layer's mount at `mountpoint`, served by a process that
  // died, through its connection `fd` (FuseMount::Adopt). Node ids and
  // file handles are stateless (above), so nothing else carries over.
  static Result<std::unique_ptr<TreeFs>> Adopt(std::shared_ptr<ServedLayer> layer, const std::string& mountpoint,
                                               UniqueFd fd, FuseInit init);
  // Unmounts (see ~FuseMount).
  ~TreeFs();
  TreeFs(const TreeFs&) = delete;
  TreeFs& operator=(const TreeFs&) = delete;

  const std::string& mountpoint() const { return mountpoint_; }
  const erofs::Image& image() const { return *image_; }
  const ServedLayer& layer() const { return *layer_; }
  const FuseMount& fuse() const { return *fuse_; }

 private:
  friend struct TreeFsOps;
  TreeFs() = default;
  static Result<std::unique_ptr<TreeFs>> Open(std::shared_ptr<ServedLayer> layer, const std::string& mountpoint);
  FuseMountOptions Options() const;

  std::string mountpoint_;
  std::shared_ptr<ServedLayer> layer_;
  std::unique_ptr<erofs::Image> image_;
  mutable std::atomic<uint64_t> errors_{0};  // EIO answers, for rate-limiting their log lines
  // Set at FUSE init: the kernel opens files and directories without
  // asking when they answer ENOSYS (see tree_fs.cc).
  std::atomic<bool> no_open_{false}, no_opendir_{false};
  std::unique_ptr<FuseMount> fuse_;  // last, so first to go: its loop uses the members above
};

// The layer's metadata image and blob as reader devices. Failures of the
// cache or store come back as EIO (keeping their message), so the reader's
// own codes (ENOENT, ENODATA, EUCLEAN...) never mix with them.
std::shared_ptr<erofs::BlockSource> MetaBlockSource(std::shared_ptr<ServedLayer> layer);
std::shared_ptr<erofs::BlockSource> BlobBlockSource(std::shared_ptr<ServedLayer> layer);

}  // namespace strata::lazyfs
