// Streams a tar archive straight into an erofs::ImageWriter: no staging directory,
// nothing written but the image, no root needed.
#pragma once

#include <cstdint>
#include <string>

#include "common/hash.h"
#include "common/status.h"
#include "common/erofs/writer.h"

namespace strata::layerctl {

struct TarStats {
  uint64_t entries = 0;
  uint64_t regular_files = 0;
  uint64_t bytes = 0;  // regular file contents
  Digest128 source;    // XXH3-128 of the archive bytes as read (compressed)
  uint64_t source_bytes = 0;
};

// Reads the tar archive `input` (a path, or "-" for stdin; plain, gzip,
// zstd, xz or bzip2, read with libarchive) and adds every entry to `writer`
// with its owner, mode, mtime, xattrs, hardlinks, device numbers and sparse
// map (holes stay holes). Later entries replace earlier ones of the same
// path, as when tar extracts.
//
// Safety, as if extracting onto a disk: names with "..", absolute names,
// hardlinks to outside the root or to entries the archive has not given,
// and entries whose path passes through a symlink (or any non-directory)
// of the archive are refused. Symlinks themselves are stored as they are.
//
// OCI whiteouts become overlayfs ones: ".wh.NAME" a character device 0/0
// named NAME (mode 0, the entry's owner and mtime), ".wh..wh..opq" the xattr
// trusted.overlay.opaque=y on its directory (set after the last entry, so
// a later entry for the directory itself does not drop it).
//
// Errors name the archive, the entry and the step.
Result<TarStats> AddTar(const std::string& input, erofs::ImageWriter& writer);

}  // namespace strata::layerctl
