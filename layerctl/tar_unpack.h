// Safe tar extraction into a staging directory for the layer builder.
#pragma once

#include <cstdint>
#include <string>

#include "common/hash.h"
#include "common/status.h"

namespace strata::layerctl {

struct UnpackStats {
  uint64_t entries = 0;
  uint64_t regular_files = 0;
  uint64_t bytes = 0;         // regular file contents
  Digest128 source;           // XXH3-128 of the archive bytes as read (compressed)
  uint64_t source_bytes = 0;
};

// Unpacks the tar archive `input` (a path, or "-" for stdin; plain, gzip,
// zstd, xz or bzip2, read with libarchive) into `root`, an existing empty
// directory, keeping owners, modes, mtimes, xattrs, hardlinks, devices,
// FIFOs and sparse files.
//
// Safety: extraction never follows a symlink (every parent is opened with
// openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)), and entries that would
// land outside `root` — names with "..", absolute names, hardlinks to
// outside — are refused. Symlinks themselves are stored as they are.
//
// OCI whiteouts become overlayfs ones: ".wh.NAME" a character device 0/0
// named NAME, ".wh..wh..opq" the xattr trusted.overlay.opaque=y on its
// directory.
//
// Errors name the archive, the entry and the step. Owners and trusted.*
// xattrs need root (CAP_CHOWN, CAP_SYS_ADMIN).
Result<UnpackStats> UnpackTar(const std::string& input, const std::string& root);

}  // namespace strata::layerctl
