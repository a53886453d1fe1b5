// strata's own EROFS reader: superblock, inodes, directories, symlinks,
// xattrs and file data of uncompressed EROFS images, including chunk-based
// files whose data lives on extra devices (the layer's blob).
//
// Supported: flat plain, flat inline and chunk-based data layouts (4-byte
// block maps and 8-byte chunk indexes, extra devices with or without a
// unified address space), compact and extended inodes, inline and shared
// xattrs with the long xattr name prefix table, every file type, superblock
// checksums. Refused at Open with ENOTSUP and a message naming the feature:
// compression (lz4_0padding, compr_cfgs/big_pcluster, ztailpacking,
// fragments/dedupe), 48bit, metabox, directory blocks larger than a block,
// and any incompatible feature bit this reader does not know.
//
// The image is untrusted input. Every offset, length, count and name read
// from it is checked before use; no call reads outside the sources, loops
// without bound or allocates more than the image's size justifies (xattr
// values are further capped at kMaxXattrBytes per inode). Corruption yields
// EUCLEAN with a message naming the inode and the structure, e.g.
// "erofs image: inode 1234: chunk index 7 points at block 99999 beyond
// device 1 (4096 blocks)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/status.h"

namespace strata::erofs {

// Random access to one device's bytes: device 0 is the metadata image,
// 1.. the extra devices (blobs).
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  virtual uint64_t size() const = 0;
  // Reads up to out.size() bytes at offset; short only at the end.
  // Thread-safe.
  virtual Result<size_t> ReadAt(uint64_t offset, std::span<char> out) const = 0;
};

// A source over bytes held in memory.
std::shared_ptr<BlockSource> MemorySource(std::string bytes);
// A source over a file, opened read-only now; its size is taken now.
Result<std::shared_ptr<BlockSource>> FileSource(const std::string& path);

enum class FileType { kRegular, kDirectory, kSymlink, kCharDevice, kBlockDevice, kFifo, kSocket };
// "regular file", "directory", ...
std::string_view FileTypeName(FileType type);

// How an inode's data is laid out.
enum class DataLayout {
  kFlatPlain,   // consecutive blocks from start_block (or all a hole)
  kFlatInline,  // consecutive blocks, the last partial block inline after the inode
  kChunkBased,  // a chunk index per chunk_size bytes; chunks may sit on extra devices
};

struct Inode {
  uint64_t nid = 0;
  FileType type = FileType::kRegular;
  uint32_t mode = 0;  // full st_mode: type and permission bits
  uint32_t uid = 0, gid = 0;
  uint32_t nlink = 0;
  uint64_t size = 0;
  int64_t mtime = 0;
  uint32_t mtime_nsec = 0;
  // Device number of character and block devices in the kernel's encoding,
  // which major()/minor() from <sys/sysmacros.h> decode. 0 otherwise.
  uint32_t rdev = 0;
  uint32_t ino = 0;  // the on-disk 32-bit inode number (stat compatibility)

  // Where and how the inode is stored.
  bool extended = false;      // 64-byte on-disk inode (else 32-byte compact)
  DataLayout layout = DataLayout::kFlatPlain;
  uint64_t meta_offset = 0;   // byte offset of the on-disk inode in the metadata image
  uint32_t inode_size = 0;    // 32 or 64
  uint32_t xattr_size = 0;    // bytes of the inline xattr area after the inode
  uint32_t xattr_shared_count = 0;
  uint32_t start_block = 0;   // flat layouts: first data block (kNullAddr: a hole)
  uint32_t chunk_bits = 0;    // chunk-based: log2 of the chunk size
  bool chunk_indexes = false; // chunk-based: 8-byte indexes (else a 4-byte block map)
};

struct DirEntry {
  std::string name;
  uint64_t nid = 0;
  FileType type = FileType::kRegular;
};

struct Xattr {
  std::string name;  // full name, e.g. "trusted.overlay.opaque"
  std::string value;
};

// One piece of a file. `physical` is a byte offset on `device`; holes have
// no device bytes and read as zeros. For chunk-based files every chunk is
// one extent (not merged), so extents are at most the chunk size; a flat
// file is one extent for its blocks plus one on device 0 for an inline tail.
// `length` counts file bytes (the last extent ends at the file size).
struct Extent {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint32_t device = 0;
  uint64_t physical = 0;
  bool hole = false;

  friend bool operator==(const Extent&, const Extent&) = default;
};

struct ImageInfo {
  uint32_t block_size = 0;
  uint64_t root_nid = 0;
  uint64_t inode_count = 0;
  uint64_t build_time = 0;  // seconds since the Unix epoch
  std::string uuid;         // "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string volume_name;
  uint32_t feature_compat = 0, feature_incompat = 0;
  bool checksum_verified = false;  // the superblock carried a crc32c and it matched
  // Blocks of each device: [0] the metadata image (from the superblock),
  // [1..] the extra devices (from the device table; mkfs.erofs 1.5 writes 0
  // there, and the reader then bounds the device by its source's size).
  std::vector<uint64_t> device_blocks;
  // First block of each extra device in the unified address space (0: the
  // device is addressed only through chunk indexes naming it). [0] unused.
  std::vector<uint64_t> device_uniaddr;
  uint32_t meta_blkaddr = 0;
  uint32_t xattr_blkaddr = 0;
  uint32_t xattr_prefix_count = 0;
  uint64_t packed_nid = 0;
};

// Upper bound on the summed names and values of one inode's xattrs.
inline constexpr size_t kMaxXattrBytes = 4 << 20;
// Longest symlink target accepted (PATH_MAX without the NUL).
inline constexpr uint64_t kMaxSymlinkSize = 4095;

class Image {
 public:
  // Parses and checks the superblock (magic, block size, checksum when the
  // feature says so, feature bits, device table, long xattr prefixes, the
  // root inode). Refuses compression and any unknown incompat bit with an
  // error naming the feature (ENOTSUP). `devices` are the extra devices in
  // device-table order; leave it empty to inspect metadata only (MapFile
  // works, Read of data on an extra device fails with ENXIO). When given,
  // their number must match the device table and each must hold at least
  // the blocks the table says (when it says any).
  static Result<std::unique_ptr<Image>> Open(std::shared_ptr<BlockSource> meta,
                                             std::vector<std::shared_ptr<BlockSource>> devices = {});

  const ImageInfo& info() const { return info_; }

  // Every method below is const and may be called from many threads.
  // Inodes passed in must come from this image's GetInode (or Root, Walk,
  // LookupPath): their layout fields were checked there.

  Result<Inode> GetInode(uint64_t nid) const;
  Result<Inode> Root() const { return GetInode(info_.root_nid); }

  // Entries of a directory in on-disk (byte-wise sorted) order, without "."
  // and "..". ENOTDIR for other inodes.
  Result<std::vector<DirEntry>> ReadDir(const Inode& dir) const;
  // Finds `name` by binary search over blocks, then within the block, as
  // the kernel does. ENOENT when absent, ENAMETOOLONG past 255 bytes,
  // EINVAL for an empty name or one with '/' or NUL.
  Result<DirEntry> Lookup(const Inode& dir, std::string_view name) const;
  // Resolves "/a/b/c" (or "a/b/c") from the root without following
  // symlinks; ENOENT, ENOTDIR as the path dictates.
  Result<Inode> LookupPath(std::string_view path) const;

  Result<std::string> ReadLink(const Inode& link) const;  // EINVAL for non-symlinks

  // Inline xattrs first, then shared ones, in on-disk order.
  Result<std::vector<Xattr>> ListXattrs(const Inode& inode) const;
  // The value of one xattr; ENODATA when the inode has none of that name.
  Result<std::string> GetXattr(const Inode& inode, std::string_view name) const;

  // Whole-file physical map of a regular file (EINVAL for other types).
  Result<std::vector<Extent>> MapFile(const Inode& file) const;
  // Reads up to out.size() bytes of a regular file at `offset` through the
  // devices; short only at the end of the file. Holes read as zeros.
  Result<size_t> Read(const Inode& file, uint64_t offset, std::span<char> out) const;

  // Visits every inode reachable from the root depth-first: the root as
  // "/", then each entry as "/dir/name" (a hardlinked file once per name),
  // a directory before its entries. Fails with EUCLEAN when a directory is
  // reached twice (a cycle or a hardlinked directory), a directory block
  // serves two directories (so a small image cannot make the walk parse the
  // same blocks over and over), or a dirent's type disagrees with its
  // inode. A visitor error stops the walk and is returned as is.
  using WalkVisitor = std::function<Status(const std::string& path, const Inode& inode)>;
  Status Walk(const WalkVisitor& visit) const;

  Image(const Image&) = delete;
  Image& operator=(const Image&) = delete;

 private:
  struct Mapping;
  struct RawDirent;
  struct LongPrefix {
    uint8_t base_index;
    std::string infix;
  };

  Image() = default;

  Status ParseSuperBlock();
  Status LoadDevices();
  Status LoadLongPrefixes();

  Status ReadMeta(uint64_t offset, std::span<char> out, std::string_view what) const;
  Status ReadDevice(const Inode& inode, uint32_t device, uint64_t offset, std::span<char> out) const;
  // Maps a block run on `device` (0 may name an extra device through the
  // unified address space) to its device and byte offset, checking that
  // `bytes` bytes from there lie on that device.
  Status ResolveBlocks(const Inode& inode, std::string_view what, uint32_t device, uint64_t block,
                       uint64_t bytes, uint32_t* out_device, uint64_t* out_offset) const;
  Status CheckLayout(Inode& inode) const;
  Result<Mapping> MapAt(const Inode& inode, uint64_t offset) const;
  Result<size_t> ReadData(const Inode& inode, uint64_t offset, std::span<char> out) const;

  // ReadDir; with `claimed`, also records each directory block's physical
  // block there and fails when one is already recorded.
  Result<std::vector<DirEntry>> ReadDirImpl(const Inode& dir, std::unordered_set<uint64_t>* claimed) const;
  Result<std::vector<RawDirent>> ReadDirBlock(const Inode& dir, uint64_t block, std::string* buf) const;
  // Calls fn for every xattr, inline ones first; fn returns false to stop.
  using XattrFn = std::function<Result<bool>(std::string_view name, uint64_t value_offset, uint32_t value_size)>;
  Status ForEachXattr(const Inode& inode, const XattrFn& fn) const;
  Status ParseXattrEntry(const Inode& inode, uint64_t offset, uint64_t limit, std::string_view where,
                         std::string* name, uint64_t* value_offset, uint32_t* value_size,
                         uint64_t* entry_size) const;

  struct UnifiedRange {
    uint64_t start;
    uint64_t blocks;
    uint32_t device;
  };

  std::shared_ptr<BlockSource> meta_;
  std::vector<std::shared_ptr<BlockSource>> devices_;  // [0] is meta_
  ImageInfo info_;
  uint32_t blkbits_ = 12;
  uint64_t meta_size_ = 0;
  uint32_t device_id_mask_ = 0;
  // Size of every device, [0] = meta_size_: from the device table, or from
  // the device's source when the table says 0 blocks, else kUnknownSize.
  static constexpr uint64_t kUnknownSize = UINT64_MAX;
  std::vector<uint64_t> device_bytes_;
  std::vector<LongPrefix> long_prefixes_;
  // Where the long prefix table lives: the metadata image, or the data of
  // the packed inode.
  bool prefixes_in_packed_inode_ = false;
  uint64_t total_device_bytes_ = 0;
  // Extra devices reachable through device-0 block addresses, by start.
  std::vector<UnifiedRange> unified_;
  // Superblock fields the reader needs after Open.
  int64_t epoch_ = 0;
  uint32_t fixed_nsec_ = 0;
  uint32_t extra_devices_ = 0;
  uint32_t devt_slotoff_ = 0;
  uint32_t xattr_prefix_start_ = 0;
};

}  // namespace strata::erofs
