// ImageWriter: writes a layer's EROFS image itself — a metadata image plus
// one extra device, the data blob — from entries added by path in any order
// (tar order, directory walk order). No mkfs.erofs, no staging directory,
// no root.
//
// What it writes (docs/formats.md, "How they are made", has the reasons):
// - the metadata image: superblock with a CRC32C checksum and a device table
//   of one device (the blob), then every inode (extended, 64 bytes, each with
//   its own mtime) with its inline xattrs, then the directory and symlink
//   blocks that do not fit inline after their inode;
// - the blob: every regular file's data in chunk-based layout. A file is cut
//   from its own start into chunks of `chunk_size` bytes (the last one
//   shorter); each chunk's bytes go to a block-aligned blob offset, zero-
//   padded to the block. Identical chunks (same XXH3-128) are stored once;
//   all-zero chunks and holes are stored as holes (no blob bytes at all), so
//   sparse files cost nothing.
//
// Output is byte-for-byte deterministic: the same calls in the same order
// give the same two files. Directories are sorted, xattrs are sorted by name,
// the superblock's build time is 0 and its UUID is derived from the content.
//
// Memory: file data passes through one chunk-sized buffer; the tree of names
// and attributes (not data) is held until Finish.
//
// Errors name the path and the step ("erofs writer: file \"usr/bin/x\": read
// data at offset 1048576: Input/output error"). A failed Add* leaves the
// image as it was before the call (data it already wrote to the blob is
// dropped at Finish). An ImageWriter is not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/erofs/reader.h"
#include "common/hash.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::erofs {

// What every entry carries besides its type and data.
struct Attributes {
  uint32_t mode = 0644;  // permission bits with setuid/setgid/sticky (07777); type bits are ignored
  uint32_t uid = 0, gid = 0;
  int64_t mtime = 0;  // seconds since the Unix epoch
  uint32_t mtime_nsec = 0;
  // Names are "user.*", "trusted.*", "security.*",
  // "system.posix_acl_access" or "system.posix_acl_default" (what EROFS can
  // name and the kernel shows; user.* only on regular files and
  // directories, as Linux has them); values are at most 65,535 bytes (EROFS's
  // value size is 16 bits); an inode's xattrs take at most 256 KiB in all.
  // Stored sorted by name; a name given twice keeps the last value.
  std::vector<Xattr> xattrs;
};

// One piece of a regular file's data: `data` belongs at file offset
// `offset`. Bytes between pieces, and after the last, are holes.
struct DataPiece {
  uint64_t offset = 0;
  std::span<const char> data;
};
// Returns the next piece, or nullopt after the last. Pieces come in
// increasing offset order and do not overlap (libarchive's
// archive_read_data_block gives exactly this). The span must stay valid
// until the next call.
using DataSource = std::function<Result<std::optional<DataPiece>>()>;

// A piece of the blob as a store keeps it: `length` data bytes at blob
// `offset` (block-aligned), named by their XXH3-128 (a layer manifest's
// extent).
struct BlobExtent {
  uint64_t offset = 0;
  uint64_t length = 0;
  Digest128 hash;
};

// What Finish returns.
struct ImageSummary {
  // The manifest's extents, by offset: every chunk stored in the blob,
  // small ones side by side grouped (Options::group_size).
  // `length` is the data bytes up to the end of the last chunk's data (not
  // rounded up); the blob holds zeros from offset + length to the next
  // extent, and between a group's chunks.
  std::vector<BlobExtent> extents;
  uint64_t inodes = 0;      // inodes in the image (a hardlinked file counts once)
  uint64_t file_bytes = 0;  // sum of the sizes of the regular-file inodes
  uint64_t meta_size = 0;   // bytes of the metadata image (whole blocks)
  Digest128 meta_hash;      // XXH3-128 of the metadata image as written
  uint64_t blob_size = 0;   // bytes of the blob (whole blocks)
};

class ImageWriter {
 public:
  struct Options {
    // A power of two, 4096 to 65536. The kernel mounts block sizes up to
    // its page size (4 KiB on x86-64); fsck.erofs 1.5 knows 4 KiB only.
    uint32_t block_size = 4096;
    uint32_t chunk_size = 1 << 20;  // a power of two, at least block_size
    // Chunks under half the group (this size or the chunk size, the
    // smaller) that lie side by side in the blob are grouped into extents
    // of at most the group's size; 0: every chunk is its own extent. See GroupSmallChunks. (Layers are
    // built with BuildOptions::group_size.)
    uint32_t group_size = 0;
    std::string blob_path;          // created or truncated now
  };

  static Result<std::unique_ptr<ImageWriter>> Create(const Options& options);
  ~ImageWriter();
  ImageWriter(const ImageWriter&) = delete;
  ImageWriter& operator=(const ImageWriter&) = delete;

  // Paths are relative to the image root: components of 1 to 255 bytes
  // other than NUL and '/', separated by single '/', never "." or "..".
  // The empty path is the root directory itself.
  //
  // Missing parent directories are created with mode 0755, owner 0:0,
  // mtime 0 and no xattrs; a later AddDirectory of that path sets its real
  // attributes. A path that already exists is replaced, as tar does: a
  // directory added over a directory keeps its entries and takes the new
  // attributes; anything else removes the old entry (a whole subtree, for a
  // directory) first. A parent that exists but is not a directory is an
  // error (ENOTDIR): paths never pass through symlinks.

  Status AddDirectory(std::string_view path, const Attributes& attrs);

  // A regular file of `size` bytes whose data `source` hands over.
  Status AddFile(std::string_view path, const Attributes& attrs, uint64_t size, const DataSource& source);
  // A regular file read from `fd` (a regular file; not closed): its size
  // when called, its data from offset 0, holes found with SEEK_DATA and
  // SEEK_HOLE and never read. A file that shrinks while read is an error.
  Status AddFile(std::string_view path, const Attributes& attrs, int fd);

  // `target` is stored as given: 1 to 4095 bytes, no NUL.
  Status AddSymlink(std::string_view path, const Attributes& attrs, std::string_view target);

  // A character or block device (rdev as makedev() encodes it; major below
  // 4096, minor below 2^20), a FIFO or a socket (rdev ignored).
  Status AddSpecial(std::string_view path, FileType type, const Attributes& attrs, uint64_t rdev = 0);

  // Another name for the inode at `target` (added earlier; not a
  // directory). The link keeps that inode even if `target` is later
  // replaced. ENOENT when `target` does not exist.
  Status AddHardlink(std::string_view path, std::string_view target);

  // Sets (or replaces) one xattr of the existing entry at `path`.
  Status SetXattr(std::string_view path, std::string_view name, std::string_view value);

  // The type of the entry at `path`, nullopt when there is none. Never
  // follows symlinks.
  std::optional<FileType> TypeOf(std::string_view path) const;

  // Lays out and writes the metadata image to `meta_path` (created or
  // truncated), finishes the blob (chunks no inode uses any more, after
  // replacements, are zeroed and left out) and returns the summary. The
  // writer accepts no calls after Finish, whether it succeeded or not.
  Result<ImageSummary> Finish(const std::string& meta_path);

 private:
  struct Node;
  struct StoredChunk;
  struct ChunkMap;
  Result<std::vector<BlobExtent>> GroupSmallChunks(const std::vector<const StoredChunk*>& live) const;
  class ChunkAssembler;

  explicit ImageWriter(const Options& options);

  Status CheckOpen(std::string_view what, std::string_view path) const;
  // The directory that will hold `path`'s last component, and that
  // component. With `create`, missing parents are created; without, the
  // path is only checked (the deepest existing directory is returned).
  // `what` names the call in errors.
  Result<Node*> Parent(std::string_view what, std::string_view path, bool create, std::string_view* name);
  std::shared_ptr<Node> FindShared(std::string_view path) const;
  Node* Find(std::string_view path) const;
  // Links `node` into `parent` as `name`, replacing what was there.
  void Place(Node* parent, std::string_view name, std::shared_ptr<Node> node);
  Result<std::shared_ptr<Node>> NewNode(std::string_view what, std::string_view path, FileType type,
                                        const Attributes& attrs);
  Status CheckXattrArea(std::string_view what, std::string_view path, const Node& node) const;
  Status CheckFileSize(std::string_view path, uint64_t size) const;
  // Stores the first `length` bytes of buffer_ (one chunk of `path` at
  // `file_offset`) in the blob, or finds them there; returns the chunk's
  // index in chunks_, or a hole marker when they are all zero.
  Result<uint32_t> StoreChunk(std::string_view path, uint64_t file_offset, size_t length);

  Options options_;
  uint32_t blkbits_ = 12;
  UniqueFd blob_fd_;
  uint64_t blob_end_ = 0;  // bytes of the blob written so far (whole blocks)
  bool finished_ = false;
  std::shared_ptr<Node> root_;
  std::vector<StoredChunk> chunks_;      // in blob order
  std::unique_ptr<ChunkMap> chunk_ids_;  // XXH3-128 -> index into chunks_
  std::vector<char> buffer_;             // one chunk of file data
};

}  // namespace strata::erofs
