// The EROFS on-disk format: structures, constants and little-endian field
// access. Written from the format's public description (the kernel's
// Documentation/filesystems/erofs.rst and erofs_fs.h); every structure is
// checked against its on-disk size below. All multi-byte fields are
// little-endian on disk: read them through Le().
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace strata::erofs {

// Converts a little-endian on-disk value to host order.
template <typename T>
constexpr T Le(T v) {
  if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
    return v;
  } else if constexpr (sizeof(T) == 2) {
    return static_cast<T>(__builtin_bswap16(static_cast<uint16_t>(v)));
  } else if constexpr (sizeof(T) == 4) {
    return static_cast<T>(__builtin_bswap32(static_cast<uint32_t>(v)));
  } else {
    static_assert(sizeof(T) == 8);
    return static_cast<T>(__builtin_bswap64(static_cast<uint64_t>(v)));
  }
}

// Copies an on-disk structure out of raw bytes (no alignment assumed).
template <typename T>
T LoadStruct(const char* bytes) {
  T v;
  std::memcpy(&v, bytes, sizeof(T));
  return v;
}

namespace internal {
constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
    table[i] = crc;
  }
  return table;
}
inline constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();
}  // namespace internal

// CRC32C (Castagnoli, reflected) without the final inversion, the form of
// the superblock checksum: Crc32c(~0u, block from kSuperOffset with the
// checksum field zeroed), over blocksize - 1024 bytes (a whole block when
// blocks are 1 KiB or smaller).
inline uint32_t Crc32c(uint32_t crc, std::string_view data) {
  for (unsigned char c : data) crc = internal::kCrc32cTable[(crc ^ c) & 0xff] ^ (crc >> 8);
  return crc;
}

inline constexpr uint32_t kSuperMagic = 0xE0F5E1E2;
// The superblock starts 1024 bytes into the image (room for boot sectors).
inline constexpr uint64_t kSuperOffset = 1024;
inline constexpr uint32_t kMinBlockBits = 9;   // 512-byte blocks
inline constexpr uint32_t kMaxBlockBits = 16;  // 64 KiB blocks
// Inode slots are 32 bytes: nid * 32 is an inode's offset in the meta area.
inline constexpr uint32_t kInodeSlotBits = 5;
inline constexpr uint32_t kNameMax = 255;
// Block address meaning "no block": a hole.
inline constexpr uint32_t kNullAddr = 0xFFFFFFFF;

// feature_compat: bits a reader may ignore.
inline constexpr uint32_t kCompatSbChecksum = 0x00000001;
inline constexpr uint32_t kCompatMtime = 0x00000002;
inline constexpr uint32_t kCompatXattrFilter = 0x00000004;
inline constexpr uint32_t kCompatSharedXattrsInMetabox = 0x00000008;
inline constexpr uint32_t kCompatPlainXattrPrefixes = 0x00000010;
inline constexpr uint32_t kCompatIshareXattrs = 0x00000020;

// feature_incompat: a reader must understand every bit set.
inline constexpr uint32_t kIncompatZeroPadding = 0x00000001;  // lz4 0padding (compression)
inline constexpr uint32_t kIncompatComprCfgs = 0x00000002;    // also BIG_PCLUSTER
inline constexpr uint32_t kIncompatChunkedFile = 0x00000004;
inline constexpr uint32_t kIncompatDeviceTable = 0x00000008;  // also COMPR_HEAD2
inline constexpr uint32_t kIncompatZtailpacking = 0x00000010;
inline constexpr uint32_t kIncompatFragments = 0x00000020;    // also DEDUPE
inline constexpr uint32_t kIncompatXattrPrefixes = 0x00000040;
inline constexpr uint32_t kIncompat48Bit = 0x00000080;
inline constexpr uint32_t kIncompatMetabox = 0x00000100;
inline constexpr uint32_t kIncompatAllKnown = 0x000001FF;

// The superblock, at byte kSuperOffset: 128 bytes plus sb_extslots * 16;
// the fields past byte 128 matter only with 48BIT or METABOX.
struct SuperBlock {
  uint32_t magic;
  uint32_t checksum;  // crc32c of the superblock's block from kSuperOffset, this field zeroed
  uint32_t feature_compat;
  uint8_t blkszbits;
  uint8_t sb_extslots;
  uint16_t root_nid_2b;  // with 48BIT: blocks_hi
  uint64_t inos;
  uint64_t epoch;       // compact inodes' base mtime (older images: build_time)
  uint32_t fixed_nsec;  // compact inodes' mtime nanoseconds
  uint32_t blocks_lo;   // blocks of the primary device (the metadata image)
  uint32_t meta_blkaddr;
  uint32_t xattr_blkaddr;
  uint8_t uuid[16];
  uint8_t volume_name[16];
  uint32_t feature_incompat;
  uint16_t u1;  // available_compr_algs or lz4_max_distance
  uint16_t extra_devices;
  uint16_t devt_slotoff;  // device table at devt_slotoff * sizeof(DeviceSlot)
  uint8_t dirblkbits;
  uint8_t xattr_prefix_count;
  uint32_t xattr_prefix_start;  // in 4-byte units
  uint64_t packed_nid;
  uint8_t xattr_filter_reserved;
  uint8_t ishare_xattr_prefix_id;
  uint8_t reserved[2];
  uint32_t build_time;  // seconds after epoch (newer images)
  uint64_t rootnid_8b;  // 48BIT only
  uint64_t reserved2;
  uint64_t metabox_nid;  // METABOX only
  uint64_t reserved3;
} __attribute__((packed));
static_assert(sizeof(SuperBlock) == 144);
inline constexpr size_t kSuperBlockBaseSize = 128;
inline constexpr size_t kSuperBlockExtSlotSize = 16;

struct DeviceSlot {
  uint8_t tag[64];
  uint32_t blocks_lo;
  uint32_t uniaddr_lo;  // first block of this device in the unified address space
  uint16_t blocks_hi;   // 48BIT only
  uint16_t uniaddr_hi;  // 48BIT only
  uint8_t reserved[52];
} __attribute__((packed));
static_assert(sizeof(DeviceSlot) == 128);

// i_format bits.
inline constexpr uint16_t kIFormatExtended = 0x0001;  // 64-byte inode
inline constexpr uint32_t kIFormatLayoutShift = 1;
inline constexpr uint16_t kIFormatLayoutMask = 0x0007;
inline constexpr uint16_t kIFormatNlink1 = 0x0010;  // compact non-directories: nlink is 1
inline constexpr uint16_t kIFormatAllKnown = 0x001F;

// Data layouts (i_format bits 1-3).
inline constexpr uint32_t kLayoutFlatPlain = 0;
inline constexpr uint32_t kLayoutCompressedFull = 1;
inline constexpr uint32_t kLayoutFlatInline = 2;
inline constexpr uint32_t kLayoutCompressedCompact = 3;
inline constexpr uint32_t kLayoutChunkBased = 4;

// Chunk-based inodes: i_u holds the chunk format.
inline constexpr uint16_t kChunkFormatBlkbitsMask = 0x001F;
inline constexpr uint16_t kChunkFormatIndexes = 0x0020;  // 8-byte indexes, else 4-byte block map
inline constexpr uint16_t kChunkFormat48Bit = 0x0040;
inline constexpr uint16_t kChunkFormatAllKnown = 0x007F;

struct InodeCompact {
  uint16_t i_format;
  uint16_t i_xattr_icount;
  uint16_t i_mode;
  uint16_t i_nb;  // nlink, unless kIFormatNlink1
  uint32_t i_size;
  uint32_t i_mtime;  // seconds after the superblock's epoch
  uint32_t i_u;      // start block, rdev, or chunk format
  uint32_t i_ino;
  uint16_t i_uid;
  uint16_t i_gid;
  uint32_t i_reserved;
} __attribute__((packed));
static_assert(sizeof(InodeCompact) == 32);

struct InodeExtended {
  uint16_t i_format;
  uint16_t i_xattr_icount;
  uint16_t i_mode;
  uint16_t i_nb;
  uint64_t i_size;
  uint32_t i_u;
  uint32_t i_ino;
  uint32_t i_uid;
  uint32_t i_gid;
  uint64_t i_mtime;
  uint32_t i_mtime_nsec;
  uint32_t i_nlink;
  uint8_t i_reserved2[16];
} __attribute__((packed));
static_assert(sizeof(InodeExtended) == 64);

// Inline xattrs follow the inode: this header, h_shared_count 4-byte shared
// xattr ids, then entries. The area is 12 + 4 * (i_xattr_icount - 1) bytes.
struct XattrIbodyHeader {
  uint32_t h_name_filter;
  uint8_t h_shared_count;
  uint8_t h_reserved2[7];
} __attribute__((packed));
static_assert(sizeof(XattrIbodyHeader) == 12);

// An xattr entry (inline or shared): header, name, value, padded to 4 bytes.
struct XattrEntry {
  uint8_t e_name_len;
  uint8_t e_name_index;
  uint16_t e_value_size;
} __attribute__((packed));
static_assert(sizeof(XattrEntry) == 4);

inline constexpr uint8_t kXattrIndexUser = 1;
inline constexpr uint8_t kXattrIndexPosixAclAccess = 2;
inline constexpr uint8_t kXattrIndexPosixAclDefault = 3;
inline constexpr uint8_t kXattrIndexTrusted = 4;
inline constexpr uint8_t kXattrIndexLustre = 5;
inline constexpr uint8_t kXattrIndexSecurity = 6;
// e_name_index with this bit set names entry (index & 0x7f) of the long
// prefix table instead of a short prefix.
inline constexpr uint8_t kXattrLongPrefix = 0x80;
inline constexpr uint8_t kXattrLongPrefixMask = 0x7f;

// The short name prefix of a name index; empty for unknown indexes.
inline std::string_view XattrPrefix(uint8_t index) {
  switch (index) {
    case kXattrIndexUser: return "user.";
    case kXattrIndexPosixAclAccess: return "system.posix_acl_access";
    case kXattrIndexPosixAclDefault: return "system.posix_acl_default";
    case kXattrIndexTrusted: return "trusted.";
    case kXattrIndexLustre: return "lustre.";
    case kXattrIndexSecurity: return "security.";
    default: return {};
  }
}

// A long prefix table entry is a 4-byte aligned __le16 length followed by
// that many bytes: this header, then the infix.
struct XattrLongPrefix {
  uint8_t base_index;
} __attribute__((packed));
static_assert(sizeof(XattrLongPrefix) == 1);

struct ChunkIndex {
  uint16_t startblk_hi;  // 48BIT only (formerly "advise")
  uint16_t device_id;
  uint32_t startblk_lo;
} __attribute__((packed));
static_assert(sizeof(ChunkIndex) == 8);
inline constexpr size_t kBlockMapEntrySize = 4;

// Directory blocks: an array of dirents, then their names (not
// NUL-terminated, except that the last name may be followed by NULs).
// The first dirent's nameoff / 12 is the number of dirents in the block.
struct Dirent {
  uint64_t nid;
  uint16_t nameoff;
  uint8_t file_type;
  uint8_t reserved;
} __attribute__((packed));
static_assert(sizeof(Dirent) == 12);
inline constexpr uint64_t kDirentNidMetaboxBit = 1ULL << 63;

// Dirent file types (the generic FT_* values).
inline constexpr uint8_t kFtUnknown = 0;
inline constexpr uint8_t kFtRegular = 1;
inline constexpr uint8_t kFtDirectory = 2;
inline constexpr uint8_t kFtCharDevice = 3;
inline constexpr uint8_t kFtBlockDevice = 4;
inline constexpr uint8_t kFtFifo = 5;
inline constexpr uint8_t kFtSocket = 6;
inline constexpr uint8_t kFtSymlink = 7;

}  // namespace strata::erofs
