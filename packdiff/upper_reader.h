// UpperReader: an overlayfs upper directory read into a ChangeTree, in layer
// terms. What it translates (docs/formats.md, "Diff layers", has the table):
// - whiteouts (character device 0/0, hardlinked or not, and the 6.7+ form,
//   an empty regular file with trusted.overlay.whiteout) become whiteout
//   entries;
// - trusted.overlay.opaque=y keeps the directory opaque; "x" (the 6.7+
//   marker for "holds xwhiteouts", not opaque) is dropped with the
//   xwhiteouts it announces;
// - overlayfs's bookkeeping (origin, impure, nlink, upper, uuid, protattr,
//   ...) is left out; a user's own escaped trusted.overlay.overlay.* stays;
// - metacopy entries (metadata only in the upper) get their data from the
//   parents, at the path overlayfs would take it from; a redirected
//   directory (renamed with redirect_dir=on) becomes an opaque directory
//   holding the parents' entries it showed plus the upper's;
// - with an IdShift, owners, v3 capabilities and ACL ids are mapped back.
// Refused, with the path in the message: device nodes other than whiteouts
// (unless kept), redirects that leave the root, metacopy entries whose data
// the parents do not have, ids outside the shift's range. Sockets are not
// packed: the path reads as absent.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "packdiff/change_tree.h"
#include "packdiff/id_shift.h"
#include "packdiff/lower_stack.h"

namespace strata::packdiff {

struct UpperOptions {
  std::string upper;                  // the upper directory
  std::vector<std::string> excludes;  // globs, see Excluded()
  std::optional<IdShift> id_shift;
  bool keep_devices = false;          // pack device nodes instead of refusing them
};

struct UpperStats {
  uint64_t entries = 0;             // listed in the upper (the root excluded)
  uint64_t excluded = 0;            // left out by --exclude (subtrees count once)
  uint64_t sockets = 0;             // not packed
  uint64_t metacopy_resolved = 0;   // data taken from the parents
  uint64_t redirects_resolved = 0;  // directories materialized from the parents
  uint64_t flags_dropped = 0;       // trusted.overlay.protattr (immutable/append-only): EROFS cannot hold them
};

// Whether `rel` (a path below the upper root) matches one of `globs`: a
// glob with a '/' is matched against the whole path (a leading '/' is
// ignored, '*' also matches '/'), one without against the last component.
// An excluded directory takes its subtree with it.
bool Excluded(const std::vector<std::string>& globs, std::string_view rel);

class UpperReader {
 public:
  // Opens the upper directory. `parents` (the stack the upper was made on)
  // must outlive the reader.
  static Result<std::unique_ptr<UpperReader>> Open(const UpperOptions& options, const LowerStack& parents);

  // Lists the whole upper (names, attributes, xattrs; no file data) into a
  // tree. Regular files keep their listing, which WriteChangeTree checks.
  Result<std::shared_ptr<ChangeNode>> Read();

  // Opens a file listed by Read for reading: beneath the root, never
  // through a symlink.
  Result<UniqueFd> OpenFile(const std::string& rel) const;

  // Lists every entry Read saw again and fails with EAGAIN, naming the
  // first path that changed (added, removed, written, chmod-ed, ...) since.
  Status CheckUnchanged() const;

  const UpperStats& stats() const { return stats_; }

 private:
  struct Listed {
    std::string name;
    struct stat st;
  };
  struct ListedDir {
    std::string rel;
    struct stat st;
    std::vector<Listed> entries;
  };
  struct Pending;

  UpperReader(const UpperOptions& options, const LowerStack& parents) : options_(options), parents_(parents) {}
  Result<UniqueFd> OpenDir(const std::string& rel) const;
  Status ReadDir(Pending& dir, std::vector<Pending>* subdirs);
  Status AddLower(ChangeNode& dir, const MergedEntry& lower, const std::string& rel);
  Result<std::shared_ptr<ChangeNode>> LowerNode(const LayerInode& inode, const std::string& rel);
  Status Translate(const std::string& rel, const struct stat& st, int dir_fd, const std::string& name,
                   const Pending& parent, std::shared_ptr<ChangeNode>* out, std::optional<std::string>* child_lower);
  Result<erofs::Attributes> Attributes(const std::string& rel, const struct stat& st,
                                          std::vector<erofs::Xattr> xattrs) const;

  UpperOptions options_;
  const LowerStack& parents_;
  UniqueFd root_fd_;
  UpperStats stats_;
  std::vector<ListedDir> listed_;
  std::map<std::pair<dev_t, ino_t>, std::shared_ptr<ChangeNode>> links_;  // upper inodes with several names
  std::map<std::pair<size_t, uint64_t>, std::shared_ptr<ChangeNode>> lower_links_;  // (layer, nid)
};

}  // namespace strata::packdiff
