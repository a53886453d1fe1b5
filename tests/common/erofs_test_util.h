// Helpers for the EROFS reader tests: a rich source tree, images built from
// it with mkfs.erofs, a comparison of everything the reader returns with a
// directory tree (the source, or the kernel's mount of the same image), and
// byte-level patching of images.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/erofs/reader.h"
#include "common/status.h"

namespace strata::erofs::testing {

// True when mkfs.erofs can be run.
bool HaveMkfs();

// What BuildRichTree managed to create (some parts need root).
struct TreeFeatures {
  bool devices = false;      // mknod
  bool owners = false;       // chown to other ids
  bool trusted_xattrs = false;
  bool capabilities = false;  // security.capability
};

// Fills `root` with every file type, odd names, hardlinks, sparse and
// multi-chunk files, many xattrs (some shared by many inodes), special mode
// bits, various owners and nanosecond mtimes, deep and wide directories.
// Parts that need privileges are skipped when they fail.
Result<TreeFeatures> BuildRichTree(const std::string& root);

// A small tree for patching tests: /dir/inner, /file (20000 bytes), /link,
// /packed (a long xattr prefix table as file data), /x0../x3 with a shared
// xattr, and an inline one on /x0.
Status BuildSmallTree(const std::string& root);

struct BuiltImage {
  std::string meta;  // metadata image path
  std::string blob;  // blob path, empty without --blobdev
};

// Runs mkfs.erofs `args` `meta` `src`; with `blobdev` it creates the blob
// file first and passes --blobdev.
Result<BuiltImage> MakeImage(const std::string& src, const std::string& out_dir, const std::string& name,
                             const std::vector<std::string>& args, bool blobdev);

// Opens an image with its blob (when any) from files.
Result<std::unique_ptr<Image>> OpenImage(const BuiltImage& built);

struct CompareOptions {
  // Every mtime is this (mkfs -T).
  std::optional<int64_t> fixed_mtime;
  // Every owner is this (mkfs --force-uid/--force-gid).
  std::optional<uint32_t> forced_uid, forced_gid;
  // Chunk size when the regular files are chunk-based (extents at most this).
  uint64_t chunk_size = 0;
  // Paths to the image's devices, [0] the metadata image, to check that
  // MapFile's physical extents hold the file's bytes.
  std::vector<std::string> device_paths;
  // Compare directory nlink (the kernel computes it from the image, a
  // source tree from its own rules).
  bool check_dir_nlink = true;
};

// Compares everything `image` returns with the directory tree at `root`:
// paths, types, modes, owners, nlink, sizes, mtimes, rdev, symlink
// targets, xattrs, file contents (sequential and random reads), extents,
// directory order and Lookup, hardlink groups. Reports through gtest.
void CompareImageWithTree(const Image& image, const std::string& root, const CompareOptions& options);

// Whole-file helpers for patching.
std::string ReadAll(const std::string& path);
void WriteAll(const std::string& path, const std::string& data);

void PutLe16(std::string& image, uint64_t offset, uint16_t v);
void PutLe32(std::string& image, uint64_t offset, uint32_t v);
void PutLe64(std::string& image, uint64_t offset, uint64_t v);
uint16_t GetLe16(const std::string& image, uint64_t offset);
uint32_t GetLe32(const std::string& image, uint64_t offset);

// Recomputes the superblock checksum after a patch (when the image has one).
void FixChecksum(std::string& image);

// Images whose features mkfs.erofs 1.5 cannot produce, made by patching
// one it built from BuildSmallTree (written to `dir`):
// - long xattr name prefixes: /x0's inline "user.p1" becomes
//   "trusted.overlay.p1" (prefix 0: trusted. + "overlay.") and the shared
//   "user.shared" becomes "user.long.prefix.shared" (prefix 1);
// - holes: with 4 KiB chunks, chunk 1 of /file becomes a hole.
Result<BuiltImage> MakeLongPrefixImage(const std::string& src, const std::string& dir);
// The same prefixes, with the table held in the data of a packed inode (the
// FRAGMENTS feature bit and packed_nid, as mkfs.erofs 1.7 and 1.8 write
// long prefixes): BuildSmallTree's /packed file.
Result<BuiltImage> MakePackedPrefixImage(const std::string& src, const std::string& dir);
Result<BuiltImage> MakeChunkHoleImage(const std::string& src, const std::string& dir, bool blobdev);

// Byte offset of a directory's data when it is stored inline or in flat
// blocks (what mkfs.erofs 1.5 writes for directories).
uint64_t DirDataOffset(const Image& image, const Inode& dir);

}  // namespace strata::erofs::testing
