// Listing a published layer's tree without mounting it: the metadata image
// is fetched from the store and read with strata's EROFS reader
// (common/erofs/reader.h), the reader lazyfs's fuse mode serves from.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/catalog.h"
#include "common/erofs/reader.h"

namespace strata::layerctl {

// One piece of a regular file, as the layer stores it.
struct FileExtent {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  bool hole = false;             // no bytes stored: reads as zeros
  bool in_metadata = false;      // an inline tail inside the metadata image
  uint64_t blob_offset = 0;      // where the bytes are in the blob (not holes or inline tails)
  std::optional<Digest128> chunk;  // the manifest extent holding them (none for a zero-filled gap)
  uint64_t chunk_offset = 0;       // where in that extent: past 0 when it groups small files' chunks
};

struct FileEntry {
  std::string path;           // "/" for the root, then "/dir/name"
  erofs::Inode inode;         // type, mode, owners, size, nlink, mtime, rdev, nid
  std::string link_target;    // symlinks
  std::vector<FileExtent> extents;  // regular files
};

// Visits every inode reachable from the layer's root, a directory before
// its entries (a hardlinked file once per name), in on-disk order. Fetches
// only the metadata image (checked against its name); no blob byte is read.
// A visitor error stops the walk and is returned.
Status ListLayerFiles(const cache::Catalog& catalog, const Digest128& digest,
                      const std::function<Status(const FileEntry&)>& visit);

// "d", "-", "l", "c", "b", "p", "s", as ls shows them.
char FileTypeLetter(erofs::FileType type);

}  // namespace strata::layerctl
