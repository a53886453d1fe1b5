// Rich test trees and whole-tree comparison: every attribute a layer must
// keep, so tests can say "identical to the source" and mean it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/erofs/reader.h"
#include "common/hash.h"
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

// A busybox root filesystem: /bin/busybox and a link per applet, the usual
// top directories (/tmp 1777), and /etc/passwd with root.
Status MakeBusyboxRoot(const std::string& root);

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
  // Directories' link counts. overlayfs reports 1 for a directory merged
  // from several layers and the real count for one from a single layer, so
  // views of the same tree in differently split layers disagree here.
  bool directory_nlink = true;
  // Drop xattrs with these prefixes (e.g. overlayfs's own "trusted.overlay.").
  std::vector<std::string> ignore_xattr_prefixes;
};

Result<TreeSnapshot> SnapshotTree(const std::string& root, const SnapshotOptions& options = {});

// The same snapshot of an EROFS image, read with strata's reader (hardlink
// groups by nid, content through the reader with holes skipped), so tests
// can hold a kernel mount against it.
Result<TreeSnapshot> SnapshotImage(const erofs::Image& image, const SnapshotOptions& options = {});

// NodeInfo::content_hash of a file's bytes, fed in order: runs of zeros
// (holes or written zeros) count only by their length, so sparse and dense
// copies of one content compare equal.
class ContentHasher {
 public:
  void Update(std::string_view bytes);
  void Zeros(uint64_t n) { zeros_ += n; }
  std::string Finish();

 private:
  void FlushZeros();
  Hasher hasher_;
  uint64_t zeros_ = 0;
};
// The content hash of `bytes`.
std::string ContentHash(std::string_view bytes);

// Human-readable differences, at most `max` lines; empty when identical.
std::vector<std::string> DiffTrees(const TreeSnapshot& want, const TreeSnapshot& got, size_t max = 20);

}  // namespace strata::testing
