// Squashing a chain of diffs.
#include "packdiff/squash.h"

#include <map>

#include "common/strings.h"

namespace strata::packdiff {
namespace {

class DiffApplier {
 public:
  explicit DiffApplier(std::shared_ptr<const PublishedLayer> layer) : layer_(std::move(layer)) {}

  // Applies the layer's directory `dir` onto `into` (the same path).
  Status ApplyDir(const erofs::Inode& dir, ChangeNode& into, const std::string& path) {
    const erofs::Image& img = layer_->image();
    STRATA_ASSIGN_OR_RETURN(into.attrs, LayerAttributes(img, dir));
    auto entries = img.ReadDir(dir);
    if (!entries.ok()) return entries.status().Annotate(StrCat("read directory ", Quote(path)));
    for (const erofs::DirEntry& e : *entries) {
      const std::string child_path = path.empty() ? e.name : path + "/" + e.name;
      STRATA_ASSIGN_OR_RETURN(erofs::Inode inode, img.GetInode(e.nid));
      STRATA_ASSIGN_OR_RETURN(bool whiteout, IsWhiteout(img, inode));
      auto existing = into.children.find(e.name);
      if (whiteout) {
        auto node = std::make_shared<ChangeNode>();
        node->kind = EntryKind::kWhiteout;
        into.children[e.name] = std::move(node);
        continue;
      }
      if (inode.type != erofs::FileType::kDirectory) {
        if (auto it = links_.find(inode.nid); it != links_.end()) {
          into.children[e.name] = it->second;
          continue;
        }
        auto node = LayerNode(layer_, inode);
        if (!node.ok()) return node.status().Annotate(StrCat("entry ", Quote(child_path)));
        if (inode.nlink > 1) links_[inode.nid] = *node;
        into.children[e.name] = std::move(*node);
        continue;
      }
      STRATA_ASSIGN_OR_RETURN(bool opaque, IsOpaqueDir(img, inode));
      const bool merge = !opaque && existing != into.children.end() && existing->second->kind == EntryKind::kDirectory;
      if (merge) {
        STRATA_RETURN_IF_ERROR(ApplyDir(inode, *existing->second, child_path));
        continue;
      }
      // Nothing earlier shows through: over an earlier file or whiteout the
      // directory must hide what the parents have here, as the chain did.
      auto node = NewDirectory({});
      node->opaque = opaque || existing != into.children.end();
      STRATA_RETURN_IF_ERROR(ApplyDir(inode, *node, child_path));
      into.children[e.name] = std::move(node);
    }
    return OkStatus();
  }

 private:
  std::shared_ptr<const PublishedLayer> layer_;
  std::map<uint64_t, std::shared_ptr<ChangeNode>> links_;  // nid -> node, for inodes with several names
};

}  // namespace

Result<std::shared_ptr<ChangeNode>> SquashDiffs(const std::vector<std::shared_ptr<const PublishedLayer>>& diffs) {
  auto root = NewDirectory({});
  for (const auto& diff : diffs) {
    const erofs::Image& img = diff->image();
    STRATA_ASSIGN_OR_RETURN(erofs::Inode top, img.Root());
    STRATA_ASSIGN_OR_RETURN(bool opaque, IsOpaqueDir(img, top));
    if (opaque) {
      root = NewDirectory({});
      root->opaque = true;
    }
    DiffApplier applier(diff);
    STRATA_RETURN_IF_ERROR(applier.ApplyDir(top, *root, "").Annotate(StrCat("squash diff ", diff->digest().Hex())));
  }
  return root;
}

}  // namespace strata::packdiff
