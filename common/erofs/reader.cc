// The EROFS reader. The image is hostile input: every value read from it is
// range-checked before it becomes an offset, a length, a loop bound or an
// allocation size, and all arithmetic on such values is overflow-checked.
#include "common/erofs/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <unordered_set>
#include <utility>

#include "common/erofs/format.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::erofs {

namespace {

Status Corrupt(std::string_view message) { return Error(EUCLEAN, StrCat("erofs image: ", message)); }
Status Unsupported(std::string_view message) { return Error(ENOTSUP, StrCat("erofs image: ", message)); }

std::string InodeName(uint64_t nid) { return StrCat("inode ", nid); }

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string Octal(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0%o", v);
  return buf;
}

// a + b, or false on overflow.
bool Add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

// True when [offset, offset + length) lies within [0, limit).
bool Within(uint64_t offset, uint64_t length, uint64_t limit) {
  return offset <= limit && length <= limit - offset;
}

uint64_t AlignUp(uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; }

bool FileTypeFromMode(uint32_t mode, FileType* type) {
  switch (mode & S_IFMT) {
    case S_IFREG: *type = FileType::kRegular; return true;
    case S_IFDIR: *type = FileType::kDirectory; return true;
    case S_IFLNK: *type = FileType::kSymlink; return true;
    case S_IFCHR: *type = FileType::kCharDevice; return true;
    case S_IFBLK: *type = FileType::kBlockDevice; return true;
    case S_IFIFO: *type = FileType::kFifo; return true;
    case S_IFSOCK: *type = FileType::kSocket; return true;
    default: return false;
  }
}

bool FileTypeFromDirent(uint8_t ft, FileType* type) {
  switch (ft) {
    case kFtRegular: *type = FileType::kRegular; return true;
    case kFtDirectory: *type = FileType::kDirectory; return true;
    case kFtCharDevice: *type = FileType::kCharDevice; return true;
    case kFtBlockDevice: *type = FileType::kBlockDevice; return true;
    case kFtFifo: *type = FileType::kFifo; return true;
    case kFtSocket: *type = FileType::kSocket; return true;
    case kFtSymlink: *type = FileType::kSymlink; return true;
    default: return false;
  }
}

std::string FormatUuid(const uint8_t uuid[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[uuid[i] >> 4]);
    out.push_back(kHex[uuid[i] & 15]);
  }
  return out;
}

class MemoryBlockSource final : public BlockSource {
 public:
  explicit MemoryBlockSource(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  Result<size_t> ReadAt(uint64_t offset, std::span<char> out) const override {
    if (offset >= bytes_.size()) return size_t{0};
    size_t n = std::min<uint64_t>(out.size(), bytes_.size() - offset);
    std::memcpy(out.data(), bytes_.data() + offset, n);
    return n;
  }

 private:
  std::string bytes_;
};

class FileBlockSource final : public BlockSource {
 public:
  FileBlockSource(std::string path, UniqueFd fd, uint64_t size)
      : path_(std::move(path)), fd_(std::move(fd)), size_(size) {}
  uint64_t size() const override { return size_; }
  Result<size_t> ReadAt(uint64_t offset, std::span<char> out) const override {
    if (offset >= size_) return size_t{0};
    size_t n = std::min<uint64_t>(out.size(), size_ - offset);
    auto r = PreadFull(fd_.get(), out.first(n), offset);
    if (!r.ok()) return r.status().Annotate(StrCat("read ", path_));
    return *r;
  }

 private:
  std::string path_;
  UniqueFd fd_;
  uint64_t size_;
};

}  // namespace

std::shared_ptr<BlockSource> MemorySource(std::string bytes) {
  return std::make_shared<MemoryBlockSource>(std::move(bytes));
}

Result<std::shared_ptr<BlockSource>> FileSource(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  // lseek rather than fstat so block devices report their size too.
  off_t end = ::lseek(fd.get(), 0, SEEK_END);
  if (end < 0) return ErrnoError(errno, StrCat("size of ", path));
  return std::shared_ptr<BlockSource>(
      std::make_shared<FileBlockSource>(path, std::move(fd), static_cast<uint64_t>(end)));
}

std::string_view FileTypeName(FileType type) {
  switch (type) {
    case FileType::kRegular: return "regular file";
    case FileType::kDirectory: return "directory";
    case FileType::kSymlink: return "symlink";
    case FileType::kCharDevice: return "character device";
    case FileType::kBlockDevice: return "block device";
    case FileType::kFifo: return "fifo";
    case FileType::kSocket: return "socket";
  }
  return "unknown";
}

// Where one piece of an inode's data lives.
struct Image::Mapping {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint32_t device = 0;
  uint64_t physical = 0;
  bool hole = false;
  bool inline_tail = false;  // in the metadata image right after the inode
};

struct Image::RawDirent {
  uint64_t nid;
  FileType type;
  uint32_t name_offset;  // within the block buffer
  uint32_t name_length;
};

Result<std::unique_ptr<Image>> Image::Open(std::shared_ptr<BlockSource> meta,
                                           std::vector<std::shared_ptr<BlockSource>> devices) {
  if (!meta) return Error(EINVAL, "erofs image: no metadata source given");
  std::unique_ptr<Image> image(new Image());
  image->meta_ = std::move(meta);
  image->meta_size_ = image->meta_->size();
  STRATA_RETURN_IF_ERROR(image->ParseSuperBlock());
  STRATA_RETURN_IF_ERROR(image->LoadDevices());
  if (!devices.empty() && devices.size() != image->info_.device_blocks.size() - 1) {
    return Error(EINVAL, StrCat("erofs image: ", devices.size(), " extra devices given, the device table lists ",
                                image->info_.device_blocks.size() - 1));
  }
  image->devices_.push_back(image->meta_);
  for (size_t i = 0; i < devices.size(); ++i) {
    uint32_t id = static_cast<uint32_t>(i + 1);
    if (!devices[i]) return Error(EINVAL, StrCat("erofs image: device ", id, " is null"));
    if (image->info_.device_blocks[id] == 0) {
      image->device_bytes_[id] = devices[i]->size();
    } else if (devices[i]->size() < image->device_bytes_[id]) {
      return Error(EINVAL, StrCat("erofs image: device ", id, " has ", devices[i]->size(),
                                  " bytes, the device table says ", image->info_.device_blocks[id], " blocks (",
                                  image->device_bytes_[id], " bytes)"));
    }
    image->devices_.push_back(std::move(devices[i]));
  }
  // Sizes learnt from the sources replace unknown ones in the total too.
  image->total_device_bytes_ = 0;
  for (uint64_t bytes : image->device_bytes_) {
    if (!Add(image->total_device_bytes_, bytes, &image->total_device_bytes_)) {
      image->total_device_bytes_ = UINT64_MAX;
    }
  }

  const ImageInfo& info = image->info_;
  if (info.feature_incompat & kIncompatFragments) {
    // The bit also means compressed fragments and dedupe, which are refused
    // with the other compression bits. Alone it still marks the packed
    // inode, which older mkfs.erofs used to hold the long xattr prefix
    // table; that is fine as long as the packed inode is not compressed.
    if (info.packed_nid == 0) return Unsupported("unsupported feature: compression (fragments/dedupe)");
    auto packed = image->GetInode(info.packed_nid);
    if (!packed.ok()) {
      if (packed.status().code() == ENOTSUP) {
        return Unsupported(StrCat("unsupported feature: compression (fragments in packed inode ",
                                  info.packed_nid, ")"));
      }
      return packed.status().Annotate("packed inode");
    }
    if (packed->type != FileType::kRegular) {
      return Corrupt(StrCat("packed inode ", info.packed_nid, " is a ", FileTypeName(packed->type)));
    }
    image->prefixes_in_packed_inode_ = !(info.feature_compat & kCompatPlainXattrPrefixes);
  }
  STRATA_RETURN_IF_ERROR(image->LoadLongPrefixes());

  STRATA_ASSIGN_OR_RETURN(Inode root, image->GetInode(info.root_nid));
  if (root.type != FileType::kDirectory) {
    return Corrupt(StrCat("root inode ", root.nid, " is a ", FileTypeName(root.type), ", not a directory"));
  }
  return image;
}

Status Image::ParseSuperBlock() {
  if (meta_size_ < kSuperOffset + kSuperBlockBaseSize) {
    return Error(EINVAL, StrCat("not an erofs image: ", meta_size_, " bytes is too small to hold a superblock"));
  }
  char raw[sizeof(SuperBlock)] = {};
  size_t want = std::min<uint64_t>(sizeof raw, meta_size_ - kSuperOffset);
  STRATA_RETURN_IF_ERROR(ReadMeta(kSuperOffset, std::span<char>(raw, want), "superblock"));
  SuperBlock sb = LoadStruct<SuperBlock>(raw);

  if (Le(sb.magic) != kSuperMagic) {
    return Error(EINVAL, StrCat("not an erofs image: magic ", Hex(Le(sb.magic)), " at byte 1024, expected ",
                                Hex(kSuperMagic)));
  }
  if (sb.blkszbits < kMinBlockBits || sb.blkszbits > kMaxBlockBits) {
    return Unsupported(StrCat("block size 2^", static_cast<int>(sb.blkszbits),
                              " is not supported (512 B to 64 KiB)"));
  }
  blkbits_ = sb.blkszbits;
  const uint64_t blksz = 1ULL << blkbits_;
  info_.block_size = static_cast<uint32_t>(blksz);

  uint64_t sb_size = kSuperBlockBaseSize + uint64_t{sb.sb_extslots} * kSuperBlockExtSlotSize;
  if (sb_size > 4096 - kSuperOffset || !Within(kSuperOffset, sb_size, meta_size_)) {
    return Corrupt(StrCat("superblock size ", sb_size, " (sb_extslots ", static_cast<int>(sb.sb_extslots),
                          ") does not fit the image"));
  }

  info_.feature_compat = Le(sb.feature_compat);
  info_.feature_incompat = Le(sb.feature_incompat);

  if (info_.feature_compat & kCompatSbChecksum) {
    uint64_t len = blksz > kSuperOffset ? blksz - kSuperOffset : blksz;
    if (!Within(kSuperOffset, len, meta_size_)) {
      return Corrupt(StrCat("image of ", meta_size_, " bytes ends inside the checksummed superblock block"));
    }
    std::string block(len, '\0');
    STRATA_RETURN_IF_ERROR(ReadMeta(kSuperOffset, std::span<char>(block), "superblock"));
    std::memset(block.data() + offsetof(SuperBlock, checksum), 0, sizeof(uint32_t));
    uint32_t computed = Crc32c(0xFFFFFFFFu, block);
    if (computed != Le(sb.checksum)) {
      return Corrupt(StrCat("superblock checksum ", Hex(Le(sb.checksum)), " does not match its contents (",
                            Hex(computed), ")"));
    }
    info_.checksum_verified = true;
  }

  const uint32_t incompat = info_.feature_incompat;
  if (uint32_t unknown = incompat & ~kIncompatAllKnown) {
    return Unsupported(StrCat("unknown incompatible feature bits ", Hex(unknown)));
  }
  std::vector<std::string> refused;
  if (incompat & kIncompatZeroPadding) refused.push_back("compression (lz4_0padding)");
  if (incompat & kIncompatComprCfgs) refused.push_back("compression (compr_cfgs/big_pcluster)");
  if (incompat & kIncompatZtailpacking) refused.push_back("compression (ztailpacking)");
  if (incompat & kIncompat48Bit) refused.push_back("48bit");
  if (incompat & kIncompatMetabox) refused.push_back("metabox");
  if (!refused.empty()) {
    return Unsupported(StrCat(refused.size() == 1 ? "unsupported feature: " : "unsupported features: ",
                              Join(refused, ", ")));
  }
  if (sb.dirblkbits != 0) {
    return Unsupported(StrCat("directory blocks of 2^", static_cast<int>(sb.dirblkbits), " fs blocks"));
  }

  info_.root_nid = Le(sb.root_nid_2b);
  info_.inode_count = Le(sb.inos);
  // Older images keep the whole build time in `epoch`; newer ones add
  // build_time to it. Unsigned arithmetic: the sum wraps, never traps.
  info_.build_time = Le(sb.epoch) + Le(sb.build_time);
  info_.uuid = FormatUuid(sb.uuid);
  const char* vol = reinterpret_cast<const char*>(sb.volume_name);
  info_.volume_name.assign(vol, strnlen(vol, sizeof sb.volume_name));
  info_.meta_blkaddr = Le(sb.meta_blkaddr);
  info_.xattr_blkaddr = Le(sb.xattr_blkaddr);
  info_.xattr_prefix_count = sb.xattr_prefix_count;
  info_.packed_nid = Le(sb.packed_nid);
  info_.device_blocks = {Le(sb.blocks_lo)};

  uint64_t declared = uint64_t{Le(sb.blocks_lo)} << blkbits_;
  if (declared > meta_size_) {
    return Corrupt(StrCat("image is truncated: the superblock says ", Le(sb.blocks_lo), " blocks (", declared,
                          " bytes), the image has ", meta_size_, " bytes"));
  }
  if ((uint64_t{info_.meta_blkaddr} << blkbits_) >= meta_size_) {
    return Corrupt(StrCat("metadata start block ", info_.meta_blkaddr, " is beyond the image (",
                          meta_size_ >> blkbits_, " blocks)"));
  }
  if ((uint64_t{info_.xattr_blkaddr} << blkbits_) > meta_size_) {
    return Corrupt(StrCat("shared xattr start block ", info_.xattr_blkaddr, " is beyond the image (",
                          meta_size_ >> blkbits_, " blocks)"));
  }
  epoch_ = static_cast<int64_t>(Le(sb.epoch));
  fixed_nsec_ = Le(sb.fixed_nsec);
  extra_devices_ = (incompat & kIncompatDeviceTable) ? Le(sb.extra_devices) : 0;
  devt_slotoff_ = Le(sb.devt_slotoff);
  xattr_prefix_start_ = Le(sb.xattr_prefix_start);
  return OkStatus();
}

Status Image::LoadDevices() {
  device_bytes_ = {meta_size_};
  info_.device_uniaddr = {0};
  total_device_bytes_ = meta_size_;
  if (extra_devices_ == 0) return OkStatus();

  uint64_t table = uint64_t{devt_slotoff_} * sizeof(DeviceSlot);
  uint64_t table_bytes = uint64_t{extra_devices_} * sizeof(DeviceSlot);
  if (!Within(table, table_bytes, meta_size_)) {
    return Corrupt(StrCat("device table of ", extra_devices_, " slots at byte ", table,
                          " runs past the end of the image (", meta_size_, " bytes)"));
  }
  std::string raw(table_bytes, '\0');
  STRATA_RETURN_IF_ERROR(ReadMeta(table, std::span<char>(raw), "device table"));
  for (uint32_t i = 0; i < extra_devices_; ++i) {
    DeviceSlot slot = LoadStruct<DeviceSlot>(raw.data() + i * sizeof(DeviceSlot));
    uint64_t blocks = Le(slot.blocks_lo);
    uint64_t uniaddr = Le(slot.uniaddr_lo);
    info_.device_blocks.push_back(blocks);
    info_.device_uniaddr.push_back(uniaddr);
    // mkfs.erofs 1.5 leaves the block count of a --blobdev device at 0:
    // then the device's size is unknown until its source is given.
    const uint64_t bytes = blocks != 0 ? blocks << blkbits_ : kUnknownSize;
    device_bytes_.push_back(bytes);
    if (!Add(total_device_bytes_, bytes, &total_device_bytes_)) total_device_bytes_ = UINT64_MAX;
    if (uniaddr != 0 && blocks != 0) unified_.push_back({uniaddr, blocks, i + 1});
  }
  // Device ids in chunk indexes are masked to the smallest power of two
  // that covers every device, as the kernel does.
  uint32_t mask = 1;
  while (mask < extra_devices_ + 1u) mask <<= 1;
  device_id_mask_ = mask - 1;

  std::sort(unified_.begin(), unified_.end(),
            [](const UnifiedRange& a, const UnifiedRange& b) { return a.start < b.start; });
  for (size_t i = 1; i < unified_.size(); ++i) {
    if (unified_[i - 1].start + unified_[i - 1].blocks > unified_[i].start) {
      return Corrupt(StrCat("devices ", unified_[i - 1].device, " and ", unified_[i].device,
                            " overlap in the unified block address space"));
    }
  }
  return OkStatus();
}

Status Image::LoadLongPrefixes() {
  const uint32_t count = info_.xattr_prefix_count;
  if (count == 0) return OkStatus();
  Inode packed;
  if (prefixes_in_packed_inode_) {
    STRATA_ASSIGN_OR_RETURN(packed, GetInode(info_.packed_nid));
  }
  uint64_t pos = uint64_t{xattr_prefix_start_} * 4;
  long_prefixes_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    pos = AlignUp(pos, 4);
    std::string what = StrCat("long xattr name prefix ", i);
    auto read = [&](uint64_t at, std::span<char> out) -> Status {
      if (!prefixes_in_packed_inode_) return ReadMeta(at, out, what);
      if (at >= packed.size || out.size() > packed.size - at) {
        return Corrupt(StrCat(what, " at byte ", at, " runs past the end of packed inode ", packed.nid, " (",
                              packed.size, " bytes)"));
      }
      STRATA_ASSIGN_OR_RETURN(size_t n, ReadData(packed, at, out));
      if (n != out.size()) return Corrupt(StrCat(what, ": short read from packed inode ", packed.nid));
      return OkStatus();
    };
    char len_raw[2];
    STRATA_RETURN_IF_ERROR(read(pos, std::span<char>(len_raw, 2)));
    uint16_t len = Le(LoadStruct<uint16_t>(len_raw));
    if (len < sizeof(XattrLongPrefix) || len > sizeof(XattrLongPrefix) + kNameMax) {
      return Corrupt(StrCat(what, " has length ", len, " (1 to 256)"));
    }
    std::string body(len, '\0');
    STRATA_RETURN_IF_ERROR(read(pos + 2, std::span<char>(body)));
    uint8_t base = static_cast<uint8_t>(body[0]);
    if (XattrPrefix(base).empty()) {
      return Corrupt(StrCat(what, " has unknown base name index ", static_cast<int>(base)));
    }
    std::string infix = body.substr(1);
    if (infix.find('\0') != std::string::npos) return Corrupt(StrCat(what, " contains a NUL byte"));
    long_prefixes_.push_back({base, std::move(infix)});
    pos += 2 + len;
  }
  return OkStatus();
}

Status Image::ReadMeta(uint64_t offset, std::span<char> out, std::string_view what) const {
  if (!Within(offset, out.size(), meta_size_)) {
    return Corrupt(StrCat(what, ": ", out.size(), " bytes at byte ", offset, " run past the end of the image (",
                          meta_size_, " bytes)"));
  }
  STRATA_ASSIGN_OR_RETURN(size_t n, meta_->ReadAt(offset, out));
  if (n != out.size()) {
    return Error(EIO, StrCat("erofs image: ", what, ": short read of ", out.size(), " bytes at byte ", offset,
                             " (got ", n, ")"));
  }
  return OkStatus();
}

Status Image::ReadDevice(const Inode& inode, uint32_t device, uint64_t offset, std::span<char> out) const {
  if (device >= devices_.size()) {
    return Error(ENXIO, StrCat("erofs image: ", InodeName(inode.nid), ": data is on device ", device,
                               ", which was not given"));
  }
  STRATA_ASSIGN_OR_RETURN(size_t n, devices_[device]->ReadAt(offset, out));
  if (n != out.size()) {
    return Error(EIO, StrCat("erofs image: ", InodeName(inode.nid), ": device ", device, ": short read of ",
                             out.size(), " bytes at byte ", offset, " (got ", n, ")"));
  }
  return OkStatus();
}

Status Image::ResolveBlocks(const Inode& inode, std::string_view what, uint32_t device, uint64_t block,
                            uint64_t bytes, uint32_t* out_device, uint64_t* out_offset) const {
  if (device == 0 && !unified_.empty()) {
    // A block address on device 0 may lie in an extra device's range of
    // the unified address space.
    auto it = std::upper_bound(unified_.begin(), unified_.end(), block,
                               [](uint64_t b, const UnifiedRange& r) { return b < r.start; });
    if (it != unified_.begin()) {
      --it;
      if (block - it->start < it->blocks) {
        device = it->device;
        block -= it->start;
      }
    }
  }
  if (device >= device_bytes_.size()) {
    return Corrupt(StrCat(InodeName(inode.nid), ": ", what, " names device ", device, ", the image has ",
                          device_bytes_.size() - 1, " extra devices"));
  }
  uint64_t offset = block << blkbits_;  // block < 2^32, blkbits_ <= 16: no overflow
  if (!Within(offset, bytes, device_bytes_[device])) {
    return Corrupt(StrCat(InodeName(inode.nid), ": ", what, " points at block ", block, " beyond device ", device,
                          " (", (device_bytes_[device] + (1ULL << blkbits_) - 1) >> blkbits_, " blocks)"));
  }
  *out_device = device;
  *out_offset = offset;
  return OkStatus();
}

Result<Inode> Image::GetInode(uint64_t nid) const {
  uint64_t base = uint64_t{info_.meta_blkaddr} << blkbits_;
  uint64_t offset;
  if (nid > (meta_size_ >> kInodeSlotBits) || !Add(base, nid << kInodeSlotBits, &offset) ||
      !Within(offset, sizeof(InodeCompact), meta_size_)) {
    return Corrupt(StrCat("nid ", nid, " is beyond the image (", meta_size_, " bytes)"));
  }
  char raw[sizeof(InodeExtended)];
  STRATA_RETURN_IF_ERROR(ReadMeta(offset, std::span<char>(raw, sizeof(InodeCompact)), InodeName(nid)));
  uint16_t format = Le(LoadStruct<uint16_t>(raw));

  Inode inode;
  inode.nid = nid;
  inode.meta_offset = offset;
  if (uint16_t unknown = format & ~kIFormatAllKnown) {
    return Unsupported(StrCat(InodeName(nid), ": unknown i_format bits ", Hex(unknown)));
  }
  uint32_t layout = (format >> kIFormatLayoutShift) & kIFormatLayoutMask;
  if (layout == kLayoutCompressedFull || layout == kLayoutCompressedCompact) {
    return Unsupported(StrCat(InodeName(nid), ": compressed data (layout ", layout, ") is not supported"));
  }
  if (layout != kLayoutFlatPlain && layout != kLayoutFlatInline && layout != kLayoutChunkBased) {
    return Unsupported(StrCat(InodeName(nid), ": unknown data layout ", layout));
  }
  inode.layout = layout == kLayoutFlatPlain    ? DataLayout::kFlatPlain
                 : layout == kLayoutFlatInline ? DataLayout::kFlatInline
                                               : DataLayout::kChunkBased;

  uint16_t icount;
  uint32_t iu;
  if (format & kIFormatExtended) {
    if (!Within(offset, sizeof(InodeExtended), meta_size_)) {
      return Corrupt(StrCat(InodeName(nid), ": extended inode runs past the end of the image"));
    }
    STRATA_RETURN_IF_ERROR(ReadMeta(offset + sizeof(InodeCompact),
                                    std::span<char>(raw + sizeof(InodeCompact),
                                                    sizeof(InodeExtended) - sizeof(InodeCompact)),
                                    InodeName(nid)));
    InodeExtended d = LoadStruct<InodeExtended>(raw);
    inode.extended = true;
    inode.inode_size = sizeof(InodeExtended);
    inode.mode = Le(d.i_mode);
    inode.nlink = Le(d.i_nlink);
    inode.uid = Le(d.i_uid);
    inode.gid = Le(d.i_gid);
    inode.size = Le(d.i_size);
    inode.mtime = static_cast<int64_t>(Le(d.i_mtime));
    inode.mtime_nsec = Le(d.i_mtime_nsec);
    inode.ino = Le(d.i_ino);
    icount = Le(d.i_xattr_icount);
    iu = Le(d.i_u);
  } else {
    InodeCompact d = LoadStruct<InodeCompact>(raw);
    inode.inode_size = sizeof(InodeCompact);
    inode.mode = Le(d.i_mode);
    inode.uid = Le(d.i_uid);
    inode.gid = Le(d.i_gid);
    inode.size = Le(d.i_size);
    inode.mtime = static_cast<int64_t>(static_cast<uint64_t>(epoch_) + Le(d.i_mtime));
    inode.mtime_nsec = fixed_nsec_;
    inode.ino = Le(d.i_ino);
    icount = Le(d.i_xattr_icount);
    iu = Le(d.i_u);
    // For compact non-directories the bit means "nlink is 1" and frees
    // i_nb for other uses; for directories it means "no '.' entry".
    bool is_dir = (inode.mode & S_IFMT) == S_IFDIR;
    inode.nlink = (!is_dir && (format & kIFormatNlink1)) ? 1 : Le(d.i_nb);
  }
  if (!FileTypeFromMode(inode.mode, &inode.type)) {
    return Corrupt(StrCat(InodeName(nid), ": bad file mode ", Octal(inode.mode)));
  }
  if (inode.size > static_cast<uint64_t>(INT64_MAX)) {
    return Corrupt(StrCat(InodeName(nid), ": size ", inode.size, " is out of range"));
  }
  if (icount != 0) {
    inode.xattr_size = static_cast<uint32_t>(sizeof(XattrIbodyHeader) + 4 * (uint32_t{icount} - 1));
  }
  if (!Within(offset, uint64_t{inode.inode_size} + inode.xattr_size, meta_size_)) {
    return Corrupt(StrCat(InodeName(nid), ": ", inode.xattr_size,
                          " bytes of inline xattrs run past the end of the image"));
  }
  if (inode.xattr_size != 0) {
    char header_raw[sizeof(XattrIbodyHeader)];
    STRATA_RETURN_IF_ERROR(
        ReadMeta(offset + inode.inode_size, std::span<char>(header_raw), StrCat(InodeName(nid), ": xattr header")));
    XattrIbodyHeader header = LoadStruct<XattrIbodyHeader>(header_raw);
    inode.xattr_shared_count = header.h_shared_count;
    if (sizeof(XattrIbodyHeader) + 4 * uint64_t{inode.xattr_shared_count} > inode.xattr_size) {
      return Corrupt(StrCat(InodeName(nid), ": ", inode.xattr_shared_count,
                            " shared xattr ids do not fit the inline xattr area of ", inode.xattr_size, " bytes"));
    }
  }

  switch (inode.type) {
    case FileType::kCharDevice:
    case FileType::kBlockDevice:
      inode.rdev = iu;
      return inode;
    case FileType::kFifo:
    case FileType::kSocket:
      return inode;
    case FileType::kRegular:
    case FileType::kDirectory:
    case FileType::kSymlink:
      break;
  }

  if (inode.layout == DataLayout::kChunkBased) {
    uint16_t chunk_format = static_cast<uint16_t>(iu & 0xFFFF);
    if (chunk_format & ~kChunkFormatAllKnown) {
      return Unsupported(StrCat(InodeName(nid), ": unknown chunk format bits ", Hex(chunk_format & ~kChunkFormatAllKnown)));
    }
    if (chunk_format & kChunkFormat48Bit) {
      return Unsupported(StrCat(InodeName(nid), ": 48bit chunk indexes are not supported"));
    }
    inode.chunk_indexes = (chunk_format & kChunkFormatIndexes) != 0;
    inode.chunk_bits = blkbits_ + (chunk_format & kChunkFormatBlkbitsMask);
  } else {
    inode.start_block = iu;
  }
  STRATA_RETURN_IF_ERROR(CheckLayout(inode));
  return inode;
}

Status Image::CheckLayout(Inode& inode) const {
  const uint64_t blksz = 1ULL << blkbits_;
  const std::string name = InodeName(inode.nid);
  if (inode.type == FileType::kSymlink && (inode.size == 0 || inode.size > kMaxSymlinkSize)) {
    return Corrupt(StrCat(name, ": symlink target of ", inode.size, " bytes (1 to ", kMaxSymlinkSize, ")"));
  }
  if (inode.type == FileType::kDirectory && inode.size > total_device_bytes_) {
    return Corrupt(StrCat(name, ": directory of ", inode.size, " bytes is larger than the image and its devices"));
  }
  if (inode.size == 0) return OkStatus();

  const uint64_t data_pos = inode.meta_offset + inode.inode_size + inode.xattr_size;
  const uint64_t nblocks = (inode.size >> blkbits_) + ((inode.size & (blksz - 1)) != 0);
  uint32_t device;
  uint64_t physical;
  switch (inode.layout) {
    case DataLayout::kFlatPlain:
      if (inode.start_block == kNullAddr) return OkStatus();  // the whole file is a hole
      return ResolveBlocks(inode, "data", 0, inode.start_block, inode.size, &device, &physical);
    case DataLayout::kFlatInline: {
      uint64_t head = (nblocks - 1) << blkbits_;
      if (head != 0) {
        STRATA_RETURN_IF_ERROR(ResolveBlocks(inode, "data", 0, inode.start_block, head, &device, &physical));
      }
      uint64_t tail = inode.size - head;
      if ((data_pos & (blksz - 1)) + tail > blksz) {
        return Corrupt(StrCat(name, ": inline data of ", tail, " bytes at byte ", data_pos,
                              " crosses a block boundary"));
      }
      if (!Within(data_pos, tail, meta_size_)) {
        return Corrupt(StrCat(name, ": inline data runs past the end of the image"));
      }
      return OkStatus();
    }
    case DataLayout::kChunkBased: {
      const uint64_t unit = inode.chunk_indexes ? sizeof(ChunkIndex) : kBlockMapEntrySize;
      const uint64_t chunks = (inode.size >> inode.chunk_bits) +
                              ((inode.size & ((1ULL << inode.chunk_bits) - 1)) != 0);
      uint64_t table = AlignUp(data_pos, unit);
      if (chunks > meta_size_ / unit || !Within(table, chunks * unit, meta_size_)) {
        return Corrupt(StrCat(name, ": chunk table of ", chunks, " entries at byte ", table,
                              " runs past the end of the image"));
      }
      return OkStatus();
    }
  }
  return OkStatus();
}

Result<Image::Mapping> Image::MapAt(const Inode& inode, uint64_t offset) const {
  const uint64_t blksz = 1ULL << blkbits_;
  Mapping m;
  switch (inode.layout) {
    case DataLayout::kFlatPlain:
      m.file_offset = 0;
      m.length = inode.size;
      if (inode.start_block == kNullAddr) {
        m.hole = true;
      } else {
        STRATA_RETURN_IF_ERROR(
            ResolveBlocks(inode, "data", 0, inode.start_block, inode.size, &m.device, &m.physical));
      }
      return m;
    case DataLayout::kFlatInline: {
      const uint64_t nblocks = (inode.size >> blkbits_) + ((inode.size & (blksz - 1)) != 0);
      const uint64_t head = (nblocks - 1) << blkbits_;
      if (offset < head) {
        m.file_offset = 0;
        m.length = head;
        STRATA_RETURN_IF_ERROR(ResolveBlocks(inode, "data", 0, inode.start_block, head, &m.device, &m.physical));
      } else {
        m.file_offset = head;
        m.length = inode.size - head;
        m.inline_tail = true;
        m.device = 0;
        m.physical = inode.meta_offset + inode.inode_size + inode.xattr_size;
      }
      return m;
    }
    case DataLayout::kChunkBased: {
      const uint64_t unit = inode.chunk_indexes ? sizeof(ChunkIndex) : kBlockMapEntrySize;
      const uint64_t chunk = offset >> inode.chunk_bits;
      const uint64_t table = AlignUp(inode.meta_offset + inode.inode_size + inode.xattr_size, unit);
      char raw[sizeof(ChunkIndex)];
      std::string what = StrCat("chunk index ", chunk);
      STRATA_RETURN_IF_ERROR(
          ReadMeta(table + chunk * unit, std::span<char>(raw, unit), StrCat(InodeName(inode.nid), ": ", what)));
      m.file_offset = chunk << inode.chunk_bits;
      m.length = std::min<uint64_t>(inode.size - m.file_offset, uint64_t{1} << inode.chunk_bits);
      uint32_t device = 0;
      uint32_t block;
      if (inode.chunk_indexes) {
        ChunkIndex index = LoadStruct<ChunkIndex>(raw);
        block = Le(index.startblk_lo);
        device = Le(index.device_id) & device_id_mask_;
      } else {
        block = Le(LoadStruct<uint32_t>(raw));
      }
      if (block == kNullAddr) {
        m.hole = true;
        return m;
      }
      STRATA_RETURN_IF_ERROR(ResolveBlocks(inode, what, device, block, m.length, &m.device, &m.physical));
      return m;
    }
  }
  return Corrupt(StrCat(InodeName(inode.nid), ": bad data layout"));
}

Result<size_t> Image::ReadData(const Inode& inode, uint64_t offset, std::span<char> out) const {
  if (offset >= inode.size) return size_t{0};
  const size_t n = std::min<uint64_t>(out.size(), inode.size - offset);
  size_t done = 0;
  while (done < n) {
    const uint64_t pos = offset + done;
    STRATA_ASSIGN_OR_RETURN(Mapping m, MapAt(inode, pos));
    // MapAt returns the piece containing pos: at least one byte progresses.
    const uint64_t in_piece = pos - m.file_offset;
    const size_t take = std::min<uint64_t>(n - done, m.length - in_piece);
    std::span<char> dst = out.subspan(done, take);
    if (m.hole) {
      std::memset(dst.data(), 0, dst.size());
    } else {
      STRATA_RETURN_IF_ERROR(ReadDevice(inode, m.device, m.physical + in_piece, dst));
    }
    done += take;
  }
  return n;
}

Result<size_t> Image::Read(const Inode& file, uint64_t offset, std::span<char> out) const {
  if (file.type != FileType::kRegular) {
    return Error(file.type == FileType::kDirectory ? EISDIR : EINVAL,
                 StrCat("erofs image: ", InodeName(file.nid), " is a ", FileTypeName(file.type),
                        ", not a regular file"));
  }
  return ReadData(file, offset, out);
}

Result<std::vector<Extent>> Image::MapFile(const Inode& file) const {
  if (file.type != FileType::kRegular) {
    return Error(EINVAL, StrCat("erofs image: ", InodeName(file.nid), " is a ", FileTypeName(file.type),
                                ", not a regular file"));
  }
  std::vector<Extent> extents;
  if (file.size == 0) return extents;
  if (file.layout != DataLayout::kChunkBased) {
    uint64_t pos = 0;
    while (pos < file.size) {  // at most two pieces: blocks and an inline tail
      STRATA_ASSIGN_OR_RETURN(Mapping m, MapAt(file, pos));
      extents.push_back({m.file_offset, m.length, m.device, m.physical, m.hole});
      pos = m.file_offset + m.length;
    }
    return extents;
  }

  // Chunk-based: read the index table in slices rather than one chunk at a
  // time. CheckLayout bounded the table by the image size.
  const uint64_t unit = file.chunk_indexes ? sizeof(ChunkIndex) : kBlockMapEntrySize;
  const uint64_t chunk_size = 1ULL << file.chunk_bits;
  const uint64_t chunks = (file.size >> file.chunk_bits) + ((file.size & (chunk_size - 1)) != 0);
  const uint64_t table = AlignUp(file.meta_offset + file.inode_size + file.xattr_size, unit);
  extents.reserve(chunks);
  constexpr uint64_t kSliceEntries = 8192;
  std::string raw;
  for (uint64_t first = 0; first < chunks; first += kSliceEntries) {
    const uint64_t count = std::min(kSliceEntries, chunks - first);
    raw.resize(count * unit);
    STRATA_RETURN_IF_ERROR(ReadMeta(table + first * unit, std::span<char>(raw),
                                    StrCat(InodeName(file.nid), ": chunk table")));
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t chunk = first + i;
      Extent e;
      e.file_offset = chunk << file.chunk_bits;
      e.length = std::min(file.size - e.file_offset, chunk_size);
      uint32_t device = 0;
      uint32_t block;
      if (file.chunk_indexes) {
        ChunkIndex index = LoadStruct<ChunkIndex>(raw.data() + i * unit);
        block = Le(index.startblk_lo);
        device = Le(index.device_id) & device_id_mask_;
      } else {
        block = Le(LoadStruct<uint32_t>(raw.data() + i * unit));
      }
      if (block == kNullAddr) {
        e.hole = true;
      } else {
        STRATA_RETURN_IF_ERROR(
            ResolveBlocks(file, StrCat("chunk index ", chunk), device, block, e.length, &e.device, &e.physical));
      }
      extents.push_back(e);
    }
  }
  return extents;
}

Result<std::vector<Image::RawDirent>> Image::ReadDirBlock(const Inode& dir, uint64_t block,
                                                           std::string* buf) const {
  const uint64_t blksz = 1ULL << blkbits_;
  const uint64_t start = block << blkbits_;
  const uint64_t size = std::min(blksz, dir.size - start);
  const std::string where = StrCat(InodeName(dir.nid), ": directory block ", block);
  buf->resize(size);
  STRATA_ASSIGN_OR_RETURN(size_t got, ReadData(dir, start, std::span<char>(*buf)));
  if (got != size) return Corrupt(StrCat(where, ": short read"));
  if (size < sizeof(Dirent)) return Corrupt(StrCat(where, " is ", size, " bytes, too short for a dirent"));

  const uint32_t nameoff0 = Le(LoadStruct<Dirent>(buf->data()).nameoff);
  if (nameoff0 < sizeof(Dirent) || nameoff0 >= size || nameoff0 % sizeof(Dirent) != 0) {
    return Corrupt(StrCat(where, ": first name offset ", nameoff0, " is invalid (block of ", size, " bytes)"));
  }
  const uint32_t count = nameoff0 / sizeof(Dirent);
  std::vector<RawDirent> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    Dirent d = LoadStruct<Dirent>(buf->data() + i * sizeof(Dirent));
    const uint32_t nameoff = Le(d.nameoff);
    uint32_t end;
    if (i + 1 < count) {
      end = Le(LoadStruct<Dirent>(buf->data() + (i + 1) * sizeof(Dirent)).nameoff);
    } else {
      // The last name runs to the end of the block or up to padding NULs.
      end = nameoff < size ? nameoff + static_cast<uint32_t>(strnlen(buf->data() + nameoff, size - nameoff))
                           : nameoff;
    }
    if (nameoff < nameoff0 || nameoff >= size || end <= nameoff || end > size || end - nameoff > kNameMax) {
      return Corrupt(StrCat(where, ": dirent ", i, " has name bytes ", nameoff, " to ", end, " (names start at ",
                            nameoff0, ", block of ", size, " bytes)"));
    }
    std::string_view name(buf->data() + nameoff, end - nameoff);
    if (name.find('\0') != std::string_view::npos || name.find('/') != std::string_view::npos) {
      return Corrupt(StrCat(where, ": dirent ", i, " name ", Quote(name), " contains '/' or NUL"));
    }
    RawDirent r;
    r.nid = Le(d.nid);
    if (!FileTypeFromDirent(d.file_type, &r.type)) {
      return Corrupt(StrCat(where, ": dirent ", Quote(name), " has bad file type ", static_cast<int>(d.file_type)));
    }
    r.name_offset = nameoff;
    r.name_length = end - nameoff;
    out.push_back(r);
  }
  return out;
}

Result<std::vector<DirEntry>> Image::ReadDir(const Inode& dir) const { return ReadDirImpl(dir, nullptr); }

Result<std::vector<DirEntry>> Image::ReadDirImpl(const Inode& dir, std::unordered_set<uint64_t>* claimed) const {
  if (dir.type != FileType::kDirectory) {
    return Error(ENOTDIR, StrCat("erofs image: ", InodeName(dir.nid), " is a ", FileTypeName(dir.type),
                                 ", not a directory"));
  }
  const uint64_t blocks = (dir.size + (1ULL << blkbits_) - 1) >> blkbits_;
  std::vector<DirEntry> entries;
  std::string buf;
  std::string previous;
  bool have_previous = false;
  for (uint64_t b = 0; b < blocks; ++b) {
    if (claimed != nullptr) {
      // Claim the block before parsing it; inline tails live inside their
      // own inode's slots and are not claimed.
      STRATA_ASSIGN_OR_RETURN(Mapping m, MapAt(dir, b << blkbits_));
      if (!m.hole && !m.inline_tail) {
        const uint64_t physical_block = (m.physical + ((b << blkbits_) - m.file_offset)) >> blkbits_;
        if (!claimed->insert(uint64_t{m.device} << 48 | physical_block).second) {
          return Corrupt(StrCat(InodeName(dir.nid), ": directory block ", b, " (block ", physical_block,
                                " of device ", m.device, ") also belongs to another directory"));
        }
      }
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<RawDirent> raw, ReadDirBlock(dir, b, &buf));
    for (const RawDirent& r : raw) {
      std::string_view name(buf.data() + r.name_offset, r.name_length);
      // Lookup's binary search relies on strictly ascending names.
      if (have_previous && !(std::string_view(previous) < name)) {
        return Corrupt(StrCat(InodeName(dir.nid), ": directory entries out of order: ", Quote(name), " after ",
                              Quote(previous)));
      }
      previous.assign(name);
      have_previous = true;
      if (name == "." || name == "..") continue;
      entries.push_back({std::string(name), r.nid, r.type});
    }
  }
  return entries;
}

Result<DirEntry> Image::Lookup(const Inode& dir, std::string_view name) const {
  if (dir.type != FileType::kDirectory) {
    return Error(ENOTDIR, StrCat("erofs image: ", InodeName(dir.nid), " is a ", FileTypeName(dir.type),
                                 ", not a directory"));
  }
  if (name.size() > kNameMax) {
    return Error(ENAMETOOLONG, StrCat("erofs image: name of ", name.size(), " bytes is too long"));
  }
  if (name.empty() || name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) {
    return Error(EINVAL, StrCat("erofs image: bad name ", Quote(name)));
  }
  auto not_found = [&] {
    return Error(ENOENT, StrCat("erofs image: ", Quote(name), " not found in directory inode ", dir.nid));
  };
  const uint64_t blocks = (dir.size + (1ULL << blkbits_) - 1) >> blkbits_;
  if (blocks == 0) return not_found();

  // Find the last block whose first name is <= name; then search in it.
  std::string buf;
  uint64_t lo = 0, hi = blocks;  // candidate blocks in [lo, hi)
  int64_t candidate = -1;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    STRATA_ASSIGN_OR_RETURN(std::vector<RawDirent> raw, ReadDirBlock(dir, mid, &buf));
    std::string_view first(buf.data() + raw[0].name_offset, raw[0].name_length);
    if (name == first) return DirEntry{std::string(name), raw[0].nid, raw[0].type};
    if (name < first) {
      hi = mid;
    } else {
      candidate = static_cast<int64_t>(mid);
      lo = mid + 1;
    }
  }
  if (candidate < 0) return not_found();
  STRATA_ASSIGN_OR_RETURN(std::vector<RawDirent> raw, ReadDirBlock(dir, static_cast<uint64_t>(candidate), &buf));
  size_t l = 0, h = raw.size();
  while (l < h) {
    const size_t mid = l + (h - l) / 2;
    std::string_view probe(buf.data() + raw[mid].name_offset, raw[mid].name_length);
    if (name == probe) return DirEntry{std::string(name), raw[mid].nid, raw[mid].type};
    if (name < probe) {
      h = mid;
    } else {
      l = mid + 1;
    }
  }
  return not_found();
}

Result<Inode> Image::LookupPath(std::string_view path) const {
  STRATA_ASSIGN_OR_RETURN(Inode inode, Root());
  std::string walked;
  size_t pos = 0;
  while (pos < path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string_view::npos) slash = path.size();
    std::string_view component = path.substr(pos, slash - pos);
    pos = slash + 1;
    if (component.empty()) continue;
    walked += "/";
    walked += component;
    auto entry = Lookup(inode, component);
    if (!entry.ok()) return entry.status().Annotate(StrCat("lookup ", Quote(walked)));
    auto next = GetInode(entry->nid);
    if (!next.ok()) return next.status().Annotate(StrCat("lookup ", Quote(walked)));
    inode = std::move(*next);
  }
  return inode;
}

Result<std::string> Image::ReadLink(const Inode& link) const {
  if (link.type != FileType::kSymlink) {
    return Error(EINVAL, StrCat("erofs image: ", InodeName(link.nid), " is a ", FileTypeName(link.type),
                                ", not a symlink"));
  }
  if (link.size == 0 || link.size > kMaxSymlinkSize) {
    return Corrupt(StrCat(InodeName(link.nid), ": symlink target of ", link.size, " bytes"));
  }
  std::string target(link.size, '\0');
  STRATA_ASSIGN_OR_RETURN(size_t n, ReadData(link, 0, std::span<char>(target)));
  if (n != target.size()) return Corrupt(StrCat(InodeName(link.nid), ": short symlink target"));
  if (target.find('\0') != std::string::npos) {
    return Corrupt(StrCat(InodeName(link.nid), ": symlink target contains a NUL byte"));
  }
  return target;
}

Status Image::ParseXattrEntry(const Inode& inode, uint64_t offset, uint64_t limit, std::string_view where,
                              std::string* name, uint64_t* value_offset, uint32_t* value_size,
                              uint64_t* entry_size) const {
  const std::string context = StrCat(InodeName(inode.nid), ": ", where);
  if (!Within(offset, sizeof(XattrEntry), limit)) {
    return Corrupt(StrCat(context, " at byte ", offset, " runs past its area"));
  }
  char raw[sizeof(XattrEntry)];
  STRATA_RETURN_IF_ERROR(ReadMeta(offset, std::span<char>(raw), context));
  XattrEntry e = LoadStruct<XattrEntry>(raw);
  const uint32_t vsize = Le(e.e_value_size);
  const uint64_t body = sizeof(XattrEntry) + e.e_name_len + uint64_t{vsize};
  if (!Within(offset, body, limit)) {
    return Corrupt(StrCat(context, " at byte ", offset, " (name ", static_cast<int>(e.e_name_len), " bytes, value ",
                          vsize, " bytes) runs past its area"));
  }
  name->clear();
  if (e.e_name_index & kXattrLongPrefix) {
    const uint32_t k = e.e_name_index & kXattrLongPrefixMask;
    if (k >= long_prefixes_.size()) {
      return Corrupt(StrCat(context, " uses long name prefix ", k, ", the image has ", long_prefixes_.size()));
    }
    name->append(XattrPrefix(long_prefixes_[k].base_index));
    name->append(long_prefixes_[k].infix);
  } else {
    std::string_view prefix = XattrPrefix(e.e_name_index);
    if (prefix.empty()) {
      return Corrupt(StrCat(context, " has unknown name index ", static_cast<int>(e.e_name_index)));
    }
    name->append(prefix);
  }
  const size_t prefix_len = name->size();
  name->resize(prefix_len + e.e_name_len);
  STRATA_RETURN_IF_ERROR(ReadMeta(offset + sizeof(XattrEntry),
                                  std::span<char>(name->data() + prefix_len, e.e_name_len), context));
  if (std::string_view(*name).substr(prefix_len).find('\0') != std::string_view::npos) {
    return Corrupt(StrCat(context, ": name ", Quote(*name), " contains a NUL byte"));
  }
  *value_offset = offset + sizeof(XattrEntry) + e.e_name_len;
  *value_size = vsize;
  *entry_size = AlignUp(body, 4);
  return OkStatus();
}

Status Image::ForEachXattr(const Inode& inode, const XattrFn& fn) const {
  if (inode.xattr_size == 0) return OkStatus();
  const uint64_t area = inode.meta_offset + inode.inode_size;
  const uint64_t area_end = area + inode.xattr_size;  // GetInode checked it lies in the image
  if (sizeof(XattrIbodyHeader) + 4 * uint64_t{inode.xattr_shared_count} > inode.xattr_size) {
    return Corrupt(StrCat(InodeName(inode.nid), ": shared xattr ids overflow the xattr area"));
  }
  uint64_t total = 0;
  auto account = [&](std::string_view name, uint32_t value_size) -> Status {
    total += name.size() + value_size;
    if (total > kMaxXattrBytes) {
      return Corrupt(StrCat(InodeName(inode.nid), ": xattrs exceed ", kMaxXattrBytes, " bytes"));
    }
    return OkStatus();
  };

  // Inline entries. Each takes at least 4 bytes, so the loop ends.
  std::string name;
  uint64_t value_offset;
  uint32_t value_size;
  uint64_t entry_size;
  uint64_t pos = area + sizeof(XattrIbodyHeader) + 4 * uint64_t{inode.xattr_shared_count};
  for (uint32_t i = 0; pos < area_end; ++i) {
    STRATA_RETURN_IF_ERROR(ParseXattrEntry(inode, pos, area_end, StrCat("inline xattr ", i), &name,
                                           &value_offset, &value_size, &entry_size));
    STRATA_RETURN_IF_ERROR(account(name, value_size));
    STRATA_ASSIGN_OR_RETURN(bool more, fn(name, value_offset, value_size));
    if (!more) return OkStatus();
    pos += entry_size;
  }

  // Shared entries: ids are 4-byte units from the shared xattr area.
  if (inode.xattr_shared_count != 0) {
    std::string ids(4 * size_t{inode.xattr_shared_count}, '\0');
    STRATA_RETURN_IF_ERROR(ReadMeta(area + sizeof(XattrIbodyHeader), std::span<char>(ids),
                                    StrCat(InodeName(inode.nid), ": shared xattr ids")));
    std::set<uint32_t> seen;
    const uint64_t shared_base = uint64_t{info_.xattr_blkaddr} << blkbits_;
    for (uint32_t i = 0; i < inode.xattr_shared_count; ++i) {
      const uint32_t id = Le(LoadStruct<uint32_t>(ids.data() + 4 * i));
      if (!seen.insert(id).second) {
        return Corrupt(StrCat(InodeName(inode.nid), ": shared xattr id ", id, " is listed twice"));
      }
      const uint64_t at = shared_base + uint64_t{id} * 4;
      STRATA_RETURN_IF_ERROR(ParseXattrEntry(inode, at, meta_size_, StrCat("shared xattr id ", id), &name,
                                             &value_offset, &value_size, &entry_size));
      STRATA_RETURN_IF_ERROR(account(name, value_size));
      STRATA_ASSIGN_OR_RETURN(bool more, fn(name, value_offset, value_size));
      if (!more) return OkStatus();
    }
  }
  return OkStatus();
}

Result<std::vector<Xattr>> Image::ListXattrs(const Inode& inode) const {
  std::vector<Xattr> out;
  std::unordered_set<std::string> names;
  auto collect = [&](std::string_view name, uint64_t value_offset, uint32_t value_size) -> Result<bool> {
    if (!names.emplace(name).second) {
      return Corrupt(StrCat(InodeName(inode.nid), ": xattr ", Quote(name), " appears twice"));
    }
    Xattr x;
    x.name.assign(name);
    x.value.resize(value_size);
    STRATA_RETURN_IF_ERROR(ReadMeta(value_offset, std::span<char>(x.value),
                                    StrCat(InodeName(inode.nid), ": xattr ", Quote(name))));
    out.push_back(std::move(x));
    return true;
  };
  STRATA_RETURN_IF_ERROR(ForEachXattr(inode, collect));
  return out;
}

Result<std::string> Image::GetXattr(const Inode& inode, std::string_view name) const {
  std::string value;
  bool found = false;
  auto match = [&](std::string_view n, uint64_t value_offset, uint32_t value_size) -> Result<bool> {
    if (n != name) return true;
    value.resize(value_size);
    STRATA_RETURN_IF_ERROR(
        ReadMeta(value_offset, std::span<char>(value), StrCat(InodeName(inode.nid), ": xattr ", Quote(n))));
    found = true;
    return false;
  };
  STRATA_RETURN_IF_ERROR(ForEachXattr(inode, match));
  if (!found) return Error(ENODATA, StrCat("erofs image: ", InodeName(inode.nid), " has no xattr ", Quote(name)));
  return value;
}

Status Image::Walk(const WalkVisitor& visit) const {
  STRATA_ASSIGN_OR_RETURN(Inode root, Root());
  STRATA_RETURN_IF_ERROR(visit("/", root));
  struct Frame {
    std::vector<DirEntry> entries;
    size_t next = 0;
    size_t path_len = 0;
  };
  std::unordered_set<uint64_t> dirs{root.nid};
  // No directory block may serve two directories: else a small image could
  // make the walk parse the same blocks once per directory.
  std::unordered_set<uint64_t> dir_blocks;
  std::vector<Frame> stack;
  {
    STRATA_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, ReadDirImpl(root, &dir_blocks));
    stack.push_back({std::move(entries), 0, 0});
  }
  std::string path;
  while (!stack.empty()) {
    Frame& frame = stack.back();
    if (frame.next == frame.entries.size()) {
      stack.pop_back();
      continue;
    }
    const DirEntry& entry = frame.entries[frame.next++];
    path.resize(frame.path_len);
    path += '/';
    path += entry.name;
    auto inode = GetInode(entry.nid);
    if (!inode.ok()) return inode.status().Annotate(Quote(path));
    if (inode->type != entry.type) {
      return Corrupt(StrCat(Quote(path), ": the directory entry says ", FileTypeName(entry.type), ", inode ",
                            entry.nid, " is a ", FileTypeName(inode->type)));
    }
    STRATA_RETURN_IF_ERROR(visit(path, *inode));
    if (inode->type == FileType::kDirectory) {
      if (!dirs.insert(inode->nid).second) {
        return Corrupt(StrCat(Quote(path), ": directory inode ", inode->nid,
                              " is reached twice (a cycle or a hardlinked directory)"));
      }
      auto entries = ReadDirImpl(*inode, &dir_blocks);
      if (!entries.ok()) return entries.status().Annotate(Quote(path));
      const size_t len = path.size();
      stack.push_back({std::move(*entries), 0, len});  // invalidates `frame` and `entry`
    }
  }
  return OkStatus();
}

}  // namespace strata::erofs
