// Checks an image the writer made the three ways a layer is read: strata's
// EROFS reader, fsck.erofs, and (as root) the kernel.
#pragma once

#include <memory>
#include <string>

#include "common/erofs/reader.h"
#include "common/status.h"
#include "tests/testing/tree.h"

namespace strata::testing {

struct CheckedImage {
  std::unique_ptr<erofs::Image> image;  // open on the two files
  TreeSnapshot tree;                    // as the reader sees it
  bool kernel_checked = false;          // false when not root
};

// Opens `meta` with `blob` as device 1 through strata's reader (which checks
// the superblock checksum) and snapshots the tree; runs `fsck.erofs
// --device=<blob> <meta>`; as root, mounts the image with the kernel's
// EROFS driver (file-backed, device=<blob>) at a directory under `scratch`
// and requires the mounted tree to equal the reader's. The mount is gone
// when this returns, whatever happened. An error says which check failed.
Result<CheckedImage> CheckImage(const std::string& meta, const std::string& blob, const std::string& scratch);

}  // namespace strata::testing
