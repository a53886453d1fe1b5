// Rich test trees and whole-tree comparison: every attribute a layer must
// keep, so tests can say "identical to the source" and mean it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::testing {

struct RichTreeOptions {
  bool large_sparse_file = true;  // a sparse file above 4 GiB
  bool wide_directory = true;     // 1,200 entries in one directory
  uint64_t seed = 1;
};

// Creates under `root` (which must exist) regular files of awkward sizes
// (empty, 1 byte, around block and chunk boundaries, multi-chunk, sparse,
// identical copies), hardlinks, symlinks (relative, absolute, dangling, long),
// character and block devices, a FIFO, a socket, setuid/setgid/sticky modes,
// varied owners, nanosecond mtimes, user./trusted./security.capability
// xattrs (some shared by many files), an opaque directory marker, names
// with odd bytes and of 255 bytes, and deep and wide directories. Needs root.
Status MakeRichTree(const std::string& root, const RichTreeOptions& options = {});

struct NodeInfo {
  mode_t mode = 0;  // type and permissions
  uid_t uid = 0;
  gid_t gid = 0;
  uint64_t size = 0;  // regular files and symlinks
  int64_t mtime_ns = 0;
  dev_t rdev = 0;
  std::string link;                            // symlink target
  std::string content_hash;                    // regular files
  std::map<std::string, std::string> xattrs;   // name -> value
  std::string hardlink_group;                  // first path (in sort order) of the inode; "" when nlink == 1
  uint32_t nlink = 0;
};

// Path (relative, "." for the root) -> attributes.
using TreeSnapshot = std::map<std::string, NodeInfo>;

struct SnapshotOptions {
  bool directory_mtimes = true;
  bool root_attributes = true;  // compare the root directory itself
  bool nlink = true;
  // Drop xattrs with these prefixes (e.g. overlayfs's own "trusted.overlay.").
  std::vector<std::string> ignore_xattr_prefixes;
};

Result<TreeSnapshot> SnapshotTree(const std::string& root, const SnapshotOptions& options = {});

// Human-readable differences, at most `max` lines; empty when identical.
std::vector<std::string> DiffTrees(const TreeSnapshot& want, const TreeSnapshot& got, size_t max = 20);

}  // namespace strata::testing
