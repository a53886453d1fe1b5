// Layer builds: unpack (for archives), mkfs.erofs, cut the blob into
// content-named extents, pin down what mkfs leaves variable.
#include "layerctl/builder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <optional>
#include <unordered_set>

#include "common/erofs_reader.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "layerctl/tar_unpack.h"

namespace strata::layerctl {
namespace {

// Superblock fields mkfs.erofs 1.5 fills from the clock or at random.
constexpr uint64_t kSuperblockOffset = 1024;
constexpr uint64_t kBuildTimeOffset = kSuperblockOffset + 24;  // le64 seconds, le32 nanoseconds
constexpr uint64_t kUuidOffset = kSuperblockOffset + 48;       // 16 bytes

struct ExtentScan {
  std::map<uint64_t, uint64_t> extents;  // blob offset -> data length
  uint64_t files = 0;
  uint64_t bytes = 0;
};

// Walks every inode once and records each regular file's chunks on the blob.
Result<ExtentScan> ScanExtents(const erofs::Image& image) {
  ExtentScan scan;
  std::unordered_set<uint64_t> seen;
  std::vector<uint64_t> pending = {image.info().root_nid};
  seen.insert(image.info().root_nid);
  while (!pending.empty()) {
    uint64_t nid = pending.back();
    pending.pop_back();
    STRATA_ASSIGN_OR_RETURN(erofs::Inode inode, image.GetInode(nid));
    ++scan.files;
    if (inode.type == erofs::FileType::kDirectory) {
      STRATA_ASSIGN_OR_RETURN(auto entries, image.ReadDir(inode));
      for (const auto& e : entries) {
        if (seen.insert(e.nid).second) pending.push_back(e.nid);
      }
    } else if (inode.type == erofs::FileType::kRegular) {
      scan.bytes += inode.size;
      STRATA_ASSIGN_OR_RETURN(auto map, image.MapFile(inode));
      for (const auto& x : map) {
        if (x.hole) continue;
        if (x.device != 1) {
          return Error(EINVAL, StrCat("inode ", nid, ": data outside the blob (device ", x.device,
                                      "); the image was not built with --blobdev"));
        }
        auto [it, inserted] = scan.extents.emplace(x.physical, x.length);
        if (!inserted && it->second != x.length) {
          return Error(EINVAL, StrCat("blob offset ", x.physical, " is used with lengths ", it->second, " and ", x.length));
        }
      }
    }
  }
  return scan;
}

bool AllZero(std::string_view bytes) {
  for (char c : bytes) {
    if (c) return false;
  }
  return true;
}

// Cuts the blob into extents, hashing each and checking that the padding
// between them is zero (lazyfs serves padding as zeros without storing it).
Result<std::vector<cache::Extent>> HashExtents(int blob_fd, uint64_t blob_size, const ExtentScan& scan) {
  std::vector<cache::Extent> out;
  out.reserve(scan.extents.size());
  std::string buf;
  uint64_t end = 0;
  for (const auto& [offset, length] : scan.extents) {
    if (offset < end || offset + length > blob_size) {
      return Error(EINVAL, StrCat("blob extent at ", offset, " overlaps the previous one or passes the blob end"));
    }
    if (offset > end) {
      buf.resize(offset - end);
      STRATA_ASSIGN_OR_RETURN(size_t n, PreadFull(blob_fd, buf, end));
      if (n != buf.size() || !AllZero(buf)) return Error(EINVAL, StrCat("blob bytes ", end, "..", offset, " are not zero padding"));
    }
    buf.resize(length);
    STRATA_ASSIGN_OR_RETURN(size_t n, PreadFull(blob_fd, buf, offset));
    if (n != length) return Error(EIO, StrCat("blob is short at offset ", offset));
    out.push_back({offset, length, HashBytes(buf)});
    end = offset + length;
  }
  if (blob_size > end) {
    buf.resize(blob_size - end);
    STRATA_ASSIGN_OR_RETURN(size_t n, PreadFull(blob_fd, buf, end));
    if (n != buf.size() || !AllZero(buf)) return Error(EINVAL, "blob tail is not zero padding");
  }
  return out;
}

Result<uint64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "stat " + path);
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace

Result<BuiltLayer> BuildLayer(const BuildOptions& options) {
  const std::string& out = options.output_dir;
  auto where = [&](std::string_view step) { return StrCat("build layer from ", options.source, ": ", step); };
  if (options.chunk_size < 4096 || (options.chunk_size & (options.chunk_size - 1))) {
    return Error(EINVAL, StrCat("chunk size ", options.chunk_size, ": must be a power of two of at least 4096"));
  }
  if (options.kind != cache::LayerKind::kDiff && !options.parents.empty()) {
    return Error(EINVAL, "only diff layers have parents");
  }
  STRATA_RETURN_IF_ERROR(MakeDirs(out));

  // 1. The tree: the directory as given, or the archive unpacked safely.
  std::string tree = options.source;
  std::optional<TempDir> staging;
  UnpackStats unpack;
  struct stat src_st;
  bool is_dir = options.source != "-" && ::stat(options.source.c_str(), &src_st) == 0 && S_ISDIR(src_st.st_mode);
  if (!is_dir) {
    if (options.source != "-" && ::access(options.source.c_str(), R_OK) != 0) {
      return ErrnoError(errno, where("open source"));
    }
    std::string base = options.staging_dir.empty() ? out : options.staging_dir;
    STRATA_RETURN_IF_ERROR(MakeDirs(base));
    std::string tmpl = JoinPath(base, ".staging-XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoError(errno, where("create staging directory"));
    auto dir = TempDir::Adopt(tmpl);
    staging.emplace(std::move(dir));
    STRATA_ASSIGN_OR_RETURN(unpack, UnpackTar(options.source, staging->path()));
    tree = staging->path();
  }

  // 2. mkfs.erofs into temporary names. Every inode is extended so each
  //    keeps its own mtime, and the superblock checksum is off because the
  //    image is named by its hash anyway and we patch two fields below.
  const std::string meta_tmp = JoinPath(out, ".meta.tmp"), blob_tmp = JoinPath(out, ".blob.tmp");
  {
    STRATA_ASSIGN_OR_RETURN(UniqueFd blob, OpenFile(blob_tmp, O_WRONLY | O_CREAT | O_TRUNC));
  }
  ::unlink(meta_tmp.c_str());
  auto mkfs = RunChecked({.argv = {"mkfs.erofs", "--quiet", StrCat("--chunksize=", options.chunk_size),
                                   "--blobdev=" + blob_tmp, "--preserve-mtime", "-Eforce-inode-extended,nosbcrc",
                                   "-U", "00000000-0000-0000-0000-000000000000", meta_tmp, tree}},
                         where("mkfs.erofs"));
  if (!mkfs.ok()) return mkfs.status();
  staging.reset();  // the image holds everything now

  // 3. The blob's extents, read through our own EROFS reader.
  STRATA_ASSIGN_OR_RETURN(UniqueFd blob_fd, OpenFile(blob_tmp, O_RDONLY));
  STRATA_ASSIGN_OR_RETURN(uint64_t blob_size, FileSize(blob_fd.get(), blob_tmp));
  STRATA_ASSIGN_OR_RETURN(auto meta_source, erofs::FileSource(meta_tmp));
  STRATA_ASSIGN_OR_RETURN(auto blob_source, erofs::FileSource(blob_tmp));
  auto image = erofs::Image::Open(meta_source, {blob_source});
  if (!image.ok()) return image.status().Annotate(where("read the new image"));
  auto scan = ScanExtents(**image);
  if (!scan.ok()) return scan.status().Annotate(where("map the blob"));
  const uint32_t block_size = (*image)->info().block_size;
  auto extents = HashExtents(blob_fd.get(), blob_size, *scan);
  if (!extents.ok()) return extents.status().Annotate(where("hash the blob"));

  // 4. Pin the superblock: build time zero, UUID derived from the content.
  STRATA_ASSIGN_OR_RETURN(std::string meta, ReadFileToString(meta_tmp));
  if (meta.size() < kUuidOffset + 16) return Error(EINVAL, where("metadata image is too small"));
  std::memset(meta.data() + kBuildTimeOffset, 0, 12);
  std::memset(meta.data() + kUuidOffset, 0, 16);
  Hasher uuid_hasher;
  uuid_hasher.Update(meta);
  for (const auto& e : *extents) {
    uint8_t b[16];
    e.hash.ToBytes(b);
    uuid_hasher.Update(std::string_view(reinterpret_cast<char*>(b), 16));
  }
  uint8_t uuid[16];
  uuid_hasher.Finish().ToBytes(uuid);
  uuid[6] = static_cast<uint8_t>((uuid[6] & 0x0f) | 0x80);  // RFC 9562 version 8: custom
  uuid[8] = static_cast<uint8_t>((uuid[8] & 0x3f) | 0x80);
  std::memcpy(meta.data() + kUuidOffset, uuid, 16);
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(meta_tmp, meta, /*durable=*/false));

  // 5. The manifest.
  BuiltLayer layer;
  cache::Manifest& m = layer.manifest;
  m.kind = options.kind;
  m.name = options.name;
  m.parents = options.parents;
  m.chunk_size = options.chunk_size;
  m.block_size = block_size;
  m.meta_hash = HashBytes(meta);
  m.meta_size = meta.size();
  m.blob_size = blob_size;
  m.extents = std::move(*extents);
  m.files = scan->files;
  m.bytes = scan->bytes;
  m.source = is_dir ? "" : unpack.source.Hex();
  STRATA_RETURN_IF_ERROR(m.Validate().Annotate(where("manifest")));
  std::string manifest_json = m.ToJson();
  layer.digest = HashBytes(manifest_json);
  layer.dir = out;
  layer.source_bytes = unpack.source_bytes;

  // 6. Into place; the manifest last so a reader of DIR never sees a
  //    manifest that does not describe the images beside it.
  if (::rename(meta_tmp.c_str(), JoinPath(out, kMetaFile).c_str()) != 0 ||
      ::rename(blob_tmp.c_str(), JoinPath(out, kBlobFile).c_str()) != 0) {
    return ErrnoError(errno, where("move images into " + out));
  }
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(out, kManifestFile), manifest_json + "\n"));
  return layer;
}

Result<BuiltLayer> OpenLayerDir(const std::string& dir) {
  auto text = ReadFileToString(JoinPath(dir, kManifestFile));
  if (!text.ok()) return text.status().Annotate("open layer directory " + dir);
  while (!text->empty() && text->back() == '\n') text->pop_back();
  auto manifest = cache::Manifest::FromJson(*text);
  if (!manifest.ok()) return manifest.status().Annotate(JoinPath(dir, kManifestFile));
  struct stat meta_st, blob_st;
  if (::stat(JoinPath(dir, kMetaFile).c_str(), &meta_st) != 0 || ::stat(JoinPath(dir, kBlobFile).c_str(), &blob_st) != 0) {
    return ErrnoError(errno, "open layer directory " + dir + ": meta.img and blob.img");
  }
  if (static_cast<uint64_t>(meta_st.st_size) != manifest->meta_size ||
      static_cast<uint64_t>(blob_st.st_size) != manifest->blob_size) {
    return Error(EINVAL, "layer directory " + dir + ": image sizes do not match manifest.json");
  }
  BuiltLayer layer;
  layer.digest = HashBytes(*text);
  layer.manifest = std::move(*manifest);
  layer.dir = dir;
  return layer;
}

}  // namespace strata::layerctl
