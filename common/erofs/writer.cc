// The EROFS image writer: entries in, a metadata image and a data blob out.
//
// Layout of the metadata image (meta_blkaddr 0, so a nid is byte offset / 32):
//
//   0     .. 1024   zeros (room for boot sectors)
//   1024  .. 1152   superblock
//   1152  .. 1280   device table: one slot, the blob
//   1280  ..        inodes in breadth-first order from the root (root nid 40,
//                   well inside the superblock's 16-bit root_nid): each a
//                   64-byte extended inode, its inline xattrs, then its
//                   chunk index table (regular files) or the tail of its
//                   data (directories and symlinks whose tail fits the block)
//   block-aligned   directory and symlink blocks that are not inline, in
//                   inode order
//
// Why these choices: extended inodes keep a full 64-bit mtime with
// nanoseconds per inode (compact ones share the superblock's); 8-byte chunk
// indexes are the chunk format that can name device 1; breadth-first order
// puts a directory's entries next to each other, which is what `ls -l`
// reads. An inode, its xattrs and an inline tail always share one block, as
// mkfs.erofs does it: the kernel insists on the tail, and keeping the rest
// there too keeps fast symlinks fast.
#include "common/erofs/writer.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>

#include "common/erofs/format.h"
#include "common/fs.h"
#include "common/strings.h"

namespace strata::erofs {


namespace {

constexpr uint32_t kHoleChunk = UINT32_MAX;
constexpr uint64_t kInodeSize = sizeof(InodeExtended);
constexpr uint64_t kDevTableOffset = kSuperOffset + kSuperBlockBaseSize;
constexpr uint64_t kFirstInodeOffset = kDevTableOffset + sizeof(DeviceSlot);
static_assert(kDevTableOffset % sizeof(DeviceSlot) == 0);
static_assert(kFirstInodeOffset % (1u << kInodeSlotBits) == 0);
// i_xattr_icount is 16 bits: the inline xattr area is at most this.
constexpr uint64_t kMaxXattrArea = sizeof(XattrIbodyHeader) + 4 * (uint64_t{UINT16_MAX} - 1);
constexpr uint64_t kMaxXattrValue = UINT16_MAX;  // e_value_size is 16 bits
constexpr uint64_t kMaxSymlink = kMaxSymlinkSize;
// A chunk table beyond this (1 GiB of indexes; 128 TiB at 1 MiB chunks) is
// a hostile or broken size, not a file.
constexpr uint64_t kMaxChunksPerFile = uint64_t{1} << 27;

uint64_t AlignUp(uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; }

std::string Shown(std::string_view path) { return path.empty() ? std::string("/") : Quote(path); }

Status Fail(int code, std::string_view what, std::string_view path, std::string_view detail) {
  return Error(code, StrCat("erofs writer: ", what, " ", Shown(path), ": ", detail));
}

// A failed system call: the step, then the errno text.
Status FailErrno(int err, std::string_view what, std::string_view path, std::string_view step) {
  return Fail(err, what, path, StrCat(step, ": ", std::strerror(err)));
}

std::string_view TypeName(FileType type) { return FileTypeName(type); }

uint16_t TypeBits(FileType type) {
  switch (type) {
    case FileType::kRegular: return S_IFREG;
    case FileType::kDirectory: return S_IFDIR;
    case FileType::kSymlink: return S_IFLNK;
    case FileType::kCharDevice: return S_IFCHR;
    case FileType::kBlockDevice: return S_IFBLK;
    case FileType::kFifo: return S_IFIFO;
    case FileType::kSocket: return S_IFSOCK;
  }
  return 0;
}

uint8_t DirentType(FileType type) {
  switch (type) {
    case FileType::kRegular: return kFtRegular;
    case FileType::kDirectory: return kFtDirectory;
    case FileType::kSymlink: return kFtSymlink;
    case FileType::kCharDevice: return kFtCharDevice;
    case FileType::kBlockDevice: return kFtBlockDevice;
    case FileType::kFifo: return kFtFifo;
    case FileType::kSocket: return kFtSocket;
  }
  return kFtUnknown;
}

// Little-endian store for the on-disk structures.
template <typename T>
T ToLe(T v) {
  return Le(v);  // the conversion is its own inverse
}

// Splits a relative path into its components and checks each.
Result<std::vector<std::string_view>> SplitPath(std::string_view what, std::string_view path) {
  std::vector<std::string_view> parts;
  if (path.empty()) return parts;
  size_t pos = 0;
  while (true) {
    size_t slash = path.find('/', pos);
    std::string_view part = path.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
    if (part.empty()) {
      return Fail(EINVAL, what, path, "empty path component (a leading, trailing or doubled '/')");
    }
    if (part == "." || part == "..") {
      return Fail(EINVAL, what, path, StrCat("path component ", Quote(part), " is not allowed"));
    }
    if (part.size() > kNameMax) {
      return Fail(ENAMETOOLONG, what, path,
                  StrCat("a name of ", part.size(), " bytes (at most ", kNameMax, ")"));
    }
    if (part.find('\0') != std::string_view::npos) return Fail(EINVAL, what, path, "a name contains a NUL byte");
    parts.push_back(part);
    if (slash == std::string_view::npos) break;
    pos = slash + 1;
  }
  return parts;
}

// The EROFS name index and the rest of an xattr name.
Result<std::pair<uint8_t, std::string_view>> XattrKey(std::string_view name) {
  struct Prefix {
    std::string_view text;
    uint8_t index;
    bool whole;  // the name is exactly the prefix
  };
  static constexpr Prefix kPrefixes[] = {
      {"user.", kXattrIndexUser, false},
      {"trusted.", kXattrIndexTrusted, false},
      {"security.", kXattrIndexSecurity, false},
      {"system.posix_acl_access", kXattrIndexPosixAclAccess, true},
      {"system.posix_acl_default", kXattrIndexPosixAclDefault, true},
  };
  if (name.find('\0') != std::string_view::npos) {
    return Error(EINVAL, StrCat("xattr name ", Quote(name), " contains a NUL byte"));
  }
  for (const Prefix& p : kPrefixes) {
    if (p.whole ? name != p.text : !name.starts_with(p.text)) continue;
    std::string_view rest = name.substr(p.text.size());
    if (!p.whole && rest.empty()) return Error(EINVAL, StrCat("xattr name ", Quote(name), " is only a prefix"));
    if (rest.size() > kNameMax) {
      return Error(ERANGE,
                   StrCat("xattr name ", Quote(name), " is longer than ", kNameMax, " bytes after its prefix"));
    }
    return std::make_pair(p.index, rest);
  }
  return Error(ENOTSUP, StrCat("xattr name ", Quote(name),
                               ": an EROFS image can hold only user.*, trusted.*, security.*, "
                               "system.posix_acl_access and system.posix_acl_default"));
}

uint64_t XattrEntrySize(std::string_view name, std::string_view value) {
  // XattrKey succeeded for every stored name.
  auto key = XattrKey(name);
  return AlignUp(sizeof(XattrEntry) + key->second.size() + value.size(), 4);
}

// True when all n bytes are zero. Checks 256 bytes at a time so the inner
// loop vectorizes.
bool IsZero(const char* p, size_t n) {
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    uint64_t acc = 0;
    for (size_t j = 0; j < 256; j += 8) {
      uint64_t w;
      std::memcpy(&w, p + i + j, 8);
      acc |= w;
    }
    if (acc) return false;
  }
  for (; i < n; ++i) {
    if (p[i]) return false;
  }
  return true;
}

}  // namespace

// One inode of the tree. Hardlinks share a Node; a directory is owned by
// exactly one parent.
struct ImageWriter::Node {
  FileType type = FileType::kRegular;
  uint32_t perm = 0;
  uint32_t uid = 0, gid = 0;
  int64_t mtime = 0;
  uint32_t mtime_nsec = 0;
  uint32_t rdev = 0;  // on-disk (new_encode_dev) form
  std::map<std::string, std::string, std::less<>> xattrs;
  uint64_t size = 0;  // regular files and symlinks
  // Regular files: the stored chunk of each chunk that is not a hole, by
  // chunk number, ascending.
  std::vector<std::pair<uint64_t, uint32_t>> chunks;
  std::string target;                                                  // symlinks
  std::map<std::string, std::shared_ptr<Node>, std::less<>> children;  // directories

  // Layout, filled by Finish.
  bool placed = false;
  Node* parent = nullptr;  // directories: the directory holding it
  uint32_t nlink = 0;
  uint32_t ino = 0;
  uint64_t pos = 0;  // byte offset of the inode in the metadata image
  uint64_t xattr_size = 0;
  uint32_t layout = kLayoutFlatPlain;
  uint64_t data_size = 0;    // directories: dirent bytes; symlinks: target bytes
  uint64_t data_blocks = 0;  // blocks in the data area
  uint32_t start_block = kNullAddr;
  std::vector<size_t> dir_blocks;  // directories: index of the first entry of each block
};

struct ImageWriter::StoredChunk {
  uint64_t offset;  // in the blob, block-aligned
  uint64_t length;
  Digest128 hash;
  bool live;
};

struct ImageWriter::ChunkMap {
  std::unordered_map<Digest128, uint32_t, Digest128Hash> ids;
};

// Collects one file's data into chunk-sized pieces in the writer's buffer
// and stores each completed chunk.
class ImageWriter::ChunkAssembler {
 public:
  ChunkAssembler(ImageWriter& writer, std::string_view path, uint64_t size)
      : w_(writer), path_(path), size_(size), chunk_bits_(std::countr_zero(writer.options_.chunk_size)) {}

  // Copies `data`, which belongs at `offset`.
  Status Put(uint64_t offset, std::span<const char> data) {
    STRATA_RETURN_IF_ERROR(CheckRange(offset, data.size()));
    while (!data.empty()) {
      STRATA_ASSIGN_OR_RETURN(size_t in, Seek(offset));
      const size_t n = std::min<uint64_t>(data.size(), ChunkLength() - in);
      std::memcpy(w_.buffer_.data() + in, data.data(), n);
      filled_ = in + n;
      offset += n;
      data = data.subspan(n);
    }
    next_ = offset;
    return OkStatus();
  }

  // Reads `length` bytes at `offset` of `fd` straight into the buffer.
  Status PutFromFd(int fd, uint64_t offset, uint64_t length) {
    STRATA_RETURN_IF_ERROR(CheckRange(offset, length));
    while (length > 0) {
      STRATA_ASSIGN_OR_RETURN(size_t in, Seek(offset));
      const size_t n = std::min<uint64_t>(length, ChunkLength() - in);
      auto got = PreadFull(fd, std::span<char>(w_.buffer_.data() + in, n), offset);
      if (!got.ok())
        return Fail(got.status().code(), "file", path_,
                    StrCat("read data at offset ", offset, ": ", got.status().message()));
      if (*got != n) {
        return Fail(
            EIO, "file", path_,
            StrCat("the file shrank while being read (it ended at ", offset + *got, ", its size was ", size_, ")"));
      }
      filled_ = in + n;
      offset += n;
      length -= n;
    }
    next_ = offset;
    return OkStatus();
  }

  // Stores the chunk still open.
  Status Finish() {
    if (current_ == kNone) return OkStatus();
    return Flush();
  }

  std::vector<std::pair<uint64_t, uint32_t>> TakeChunks() { return std::move(chunks_); }

 private:
  static constexpr uint64_t kNone = UINT64_MAX;

  Status CheckRange(uint64_t offset, uint64_t length) const {
    if (offset < next_) {
      return Fail(EINVAL, "file", path_,
                  StrCat("data at offset ", offset, " comes after data up to offset ", next_,
                         " (pieces must come in order and not overlap)"));
    }
    if (offset > size_ || length > size_ - offset) {
      return Fail(EINVAL, "file", path_,
                  StrCat(length, " bytes of data at offset ", offset, " pass the file's size of ", size_, " bytes"));
    }
    return OkStatus();
  }

  uint64_t ChunkLength() const {
    const uint64_t start = current_ << chunk_bits_;
    return std::min<uint64_t>(uint64_t{1} << chunk_bits_, size_ - start);
  }

  // Makes the chunk holding `offset` the open one and zero-fills up to
  // `offset`; returns the offset within the chunk.
  Result<size_t> Seek(uint64_t offset) {
    const uint64_t chunk = offset >> chunk_bits_;
    if (chunk != current_) {
      if (current_ != kNone) STRATA_RETURN_IF_ERROR(Flush());
      current_ = chunk;
      filled_ = 0;
    }
    const size_t in = static_cast<size_t>(offset - (chunk << chunk_bits_));
    if (in > filled_) std::memset(w_.buffer_.data() + filled_, 0, in - filled_);
    return in;
  }

  Status Flush() {
    const size_t length = static_cast<size_t>(ChunkLength());
    if (filled_ < length) std::memset(w_.buffer_.data() + filled_, 0, length - filled_);
    STRATA_ASSIGN_OR_RETURN(uint32_t id, w_.StoreChunk(path_, current_ << chunk_bits_, length));
    if (id != kHoleChunk) chunks_.emplace_back(current_, id);
    current_ = kNone;
    filled_ = 0;
    return OkStatus();
  }

  ImageWriter& w_;
  std::string_view path_;
  uint64_t size_;
  int chunk_bits_;
  uint64_t current_ = kNone;  // the chunk in the buffer
  size_t filled_ = 0;         // bytes of it set so far
  uint64_t next_ = 0;         // the lowest file offset data may still come at
  std::vector<std::pair<uint64_t, uint32_t>> chunks_;
};

ImageWriter::ImageWriter(const Options& options) : options_(options), chunk_ids_(std::make_unique<ChunkMap>()) {}

ImageWriter::~ImageWriter() = default;

Result<std::unique_ptr<ImageWriter>> ImageWriter::Create(const Options& options) {
  const uint32_t b = options.block_size, c = options.chunk_size;
  if (!std::has_single_bit(b) || b < 4096 || b > (1u << kMaxBlockBits)) {
    return Error(EINVAL, StrCat("erofs writer: block size ", b, ": must be a power of two from 4096 to 65536"));
  }
  if (!std::has_single_bit(c) || c < b) {
    return Error(EINVAL, StrCat("erofs writer: chunk size ", c, ": must be a power of two of at least the block size (",
                                b, ")"));
  }
  if (std::countr_zero(c) - std::countr_zero(b) > kChunkFormatBlkbitsMask) {
    return Error(EINVAL, StrCat("erofs writer: chunk size ", c, " is too large"));
  }
  std::unique_ptr<ImageWriter> w(new ImageWriter(options));
  w->blkbits_ = static_cast<uint32_t>(std::countr_zero(b));
  auto fd = OpenFile(options.blob_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (!fd.ok()) return fd.status().Annotate("erofs writer: create the blob");
  w->blob_fd_ = std::move(*fd);
  w->buffer_.resize(c);
  w->root_ = std::make_shared<Node>();
  w->root_->type = FileType::kDirectory;
  w->root_->perm = 0755;
  return w;
}

Status ImageWriter::CheckOpen(std::string_view what, std::string_view path) const {
  if (finished_) return Fail(EINVAL, what, path, "the image is already finished");
  return OkStatus();
}

std::shared_ptr<ImageWriter::Node> ImageWriter::FindShared(std::string_view path) const {
  auto parts = SplitPath("find", path);
  if (!parts.ok()) return nullptr;
  const std::shared_ptr<Node>* node = &root_;
  for (std::string_view part : *parts) {
    if ((*node)->type != FileType::kDirectory) return nullptr;
    auto it = (*node)->children.find(part);
    if (it == (*node)->children.end()) return nullptr;
    node = &it->second;
  }
  return *node;
}

ImageWriter::Node* ImageWriter::Find(std::string_view path) const { return FindShared(path).get(); }

std::optional<FileType> ImageWriter::TypeOf(std::string_view path) const {
  Node* node = Find(path);
  if (!node) return std::nullopt;
  return node->type;
}

Result<ImageWriter::Node*> ImageWriter::Parent(std::string_view what, std::string_view path, bool create,
                                               std::string_view* name) {
  STRATA_ASSIGN_OR_RETURN(auto parts, SplitPath(what, path));
  if (parts.empty()) return Fail(EINVAL, what, path, "the root cannot be added as this kind of entry");
  Node* node = root_.get();
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto it = node->children.find(parts[i]);
    if (it == node->children.end()) {
      if (!create) break;  // the rest is missing and will be created
      auto dir = std::make_shared<Node>();
      dir->type = FileType::kDirectory;
      dir->perm = 0755;
      it = node->children.emplace(std::string(parts[i]), std::move(dir)).first;
    } else if (it->second->type != FileType::kDirectory) {
      std::string_view prefix = path.substr(0, static_cast<size_t>(parts[i].data() + parts[i].size() - path.data()));
      return Fail(ENOTDIR, what, path,
                  StrCat("parent ", Quote(prefix), " is a ", TypeName(it->second->type),
                         ", not a directory (paths never pass through symlinks)"));
    }
    node = it->second.get();
  }
  *name = parts.back();
  return node;
}

Result<std::shared_ptr<ImageWriter::Node>> ImageWriter::NewNode(std::string_view what, std::string_view path,
                                                                FileType type, const Attributes& attrs) {
  auto node = std::make_shared<Node>();
  node->type = type;
  node->perm = attrs.mode & 07777;
  node->uid = attrs.uid;
  node->gid = attrs.gid;
  node->mtime = attrs.mtime;
  if (attrs.mtime_nsec >= 1000000000u) {
    return Fail(EINVAL, what, path, StrCat("mtime nanoseconds ", attrs.mtime_nsec, " are not below 10^9"));
  }
  node->mtime_nsec = attrs.mtime_nsec;
  for (const Xattr& x : attrs.xattrs) {
    auto key = XattrKey(x.name);
    if (!key.ok()) return Fail(key.status().code(), what, path, key.status().message());
    if (x.value.size() > kMaxXattrValue) {
      return Fail(E2BIG, what, path,
                  StrCat("xattr ", Quote(x.name), " has a value of ", x.value.size(), " bytes (EROFS stores at most ",
                         kMaxXattrValue, ")"));
    }
    node->xattrs[x.name] = x.value;
  }
  STRATA_RETURN_IF_ERROR(CheckXattrArea(what, path, *node));
  return node;
}

Status ImageWriter::CheckXattrArea(std::string_view what, std::string_view path, const Node& node) const {
  if (node.xattrs.empty()) return OkStatus();
  if (node.type != FileType::kRegular && node.type != FileType::kDirectory) {
    // The kernel lists user.* xattrs of other inodes but never returns their
    // values (and no Linux filesystem lets one set them).
    auto user = node.xattrs.lower_bound("user.");
    if (user != node.xattrs.end() && user->first.starts_with("user.")) {
      return Fail(EPERM, what, path,
                  StrCat("xattr ", Quote(user->first), ": user.* xattrs exist only on regular files and directories"));
    }
  }
  uint64_t area = sizeof(XattrIbodyHeader);
  for (const auto& [name, value] : node.xattrs) area += XattrEntrySize(name, value);
  if (area > kMaxXattrArea) {
    return Fail(
        E2BIG, what, path,
        StrCat(node.xattrs.size(), " xattrs take ", area, " bytes; an EROFS inode holds at most ", kMaxXattrArea));
  }
  return OkStatus();
}

void ImageWriter::Place(Node* parent, std::string_view name, std::shared_ptr<Node> node) {
  auto it = parent->children.find(name);
  if (it == parent->children.end()) {
    parent->children.emplace(std::string(name), std::move(node));
    return;
  }
  Node& old = *it->second;
  if (old.type == FileType::kDirectory && node->type == FileType::kDirectory) {
    // tar extracting a directory over a directory: the entries stay, the
    // attributes are the new ones.
    node->children = std::move(old.children);
  }
  it->second = std::move(node);
}

Status ImageWriter::AddDirectory(std::string_view path, const Attributes& attrs) {
  constexpr std::string_view kWhat = "directory";
  STRATA_RETURN_IF_ERROR(CheckOpen(kWhat, path));
  STRATA_ASSIGN_OR_RETURN(auto node, NewNode(kWhat, path, FileType::kDirectory, attrs));
  if (path.empty()) {
    node->children = std::move(root_->children);
    root_ = std::move(node);
    return OkStatus();
  }
  std::string_view name;
  STRATA_ASSIGN_OR_RETURN(Node * parent, Parent(kWhat, path, /*create=*/true, &name));
  Place(parent, name, std::move(node));
  return OkStatus();
}

Status ImageWriter::AddFile(std::string_view path, const Attributes& attrs, uint64_t size, const DataSource& source) {
  constexpr std::string_view kWhat = "file";
  STRATA_RETURN_IF_ERROR(CheckOpen(kWhat, path));
  STRATA_ASSIGN_OR_RETURN(auto node, NewNode(kWhat, path, FileType::kRegular, attrs));
  std::string_view name;
  STRATA_RETURN_IF_ERROR(Parent(kWhat, path, /*create=*/false, &name).status());
  STRATA_RETURN_IF_ERROR(CheckFileSize(path, size));
  node->size = size;
  ChunkAssembler chunks(*this, path, size);
  while (true) {
    auto piece = source();
    if (!piece.ok()) return piece.status().Annotate(StrCat("erofs writer: file ", Shown(path)));
    if (!piece->has_value()) break;
    STRATA_RETURN_IF_ERROR(chunks.Put((*piece)->offset, (*piece)->data));
  }
  STRATA_RETURN_IF_ERROR(chunks.Finish());
  node->chunks = chunks.TakeChunks();
  STRATA_ASSIGN_OR_RETURN(Node * parent, Parent(kWhat, path, /*create=*/true, &name));
  Place(parent, name, std::move(node));
  return OkStatus();
}

Status ImageWriter::AddFile(std::string_view path, const Attributes& attrs, int fd) {
  constexpr std::string_view kWhat = "file";
  STRATA_RETURN_IF_ERROR(CheckOpen(kWhat, path));
  STRATA_ASSIGN_OR_RETURN(auto node, NewNode(kWhat, path, FileType::kRegular, attrs));
  std::string_view name;
  STRATA_RETURN_IF_ERROR(Parent(kWhat, path, /*create=*/false, &name).status());
  struct stat st;
  if (::fstat(fd, &st) != 0) return FailErrno(errno, kWhat, path, "stat the descriptor");
  if (!S_ISREG(st.st_mode)) return Fail(EINVAL, kWhat, path, "the descriptor is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  STRATA_RETURN_IF_ERROR(CheckFileSize(path, size));
  node->size = size;
  ChunkAssembler chunks(*this, path, size);
  uint64_t pos = 0;
  while (pos < size) {
    off_t data = ::lseek(fd, static_cast<off_t>(pos), SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // only a hole remains
      if (errno != EINVAL) return FailErrno(errno, kWhat, path, StrCat("seek data from offset ", pos));
      data = static_cast<off_t>(pos);  // no SEEK_DATA here: all of it is data
    }
    if (static_cast<uint64_t>(data) >= size) break;
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    if (hole < 0) {
      if (errno != EINVAL) return FailErrno(errno, kWhat, path, StrCat("seek hole from offset ", data));
      hole = static_cast<off_t>(size);
    }
    const uint64_t end = std::min<uint64_t>(static_cast<uint64_t>(hole), size);
    if (end <= static_cast<uint64_t>(data)) {
      return Fail(EIO, kWhat, path, StrCat("SEEK_HOLE from offset ", data, " went backwards to ", hole));
    }
    STRATA_RETURN_IF_ERROR(chunks.PutFromFd(fd, static_cast<uint64_t>(data), end - static_cast<uint64_t>(data)));
    pos = end;
  }
  STRATA_RETURN_IF_ERROR(chunks.Finish());
  // A file cut short while we read it would otherwise pass for one whose
  // tail is a hole.
  if (::fstat(fd, &st) != 0) return FailErrno(errno, kWhat, path, "stat the descriptor after reading");
  if (static_cast<uint64_t>(st.st_size) < size) {
    return Fail(EIO, kWhat, path,
                StrCat("the file shrank while being read (from ", size, " to ", st.st_size, " bytes)"));
  }
  node->chunks = chunks.TakeChunks();
  STRATA_ASSIGN_OR_RETURN(Node * parent, Parent(kWhat, path, /*create=*/true, &name));
  Place(parent, name, std::move(node));
  return OkStatus();
}

Status ImageWriter::CheckFileSize(std::string_view path, uint64_t size) const {
  const uint64_t chunks = (size >> std::countr_zero(options_.chunk_size)) + ((size & (options_.chunk_size - 1)) != 0);
  if (size > static_cast<uint64_t>(INT64_MAX) || chunks > kMaxChunksPerFile) {
    return Fail(
        EFBIG, "file", path,
        StrCat("a size of ", size, " bytes needs ", chunks, " chunk indexes (at most ", kMaxChunksPerFile, ")"));
  }
  return OkStatus();
}

Status ImageWriter::AddSymlink(std::string_view path, const Attributes& attrs, std::string_view target) {
  constexpr std::string_view kWhat = "symlink";
  STRATA_RETURN_IF_ERROR(CheckOpen(kWhat, path));
  if (target.empty() || target.size() > kMaxSymlink) {
    return Fail(EINVAL, kWhat, path, StrCat("a target of ", target.size(), " bytes (1 to ", kMaxSymlink, ")"));
  }
  if (target.find('\0') != std::string_view::npos) return Fail(EINVAL, kWhat, path, "the target contains a NUL byte");
  STRATA_ASSIGN_OR_RETURN(auto node, NewNode(kWhat, path, FileType::kSymlink, attrs));
  node->target = target;
  node->size = target.size();
  std::string_view name;
  STRATA_ASSIGN_OR_RETURN(Node * parent, Parent(kWhat, path, /*create=*/true, &name));
  Place(parent, name, std::move(node));
  return OkStatus();
}

Status ImageWriter::AddSpecial(std::string_view path, FileType type, const Attributes& attrs, uint64_t rdev) {
  constexpr std::string_view kWhat = "special file";
  STRATA_RETURN_IF_ERROR(CheckOpen(kWhat, path));
  uint32_t encoded = 0;
  switch (type) {
    case FileType::kCharDevice:
    case FileType::kBlockDevice: {
      const uint64_t maj = major(rdev), min = minor(rdev);
      if (maj > 0xfff || min > 0xfffff) {
        return Fail(
            EOVERFLOW, kWhat, path,
            StrCat("device number ", maj, ":", min, " cannot be stored (EROFS keeps 12-bit majors and 20-bit minors)"));
      }
      // The kernel's new_encode_dev(), which new_decode_dev() reads back.
      encoded = static_cast<uint32_t>((min & 0xff) | (maj << 8) | ((min & ~uint64_t{0xff}) << 12));
      break;
    }
    case FileType::kFifo:
    case FileType::kSocket: break;
    default: return Fail(EINVAL, kWhat, path, StrCat("a ", TypeName(type), " is not a special file"));
  }
  STRATA_ASSIGN_OR_RETURN(auto node, NewNode(kWhat, path, type, attrs));
  node->rdev = encoded;
  std::string_view name;
  STRATA_ASSIGN_OR_RETURN(Node * parent, Parent(kWhat, path, /*create=*/true, &name));
  Place(parent, name, std::move(node));
  return OkStatus();
}

Status ImageWriter::AddHardlink(std::string_view path, std::string_view target) {
  constexpr std::string_view kWhat = "hardlink";
  STRATA_RETURN_IF_ERROR(CheckOpen(kWhat, path));
  STRATA_ASSIGN_OR_RETURN(auto target_parts, SplitPath(kWhat, target));
  if (target_parts.empty()) return Fail(EPERM, kWhat, path, "a hardlink to the root directory");
  std::shared_ptr<Node> inode = FindShared(target);
  if (!inode) return Fail(ENOENT, kWhat, path, StrCat("its target ", Quote(target), " does not exist"));
  if (inode->type == FileType::kDirectory) {
    return Fail(EPERM, kWhat, path, StrCat("its target ", Quote(target), " is a directory"));
  }
  std::string_view name;
  STRATA_ASSIGN_OR_RETURN(Node * parent, Parent(kWhat, path, /*create=*/true, &name));
  Place(parent, name, std::move(inode));
  return OkStatus();
}

Status ImageWriter::SetXattr(std::string_view path, std::string_view name, std::string_view value) {
  constexpr std::string_view kWhat = "xattr of";
  STRATA_RETURN_IF_ERROR(CheckOpen(kWhat, path));
  Node* node = Find(path);
  if (!node) return Fail(ENOENT, kWhat, path, "no such entry");
  auto key = XattrKey(name);
  if (!key.ok()) return Fail(key.status().code(), kWhat, path, key.status().message());
  if (value.size() > kMaxXattrValue) {
    return Fail(E2BIG, kWhat, path,
                StrCat("xattr ", Quote(name), " has a value of ", value.size(), " bytes (EROFS stores at most ",
                       kMaxXattrValue, ")"));
  }
  auto it = node->xattrs.find(name);
  std::optional<std::string> old;
  if (it != node->xattrs.end()) old = it->second;
  node->xattrs[std::string(name)] = value;
  Status area = CheckXattrArea(kWhat, path, *node);
  if (!area.ok()) {
    if (old) {
      node->xattrs[std::string(name)] = *old;
    } else {
      node->xattrs.erase(std::string(name));
    }
  }
  return area;
}

Result<uint32_t> ImageWriter::StoreChunk(std::string_view path, uint64_t file_offset, size_t length) {
  char* data = buffer_.data();
  if (IsZero(data, length)) return kHoleChunk;
  const Digest128 hash = HashBytes(std::span<const char>(data, length));
  auto it = chunk_ids_->ids.find(hash);
  if (it != chunk_ids_->ids.end()) return it->second;
  const uint64_t padded = AlignUp(length, options_.block_size);  // <= chunk size, the buffer's size
  std::memset(data + length, 0, padded - length);
  if (((blob_end_ + padded) >> blkbits_) > kNullAddr - 1) {
    return Fail(EFBIG, "file", path, "the blob would pass 2^32 blocks, the most a chunk index can address");
  }
  Status written = PwriteFull(blob_fd_.get(), std::span<const char>(data, padded), blob_end_);
  if (!written.ok()) {
    return Fail(written.code(), "file", path,
                StrCat("write the chunk at file offset ", file_offset, " to the blob ", options_.blob_path, ": ",
                       written.message()));
  }
  const uint32_t id = static_cast<uint32_t>(chunks_.size());
  chunks_.push_back({blob_end_, length, hash, false});
  chunk_ids_->ids.emplace(hash, id);
  blob_end_ += padded;
  return id;
}

// Small chunks side by side in the blob become one extent, so a tree of
// many small files is not as many store objects, fetches and cache files
// (docs/formats.md, "The blob's extents"). A group takes chunks under half
// the group size that follow each other with nothing between them but
// their padding, and ends after a chunk whose name ends in four zero bits,
// or where the next chunk would take it past the group size (or is not
// small, or does not follow directly). Where a group ends thus
// depends on its members' names and sizes, not on their offsets: a changed
// file renames its own group, and the groups after it up to the next one
// that ended by a name (usually none or one: a group ends by size only
// when its members average over 8 KiB); the groups after that are the same
// as before, wherever their chunks moved in the blob.
Result<std::vector<BlobExtent>> ImageWriter::GroupSmallChunks(const std::vector<const StoredChunk*>& live) const {
  const uint64_t group = std::min<uint64_t>(options_.group_size, options_.chunk_size);
  const uint64_t bsize = options_.block_size;
  std::vector<BlobExtent> out;
  std::string buf;
  auto small = [&](const StoredChunk& c) { return group > 0 && c.length < group / 2; };
  for (size_t i = 0; i < live.size();) {
    const StoredChunk& first = *live[i];
    size_t end = i + 1;  // one past the group's last member
    if (small(first)) {
      while (end < live.size() && (live[end - 1]->hash.low & 15) != 0) {
        const StoredChunk& prev = *live[end - 1];
        const StoredChunk& next = *live[end];
        if (!small(next) || next.offset != prev.offset + AlignUp(prev.length, bsize) ||
            next.offset + next.length - first.offset > group) {
          break;
        }
        ++end;
      }
    }
    if (end == i + 1) {
      out.push_back({first.offset, first.length, first.hash});
      ++i;
      continue;
    }
    const StoredChunk& last = *live[end - 1];
    const uint64_t length = last.offset + last.length - first.offset;
    buf.resize(length);
    auto read = PreadFull(blob_fd_.get(), buf, first.offset);
    if (!read.ok() || *read != length) {
      return Error(read.ok() ? EIO : read.status().code(),
                   StrCat("read back a group of chunks at ", first.offset, " from the blob ", options_.blob_path, ": ",
                          read.ok() ? "short read" : read.status().message()));
    }
    out.push_back({first.offset, length, HashBytes(buf)});
    i = end;
  }
  return out;
}

namespace {

// The metadata image as it is written: appends in order, hashes every byte
// (with the UUID and checksum still zero) and keeps the first block, which
// Finish patches at the end.
class MetaOut {
 public:
  MetaOut(int fd, uint32_t block_size) : fd_(fd), block_size_(block_size) { buf_.reserve(kFlushAt + 65536); }

  uint64_t pos() const { return flushed_ + buf_.size(); }

  Status Append(const void* data, size_t n) {
    buf_.append(static_cast<const char*>(data), n);
    return buf_.size() >= kFlushAt ? Flush() : OkStatus();
  }
  Status Append(std::string_view s) { return Append(s.data(), s.size()); }
  template <typename T>
  Status AppendStruct(const T& v) {
    return Append(&v, sizeof v);
  }
  Status ZeroTo(uint64_t offset) {
    // Layout computed every offset; going backwards is a bug.
    if (offset < pos())
      return Error(EFAULT, StrCat("erofs writer: layout error: writing at ", pos(), " past ", offset));
    while (pos() < offset) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(offset - pos(), kFlushAt));
      buf_.append(n, '\0');
      if (buf_.size() >= kFlushAt) STRATA_RETURN_IF_ERROR(Flush());
    }
    return OkStatus();
  }

  Status Flush() {
    if (buf_.empty()) return OkStatus();
    if (flushed_ == 0) first_block_ = buf_.substr(0, block_size_);
    hasher_.Update(buf_);
    STRATA_RETURN_IF_ERROR(PwriteFull(fd_, buf_, flushed_));
    flushed_ += buf_.size();
    buf_.clear();
    return OkStatus();
  }

  std::string& first_block() { return first_block_; }
  Hasher& hasher() { return hasher_; }

 private:
  static constexpr size_t kFlushAt = 1 << 20;  // larger than any block
  int fd_;
  uint32_t block_size_;
  std::string buf_;
  uint64_t flushed_ = 0;
  std::string first_block_;
  Hasher hasher_;
};

}  // namespace

Result<ImageSummary> ImageWriter::Finish(const std::string& meta_path) {
  STRATA_RETURN_IF_ERROR(CheckOpen("image", ""));
  finished_ = true;
  const uint64_t bsize = options_.block_size;
  auto fail = [&](int code, std::string_view detail) {
    return Error(code, StrCat("erofs writer: finish ", meta_path, ": ", detail));
  };

  // 1. Inode order: breadth-first from the root, entries sorted, a
  //    hardlinked inode where its first name is met. Link counts on the way.
  std::vector<Node*> order{root_.get()};
  root_->placed = true;
  root_->parent = root_.get();
  for (size_t i = 0; i < order.size(); ++i) {
    Node* dir = order[i];
    if (dir->type != FileType::kDirectory) continue;
    dir->nlink = 2;
    for (const auto& [name, child] : dir->children) {
      if (child->type == FileType::kDirectory) {
        ++dir->nlink;
        child->parent = dir;
      }
      ++child->nlink;  // directories get their real count when their turn comes
      if (!child->placed) {
        child->placed = true;
        order.push_back(child.get());
      }
    }
  }
  if (order.size() > UINT32_MAX) return fail(EFBIG, StrCat(order.size(), " inodes; at most 2^32 - 1"));

  // A directory's entries in on-disk order, "." and ".." included: EROFS
  // stores them, sorted with the rest (the kernel binary-searches them all).
  struct Entry {
    std::string_view name;
    const Node* node;
  };
  auto sorted_entries = [](const Node& dir) {
    std::vector<Entry> entries;
    entries.reserve(dir.children.size() + 2);
    for (const auto& [name, child] : dir.children) entries.push_back({name, child.get()});
    for (const Entry dot : {Entry{".", &dir}, Entry{"..", dir.parent}}) {
      auto at = std::lower_bound(entries.begin(), entries.end(), dot.name,
                                 [](const Entry& e, std::string_view n) { return e.name < n; });
      entries.insert(at, dot);
    }
    return entries;
  };

  // 2. Sizes: xattrs, directory blocks, data.
  for (Node* node : order) {
    if (!node->xattrs.empty()) {
      node->xattr_size = sizeof(XattrIbodyHeader);
      for (const auto& [name, value] : node->xattrs) node->xattr_size += XattrEntrySize(name, value);
    }
    if (node->type == FileType::kDirectory) {
      const auto entries = sorted_entries(*node);
      uint64_t used = 0, total = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const uint64_t need = sizeof(Dirent) + entries[i].name.size();
        if (i == 0 || used + need > bsize) {
          if (i != 0) total += bsize;
          node->dir_blocks.push_back(i);
          used = 0;
        }
        used += need;
      }
      node->data_size = total + used;
    } else if (node->type == FileType::kSymlink) {
      node->data_size = node->target.size();
    }
  }

  // 3. Place the inodes, then the data blocks after them.
  uint64_t pos = kFirstInodeOffset;
  for (Node* node : order) {
    pos = AlignUp(pos, 1u << kInodeSlotBits);
    const uint64_t head = kInodeSize + node->xattr_size;
    uint64_t end;
    switch (node->type) {
      case FileType::kRegular:
        if (node->size == 0) {
          node->layout = kLayoutFlatPlain;
          end = pos + head;
        } else {
          node->layout = kLayoutChunkBased;
          const uint64_t nchunks = (node->size + options_.chunk_size - 1) / options_.chunk_size;
          end = AlignUp(pos + head, sizeof(ChunkIndex)) + nchunks * sizeof(ChunkIndex);
        }
        break;
      case FileType::kDirectory:
      case FileType::kSymlink: {
        const uint64_t tail = node->data_size % bsize, full = node->data_size / bsize;
        const uint64_t in_block = pos % bsize;
        bool inline_tail = false;
        if (tail != 0) {
          if (in_block + head + tail <= bsize) {
            inline_tail = true;
          } else if (head + tail <= bsize && bsize - in_block <= bsize - tail) {
            // Starting a new block wastes less than a data block would.
            pos = AlignUp(pos, bsize);
            inline_tail = true;
          }
        }
        node->layout = inline_tail ? kLayoutFlatInline : kLayoutFlatPlain;
        node->data_blocks = inline_tail ? full : full + (tail != 0);
        end = pos + head + (inline_tail ? tail : 0);
        break;
      }
      default:
        node->layout = kLayoutFlatPlain;
        end = pos + head;
        break;
    }
    node->pos = pos;
    pos = end;
  }
  const uint64_t root_nid = root_->pos >> kInodeSlotBits;
  if (root_nid > UINT16_MAX) return fail(EFAULT, StrCat("layout error: root nid ", root_nid));
  uint64_t next_block = AlignUp(pos, bsize) / bsize;
  for (Node* node : order) {
    if (node->data_blocks == 0) continue;
    node->start_block = static_cast<uint32_t>(next_block);
    next_block += node->data_blocks;
    if (next_block >= kNullAddr) return fail(EFBIG, "the metadata image would pass 2^32 blocks");
  }
  const uint64_t meta_blocks = next_block;
  uint32_t ino = 0;
  for (Node* node : order) node->ino = ++ino;

  // 4. The blob: chunks still used, in blob order; the others zeroed.
  uint64_t file_bytes = 0;
  for (Node* node : order) {
    if (node->type != FileType::kRegular) continue;
    file_bytes += node->size;
    for (const auto& [chunk, id] : node->chunks) chunks_[id].live = true;
  }
  ImageSummary summary;
  uint64_t blob_size = 0;
  std::vector<const StoredChunk*> live;
  for (const StoredChunk& c : chunks_) {
    const uint64_t padded = AlignUp(c.length, bsize);
    if (c.live) {
      live.push_back(&c);
      blob_size = c.offset + padded;
      continue;
    }
    if (::fallocate(blob_fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(c.offset),
                    static_cast<off_t>(padded)) != 0) {
      std::string zeros(padded, '\0');
      Status s = PwriteFull(blob_fd_.get(), zeros, c.offset);
      if (!s.ok())
        return fail(s.code(), StrCat("zero an unused chunk of the blob ", options_.blob_path, ": ", s.message()));
    }
  }
  if (::ftruncate(blob_fd_.get(), static_cast<off_t>(blob_size)) != 0) {
    const int err = errno;
    return fail(err, StrCat("truncate the blob ", options_.blob_path, ": ", std::strerror(err)));
  }
  auto grouped = GroupSmallChunks(live);
  if (!grouped.ok()) return fail(grouped.status().code(), grouped.status().message());
  summary.extents = std::move(*grouped);

  // 5. Write the metadata image in offset order.
  auto meta_fd = OpenFile(meta_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (!meta_fd.ok()) return meta_fd.status().Annotate("erofs writer: create the metadata image");
  MetaOut out(meta_fd->get(), options_.block_size);
  auto io = [&](Status s) { return s.ok() ? s : fail(s.code(), StrCat("write: ", s.message())); };

  SuperBlock sb{};
  sb.magic = ToLe(kSuperMagic);
  sb.feature_compat = ToLe(kCompatSbChecksum);
  sb.blkszbits = static_cast<uint8_t>(blkbits_);
  sb.root_nid_2b = ToLe(static_cast<uint16_t>(root_nid));
  sb.inos = ToLe(static_cast<uint64_t>(order.size()));
  sb.blocks_lo = ToLe(static_cast<uint32_t>(meta_blocks));
  sb.feature_incompat = ToLe(kIncompatChunkedFile | kIncompatDeviceTable);
  sb.extra_devices = ToLe(uint16_t{1});
  sb.devt_slotoff = ToLe(static_cast<uint16_t>(kDevTableOffset / sizeof(DeviceSlot)));
  DeviceSlot slot{};
  slot.blocks_lo = ToLe(static_cast<uint32_t>(blob_size / bsize));
  STRATA_RETURN_IF_ERROR(io(out.ZeroTo(kSuperOffset)));
  STRATA_RETURN_IF_ERROR(io(out.Append(&sb, kSuperBlockBaseSize)));
  STRATA_RETURN_IF_ERROR(io(out.AppendStruct(slot)));

  // Directory block `b` of `dir`: its dirents, then their names; a full
  // block (`pad`) is padded with zeros, which also ends its last name.
  auto write_dir_block = [&](const std::vector<Entry>& entries, const Node& dir, size_t b, bool pad) -> Status {
    const size_t first = dir.dir_blocks[b];
    const size_t last = b + 1 < dir.dir_blocks.size() ? dir.dir_blocks[b + 1] : entries.size();
    const uint64_t start = out.pos();
    uint64_t nameoff = sizeof(Dirent) * (last - first);
    for (size_t i = first; i < last; ++i) {
      Dirent d{};
      d.nid = ToLe(entries[i].node->pos >> kInodeSlotBits);
      d.nameoff = ToLe(static_cast<uint16_t>(nameoff));
      d.file_type = DirentType(entries[i].node->type);
      STRATA_RETURN_IF_ERROR(out.AppendStruct(d));
      nameoff += entries[i].name.size();
    }
    for (size_t i = first; i < last; ++i) STRATA_RETURN_IF_ERROR(out.Append(entries[i].name));
    if (pad) STRATA_RETURN_IF_ERROR(out.ZeroTo(start + bsize));
    return OkStatus();
  };

  const uint16_t chunk_format = static_cast<uint16_t>(
      kChunkFormatIndexes | (std::countr_zero(options_.chunk_size) - static_cast<int>(blkbits_)));
  for (Node* node : order) {
    STRATA_RETURN_IF_ERROR(io(out.ZeroTo(node->pos)));
    InodeExtended di{};
    di.i_format = ToLe(static_cast<uint16_t>(kIFormatExtended | (node->layout << kIFormatLayoutShift)));
    di.i_xattr_icount = ToLe(static_cast<uint16_t>(
        node->xattr_size == 0 ? 0 : (node->xattr_size - sizeof(XattrIbodyHeader)) / 4 + 1));
    di.i_mode = ToLe(static_cast<uint16_t>(TypeBits(node->type) | node->perm));
    uint32_t iu = 0;
    uint64_t size = 0;
    switch (node->type) {
      case FileType::kRegular:
        size = node->size;
        iu = node->size == 0 ? kNullAddr : chunk_format;
        break;
      case FileType::kDirectory:
      case FileType::kSymlink:
        size = node->data_size;
        iu = node->start_block;
        break;
      case FileType::kCharDevice:
      case FileType::kBlockDevice: iu = node->rdev; break;
      case FileType::kFifo:
      case FileType::kSocket: break;
    }
    di.i_size = ToLe(size);
    di.i_u = ToLe(iu);
    di.i_ino = ToLe(node->ino);
    di.i_uid = ToLe(node->uid);
    di.i_gid = ToLe(node->gid);
    di.i_mtime = ToLe(static_cast<uint64_t>(node->mtime));
    di.i_mtime_nsec = ToLe(node->mtime_nsec);
    di.i_nlink = ToLe(node->nlink);
    STRATA_RETURN_IF_ERROR(io(out.AppendStruct(di)));

    if (!node->xattrs.empty()) {
      XattrIbodyHeader header{};
      STRATA_RETURN_IF_ERROR(io(out.AppendStruct(header)));
      for (const auto& [name, value] : node->xattrs) {
        auto key = XattrKey(name);
        XattrEntry e{};
        e.e_name_len = static_cast<uint8_t>(key->second.size());
        e.e_name_index = key->first;
        e.e_value_size = ToLe(static_cast<uint16_t>(value.size()));
        const uint64_t start = out.pos();
        STRATA_RETURN_IF_ERROR(io(out.AppendStruct(e)));
        STRATA_RETURN_IF_ERROR(io(out.Append(key->second)));
        STRATA_RETURN_IF_ERROR(io(out.Append(value)));
        STRATA_RETURN_IF_ERROR(io(out.ZeroTo(start + XattrEntrySize(name, value))));
      }
    }

    if (node->layout == kLayoutChunkBased) {
      STRATA_RETURN_IF_ERROR(io(out.ZeroTo(AlignUp(out.pos(), sizeof(ChunkIndex)))));
      const uint64_t nchunks = (node->size + options_.chunk_size - 1) / options_.chunk_size;
      ChunkIndex hole{};
      hole.startblk_lo = ToLe(kNullAddr);
      auto next = node->chunks.begin();
      for (uint64_t c = 0; c < nchunks; ++c) {
        if (next != node->chunks.end() && next->first == c) {
          ChunkIndex index{};
          index.device_id = ToLe(uint16_t{1});
          index.startblk_lo = ToLe(static_cast<uint32_t>(chunks_[next->second].offset >> blkbits_));
          STRATA_RETURN_IF_ERROR(io(out.AppendStruct(index)));
          ++next;
        } else {
          STRATA_RETURN_IF_ERROR(io(out.AppendStruct(hole)));
        }
      }
    } else if (node->layout == kLayoutFlatInline) {
      const uint64_t tail_start = node->data_size / bsize * bsize;
      if (node->type == FileType::kSymlink) {
        STRATA_RETURN_IF_ERROR(io(out.Append(std::string_view(node->target).substr(tail_start))));
      } else {
        STRATA_RETURN_IF_ERROR(
            io(write_dir_block(sorted_entries(*node), *node, node->dir_blocks.size() - 1, /*pad=*/false)));
      }
    }
  }

  for (Node* node : order) {
    if (node->data_blocks == 0) continue;
    STRATA_RETURN_IF_ERROR(io(out.ZeroTo(uint64_t{node->start_block} * bsize)));
    if (node->type == FileType::kSymlink) {
      STRATA_RETURN_IF_ERROR(io(out.Append(std::string_view(node->target).substr(0, node->data_blocks * bsize))));
    } else {
      const auto entries = sorted_entries(*node);
      for (size_t b = 0; b < node->data_blocks; ++b) {
        STRATA_RETURN_IF_ERROR(io(write_dir_block(entries, *node, b, /*pad=*/true)));
      }
    }
  }
  STRATA_RETURN_IF_ERROR(io(out.ZeroTo(meta_blocks * bsize)));
  STRATA_RETURN_IF_ERROR(io(out.Flush()));

  // 6. UUID from the content, then the superblock checksum.
  for (const BlobExtent& e : summary.extents) {
    uint8_t bytes[16];
    e.hash.ToBytes(bytes);
    out.hasher().Update(std::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
  }
  uint8_t uuid[16];
  out.hasher().Finish().ToBytes(uuid);
  uuid[6] = static_cast<uint8_t>((uuid[6] & 0x0f) | 0x80);  // RFC 9562 version 8: custom
  uuid[8] = static_cast<uint8_t>((uuid[8] & 0x3f) | 0x80);  // variant 10
  std::string& block0 = out.first_block();
  std::memcpy(block0.data() + kSuperOffset + offsetof(SuperBlock, uuid), uuid, sizeof uuid);
  const uint32_t crc = Crc32c(0xFFFFFFFFu, std::string_view(block0).substr(kSuperOffset));
  const uint32_t crc_le = ToLe(crc);
  std::memcpy(block0.data() + kSuperOffset + offsetof(SuperBlock, checksum), &crc_le, sizeof crc_le);
  STRATA_RETURN_IF_ERROR(io(PwriteFull(meta_fd->get(), block0, 0)));

  // 7. The hash of the image as it now is.
  Hasher final_hash;
  std::string buf(1 << 20, '\0');
  for (uint64_t off = 0; off < meta_blocks * bsize;) {
    auto n = PreadFull(meta_fd->get(), buf, off);
    if (!n.ok()) return fail(n.status().code(), StrCat("read back: ", n.status().message()));
    if (*n == 0) return fail(EIO, "read back: the image is short");
    final_hash.Update(std::string_view(buf.data(), *n));
    off += *n;
  }

  summary.inodes = order.size();
  summary.file_bytes = file_bytes;
  summary.meta_size = meta_blocks * bsize;
  summary.meta_hash = final_hash.Finish();
  summary.blob_size = blob_size;
  return summary;
}

}  // namespace strata::erofs
