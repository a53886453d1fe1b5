// LayerFs: the FUSE filesystem through which the kernel's EROFS driver reads
// layers. It holds two read-only files per layer, "<digest>.meta" (the
// metadata image) and "<digest>.blob" (the data blob, opened with
// FOPEN_DIRECT_IO by default so its pages are cached once, by EROFS, not
// also by FUSE; with `erofs_directio` EROFS reads it with direct I/O instead
// and the flag is left off).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lazyfs/fuse_mount.h"
#include "lazyfs/served_layer.h"

namespace strata::lazyfs {

class LayerFs {
 public:
  // Mounts at `mountpoint` (created if missing) and serves on a
  // multi-threaded libfuse loop (low-level API). `blob_direct_io`: open
  // the blobs with FOPEN_DIRECT_IO (see above).
  static Result<std::unique_ptr<LayerFs>> Mount(const std::string& mountpoint, bool blob_direct_io = true);
  // Takes over the mount at `mountpoint`, served by a process that died,
  // through its connection `fd` (FuseMount::Adopt); `layers` are served
  // from the first request on.
  static Result<std::unique_ptr<LayerFs>> Adopt(const std::string& mountpoint, bool blob_direct_io, UniqueFd fd,
                                                FuseInit init, const std::vector<std::shared_ptr<ServedLayer>>& layers);
  // Unmounts (see ~FuseMount) and joins the loop.
  ~LayerFs();
  LayerFs(const LayerFs&) = delete;
  LayerFs& operator=(const LayerFs&) = delete;

  // Fails only when the layer's inode numbers are another layer's.
  Status Add(std::shared_ptr<ServedLayer> layer);
  // Hides the layer's files from lookups. Their inodes stay readable until
  // the kernel forgets them (an EROFS mount detached while busy still reads).
  void Remove(const Digest128& digest);

  std::string MetaPath(const Digest128& digest) const;
  std::string BlobPath(const Digest128& digest) const;
  const std::string& mountpoint() const { return mountpoint_; }
  const FuseMount& fuse() const { return *fuse_; }
  bool blob_direct_io() const { return blob_direct_io_; }

  // The FUSE operations call these (from libfuse's threads).
  // Inode numbers follow from the layer's digest, so a process that takes
  // the mount over answers for the inodes the kernel holds.
  static uint64_t InoFor(const Digest128& digest, bool blob);
  struct Node {
    uint64_t ino;
    std::shared_ptr<ServedLayer> layer;
    bool blob;
    uint64_t size;
    uint64_t lookups = 0;  // the kernel's references (lookup replies minus forgets)
    bool removed = false;
  };
  // Counts a kernel reference when found.
  std::shared_ptr<Node> LookUp(const std::string& name);
  void Forget(uint64_t ino, uint64_t n);
  std::shared_ptr<Node> FindByIno(uint64_t ino);
  std::map<std::string, std::shared_ptr<Node>> List();

 private:
  LayerFs() = default;

  std::string mountpoint_;
  bool blob_direct_io_ = true;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Node>> by_name_;
  std::map<uint64_t, std::shared_ptr<Node>> by_ino_;
  std::unique_ptr<FuseMount> fuse_;  // last, so first to go: its loop calls into the members above
};

}  // namespace strata::lazyfs
