// Feeds a directory tree on disk into an erofs::ImageWriter.
#pragma once

#include <string>

#include "common/status.h"
#include "common/erofs/writer.h"

namespace strata::layerctl {

// Adds the tree under `root` (the root's own attributes included) to
// `writer`: each directory's entries in byte order, then its
// subdirectories, depth first, so the same tree always gives the same
// calls. Never follows a symlink below `root` (every directory is opened
// with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), every file with
// O_NOFOLLOW); does cross mount points. Files are read through their
// descriptors, holes skipped; files with several links inside the tree
// become hardlinks to the first name met. Keeps owners, modes, mtimes,
// xattrs and device numbers.
//
// A file or directory that cannot be opened or read is an error naming it
// (nothing is silently left out).
Status AddDirectoryTree(const std::string& root, erofs::ImageWriter& writer);

// Every xattr of one entry: through `fd` when it is valid, else through the
// path `access` without following a final symlink; `path` names the entry
// in errors. Retries when a size changes under it; a filesystem without
// xattrs gives none.
Result<std::vector<erofs::Xattr>> ReadXattrs(int fd, const std::string& access, const std::string& path);

}  // namespace strata::layerctl
