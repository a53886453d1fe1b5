// Published layers read straight from the store (no mount), and the merged
// view overlayfs gives of a stack of them: what packdiff asks of a diff's
// parents (is this path there? which file holds the data of a metacopy
// entry?) and what squash reads diffs with.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/catalog.h"
#include "common/erofs/reader.h"

namespace strata::packdiff {

// overlayfs's xattrs (its "trusted." namespace, as a host mount uses).
inline constexpr std::string_view kOverlayXattrPrefix = "trusted.overlay.";
// A user's own trusted.overlay.X, escaped by overlayfs (kernel 6.7+).
inline constexpr std::string_view kEscapedOverlayXattrPrefix = "trusted.overlay.overlay.";
inline constexpr const char* kOpaqueXattr = "trusted.overlay.opaque";
inline constexpr const char* kWhiteoutXattr = "trusted.overlay.whiteout";
inline constexpr const char* kRedirectXattr = "trusted.overlay.redirect";
inline constexpr const char* kMetacopyXattr = "trusted.overlay.metacopy";

// One published layer, opened for reading through strata's EROFS reader.
// The metadata image is fetched whole when opened (checked against its
// name); blob bytes are fetched chunk by chunk when first read, checked, and
// the most recent chunks are kept in memory. Thread-safe after Open.
class PublishedLayer {
 public:
  static Result<std::shared_ptr<const PublishedLayer>> Open(const cache::Catalog& catalog, const Digest128& digest);

  const Digest128& digest() const { return digest_; }
  const cache::Manifest& manifest() const { return manifest_; }
  const erofs::Image& image() const { return *image_; }

 private:
  PublishedLayer() = default;
  Digest128 digest_;
  cache::Manifest manifest_;
  std::unique_ptr<erofs::Image> image_;
};

// How overlayfs reads a layer's entries (errors: the image is damaged).
Result<bool> IsWhiteout(const erofs::Image& image, const erofs::Inode& inode);
Result<bool> IsOpaqueDir(const erofs::Image& image, const erofs::Inode& inode);

// An inode of one layer of a stack.
struct LayerInode {
  size_t layer = 0;  // index into LowerStack::layers() (bottom first)
  erofs::Inode inode;
};

// What a path is in the merged view: a non-directory (one inode, the
// topmost), or a directory merged from the listed ones (topmost first; the
// list stops at an opaque directory or at a layer whose entry is not a
// directory).
struct MergedEntry {
  bool is_dir = false;
  std::vector<LayerInode> from;
  const LayerInode& top() const { return from.front(); }
};

// The overlayfs view of layers stacked bottom first, read-only, as the
// kernel shows it with redirect_dir and metacopy off: a whiteout (character
// device 0/0, or an empty regular file with trusted.overlay.whiteout) hides
// the name below it, trusted.overlay.opaque=y on a directory hides the
// directories below it, a non-directory hides everything below it. Parent
// layers made by strata carry no redirects or metacopy entries; such xattrs
// in a parent are not followed. Thread-safe.
class LowerStack {
 public:
  // Opens the layers (bottom first) from the catalog. An empty list is an
  // empty stack: nothing exists in it.
  static Result<LowerStack> Open(const cache::Catalog& catalog, const std::vector<Digest128>& bottom_first);
  static LowerStack FromLayers(std::vector<std::shared_ptr<const PublishedLayer>> bottom_first);

  const std::vector<std::shared_ptr<const PublishedLayer>>& layers() const { return layers_; }
  const erofs::Image& image(size_t layer) const { return layers_[layer]->image(); }

  // The root directory, merged from every layer; nullopt for an empty stack.
  Result<std::optional<MergedEntry>> Root() const;
  // `name` in merged directory `dir`; nullopt when the view has nothing there.
  Result<std::optional<MergedEntry>> LookupChild(const MergedEntry& dir, std::string_view name) const;
  // A relative path ("" is the root) from the root, never following
  // symlinks; nullopt when it is not in the view (or passes a non-directory).
  Result<std::optional<MergedEntry>> Lookup(std::string_view path) const;
  // Every entry of a merged directory, sorted by name, whiteouts applied.
  Result<std::vector<std::pair<std::string, MergedEntry>>> ReadDir(const MergedEntry& dir) const;

 private:
  std::vector<std::shared_ptr<const PublishedLayer>> layers_;  // bottom first
};

}  // namespace strata::packdiff
