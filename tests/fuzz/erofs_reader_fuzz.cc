// Fuzz target for the EROFS reader: the input is a metadata image. It is
// opened, then the whole tree is walked with bounded work: every inode's
// xattrs, symlink targets, directory lookups, file maps and file reads.
// Extra devices named by the image are stood in for by a source that
// repeats the input, so reads through chunk indexes reach a device.
//
// Built as a libFuzzer target with clang (STRATA_FUZZ=ON) and, through
// replay_main.cc, as a plain program that runs the seed and regression
// files once (the CTest `erofs_fuzz_replay`).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/erofs/format.h"
#include "common/erofs/reader.h"

namespace {

using strata::Error;
using strata::OkStatus;
using strata::Result;
using strata::Status;
using strata::erofs::BlockSource;
using strata::erofs::FileType;
using strata::erofs::Image;
using strata::erofs::Inode;

// Bounds on the work per input, so each input stays fast.
constexpr int kMaxVisits = 512;
constexpr size_t kMaxReadPerFile = 64 << 10;
constexpr uint64_t kMaxReadTotal = 1 << 20;
constexpr size_t kMaxDevices = 8;
constexpr uint64_t kUnknownDeviceSize = 1 << 20;

// A device of `size` bytes whose contents repeat `pattern`.
class PatternSource final : public BlockSource {
 public:
  PatternSource(std::string pattern, uint64_t size) : pattern_(std::move(pattern)), size_(size) {}
  uint64_t size() const override { return size_; }
  Result<size_t> ReadAt(uint64_t offset, std::span<char> out) const override {
    if (offset >= size_) return size_t{0};
    const size_t n = std::min<uint64_t>(out.size(), size_ - offset);
    if (pattern_.empty()) {
      std::memset(out.data(), 0, n);
      return n;
    }
    for (size_t i = 0; i < n;) {
      const size_t at = (offset + i) % pattern_.size();
      const size_t take = std::min(n - i, pattern_.size() - at);
      std::memcpy(out.data() + i, pattern_.data() + at, take);
      i += take;
    }
    return n;
  }

 private:
  std::string pattern_;
  uint64_t size_;
};

void Exercise(const Image& image) {
  uint64_t read_total = 0;
  int visits = 0;
  std::string buf;
  Status walk = image.Walk([&](const std::string&, const Inode& inode) -> Status {
    if (++visits > kMaxVisits) return Error(E2BIG, "fuzz budget");
    auto xattrs = image.ListXattrs(inode);
    if (xattrs.ok() && !xattrs->empty()) (void)image.GetXattr(inode, xattrs->front().name);
    (void)image.GetXattr(inode, "user.absent");
    switch (inode.type) {
      case FileType::kSymlink:
        (void)image.ReadLink(inode);
        break;
      case FileType::kDirectory: {
        (void)image.Lookup(inode, "a");
        (void)image.Lookup(inode, "\xff\xff");
        auto entries = image.ReadDir(inode);
        if (entries.ok() && !entries->empty()) {
          (void)image.Lookup(inode, entries->front().name);
          (void)image.Lookup(inode, entries->back().name);
        }
        break;
      }
      case FileType::kRegular: {
        (void)image.MapFile(inode);
        if (read_total >= kMaxReadTotal) break;
        const size_t want = std::min<uint64_t>({inode.size, kMaxReadPerFile, kMaxReadTotal - read_total});
        buf.resize(want);
        (void)image.Read(inode, 0, std::span<char>(buf));
        if (inode.size > want) {
          // The end of the file, across the last chunk or inline tail.
          (void)image.Read(inode, inode.size - want / 2 - 1, std::span<char>(buf.data(), want / 2 + 1));
        }
        read_total += want;
        break;
      }
      default:
        break;
    }
    return OkStatus();
  });
  (void)walk;
  (void)image.LookupPath("/a/b/../c");
  // Inodes the tree may not reach.
  for (uint64_t nid = 0; nid < 64; ++nid) (void)image.GetInode(nid);
  (void)image.GetInode(image.info().packed_nid);
}

// Recomputes the superblock checksum when the image carries one. Block 0
// holds the superblock and, in small images, the first inodes and the root
// directory too: without this nearly every mutation there would only test
// the checksum.
void FixChecksum(std::string& bytes) {
  using namespace strata::erofs;
  if (bytes.size() < kSuperOffset + sizeof(SuperBlock)) return;
  SuperBlock sb = LoadStruct<SuperBlock>(bytes.data() + kSuperOffset);
  if (!(Le(sb.feature_compat) & kCompatSbChecksum) || sb.blkszbits < kMinBlockBits || sb.blkszbits > kMaxBlockBits) {
    return;
  }
  const uint64_t block = uint64_t{1} << sb.blkszbits;
  const uint64_t len = std::min<uint64_t>(block > kSuperOffset ? block - kSuperOffset : block,
                                          bytes.size() - kSuperOffset);
  const size_t at = kSuperOffset + offsetof(SuperBlock, checksum);
  std::memset(bytes.data() + at, 0, 4);
  const uint32_t crc = Le(Crc32c(~0u, std::string_view(bytes).substr(kSuperOffset, len)));
  std::memcpy(bytes.data() + at, &crc, 4);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  // The input as it is (exercises the checksum check), then with a valid
  // checksum for everything behind it.
  (void)Image::Open(strata::erofs::MemorySource(bytes));
  FixChecksum(bytes);
  auto meta = strata::erofs::MemorySource(bytes);
  auto image = Image::Open(meta);
  if (!image.ok()) return 0;
  const auto& blocks = (*image)->info().device_blocks;
  if (blocks.size() > 1 && blocks.size() - 1 <= kMaxDevices) {
    std::vector<std::shared_ptr<BlockSource>> devices;
    const uint64_t block_size = (*image)->info().block_size;
    for (size_t i = 1; i < blocks.size(); ++i) {
      const uint64_t device_size = blocks[i] != 0 ? blocks[i] * block_size : kUnknownDeviceSize;
      devices.push_back(std::make_shared<PatternSource>(bytes, device_size));
    }
    auto with_devices = Image::Open(meta, std::move(devices));
    if (with_devices.ok()) image = std::move(with_devices);
  }
  Exercise(**image);
  return 0;
}
