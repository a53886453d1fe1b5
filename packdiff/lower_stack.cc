// Published layers through the EROFS reader, and overlayfs's merged view.
#include "packdiff/lower_stack.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include "cache/chunk_codec.h"
#include "common/strings.h"

namespace strata::packdiff {
namespace {

// A layer's blob as the reader's extra device: each extent fetched from the
// store when first read and checked against its name; the gaps between
// extents read as zeros. Keeps the last kKeep chunks, enough for sequential
// reads of a few files at once.
class StoreBlobSource : public erofs::BlockSource {
 public:
  StoreBlobSource(std::shared_ptr<cache::ObjectStore> store, Digest128 layer, const cache::Manifest& manifest)
      : store_(std::move(store)), layer_(layer), extents_(manifest.extents), size_(manifest.blob_size) {}

  uint64_t size() const override { return size_; }

  Result<size_t> ReadAt(uint64_t offset, std::span<char> out) const override {
    if (offset >= size_) return size_t{0};
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), size_ - offset));
    size_t done = 0;
    while (done < n) {
      const uint64_t pos = offset + done;
      auto next = std::upper_bound(extents_.begin(), extents_.end(), pos,
                                   [](uint64_t p, const cache::Extent& e) { return p < e.offset; });
      if (next == extents_.begin() || pos >= std::prev(next)->offset + std::prev(next)->length) {
        const uint64_t gap_end = next == extents_.end() ? size_ : next->offset;
        const size_t zeros = static_cast<size_t>(std::min<uint64_t>(n - done, gap_end - pos));
        std::memset(out.data() + done, 0, zeros);
        done += zeros;
        continue;
      }
      const cache::Extent& e = *std::prev(next);
      STRATA_ASSIGN_OR_RETURN(auto chunk, Chunk(e));
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n - done, e.offset + e.length - pos));
      std::memcpy(out.data() + done, chunk->data() + (pos - e.offset), take);
      done += take;
    }
    return n;
  }

 private:
  static constexpr size_t kKeep = 32;

  Result<std::shared_ptr<const std::string>> Chunk(const cache::Extent& e) const {
    {
      std::lock_guard lock(mu_);
      auto it = chunks_.find(e.hash);
      if (it != chunks_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.second);
        return it->second.first;
      }
    }
    auto data = cache::GetChunk(*store_, e.hash, e.length);
    if (!data.ok()) return data.status().Annotate(StrCat("read layer ", layer_.Hex()));
    auto chunk = std::make_shared<const std::string>(std::move(data->bytes));
    std::lock_guard lock(mu_);
    if (chunks_.count(e.hash)) return chunk;  // another reader fetched it meanwhile
    lru_.push_front(e.hash);
    chunks_.emplace(e.hash, std::make_pair(chunk, lru_.begin()));
    while (chunks_.size() > kKeep) {
      chunks_.erase(lru_.back());
      lru_.pop_back();
    }
    return chunk;
  }

  const std::shared_ptr<cache::ObjectStore> store_;
  const Digest128 layer_;
  const std::vector<cache::Extent> extents_;
  const uint64_t size_;
  mutable std::mutex mu_;
  mutable std::list<Digest128> lru_;  // most recent first
  mutable std::unordered_map<Digest128, std::pair<std::shared_ptr<const std::string>, std::list<Digest128>::iterator>,
                             Digest128Hash>
      chunks_;
};

Result<bool> HasXattr(const erofs::Image& image, const erofs::Inode& inode, std::string_view name,
                      std::string* value = nullptr) {
  auto v = image.GetXattr(inode, name);
  if (!v.ok()) {
    if (v.status().code() == ENODATA) return false;
    return v.status();
  }
  if (value) *value = std::move(*v);
  return true;
}

}  // namespace

Result<std::shared_ptr<const PublishedLayer>> PublishedLayer::Open(const cache::Catalog& catalog,
                                                                    const Digest128& digest) {
  auto where = [&](std::string_view step) { return StrCat("open layer ", digest.Hex(), ": ", step); };
  std::shared_ptr<PublishedLayer> layer(new PublishedLayer());
  layer->digest_ = digest;
  STRATA_ASSIGN_OR_RETURN(layer->manifest_, catalog.GetManifest(digest));
  const cache::Manifest& m = layer->manifest_;
  auto meta = cache::GetChunk(catalog.store(), m.meta_hash, m.meta_size);
  if (!meta.ok()) return meta.status().Annotate(where("fetch the metadata image"));
  std::vector<std::shared_ptr<erofs::BlockSource>> devices = {
      std::make_shared<StoreBlobSource>(catalog.shared_store(), digest, m)};
  auto image = erofs::Image::Open(erofs::MemorySource(std::move(meta->bytes)), std::move(devices));
  if (!image.ok()) return image.status().Annotate(where("read the image"));
  layer->image_ = std::move(*image);
  return std::shared_ptr<const PublishedLayer>(std::move(layer));
}

Result<bool> IsWhiteout(const erofs::Image& image, const erofs::Inode& inode) {
  if (inode.type == erofs::FileType::kCharDevice) return inode.rdev == 0;
  // The kernel's other whiteout (6.7+): an empty regular file with the xattr.
  if (inode.type == erofs::FileType::kRegular && inode.size == 0) return HasXattr(image, inode, kWhiteoutXattr);
  return false;
}

Result<bool> IsOpaqueDir(const erofs::Image& image, const erofs::Inode& inode) {
  if (inode.type != erofs::FileType::kDirectory) return false;
  std::string value;
  STRATA_ASSIGN_OR_RETURN(bool has, HasXattr(image, inode, kOpaqueXattr, &value));
  return has && value == "y";
}

Result<LowerStack> LowerStack::Open(const cache::Catalog& catalog, const std::vector<Digest128>& bottom_first) {
  LowerStack stack;
  for (const Digest128& d : bottom_first) {
    STRATA_ASSIGN_OR_RETURN(auto layer, PublishedLayer::Open(catalog, d));
    stack.layers_.push_back(std::move(layer));
  }
  return stack;
}

LowerStack LowerStack::FromLayers(std::vector<std::shared_ptr<const PublishedLayer>> bottom_first) {
  LowerStack stack;
  stack.layers_ = std::move(bottom_first);
  return stack;
}

Result<std::optional<MergedEntry>> LowerStack::Root() const {
  if (layers_.empty()) return std::optional<MergedEntry>();
  MergedEntry root;
  root.is_dir = true;
  for (size_t i = layers_.size(); i-- > 0;) {
    STRATA_ASSIGN_OR_RETURN(erofs::Inode inode, image(i).Root());
    root.from.push_back({i, inode});
    STRATA_ASSIGN_OR_RETURN(bool opaque, IsOpaqueDir(image(i), inode));
    if (opaque) break;
  }
  return std::optional<MergedEntry>(std::move(root));
}

Result<std::optional<MergedEntry>> LowerStack::LookupChild(const MergedEntry& dir, std::string_view name) const {
  std::optional<MergedEntry> found;
  if (!dir.is_dir) return found;
  for (const LayerInode& d : dir.from) {
    const erofs::Image& img = image(d.layer);
    auto entry = img.Lookup(d.inode, name);
    if (!entry.ok()) {
      if (entry.status().code() == ENOENT) continue;
      return entry.status().Annotate(StrCat("layer ", layers_[d.layer]->digest().Hex(), ": look up ", Quote(name)));
    }
    STRATA_ASSIGN_OR_RETURN(erofs::Inode inode, img.GetInode(entry->nid));
    STRATA_ASSIGN_OR_RETURN(bool whiteout, IsWhiteout(img, inode));
    if (whiteout) break;  // hides this name in every layer below
    if (inode.type != erofs::FileType::kDirectory) {
      // A non-directory is opaque: it wins when nothing above it was found,
      // and ends a directory merge otherwise.
      if (!found) found = MergedEntry{false, {{d.layer, inode}}};
      break;
    }
    if (!found) found = MergedEntry{true, {}};
    found->from.push_back({d.layer, inode});
    STRATA_ASSIGN_OR_RETURN(bool opaque, IsOpaqueDir(img, inode));
    if (opaque) break;
  }
  return found;
}

Result<std::optional<MergedEntry>> LowerStack::Lookup(std::string_view path) const {
  STRATA_ASSIGN_OR_RETURN(std::optional<MergedEntry> at, Root());
  if (path.empty() || !at) return at;
  for (const std::string& part : Split(path, '/')) {
    if (part.empty()) continue;
    STRATA_ASSIGN_OR_RETURN(at, LookupChild(*at, part));
    if (!at) break;
  }
  return at;
}

Result<std::vector<std::pair<std::string, MergedEntry>>> LowerStack::ReadDir(const MergedEntry& dir) const {
  struct Slot {
    std::optional<MergedEntry> entry;
    bool done = false;  // a whiteout, a non-directory or an opaque directory ended the merge
  };
  std::map<std::string, Slot> slots;
  for (const LayerInode& d : dir.from) {
    const erofs::Image& img = image(d.layer);
    auto entries = img.ReadDir(d.inode);
    if (!entries.ok()) {
      return entries.status().Annotate(StrCat("layer ", layers_[d.layer]->digest().Hex(), ": read a directory"));
    }
    for (const erofs::DirEntry& e : *entries) {
      Slot& slot = slots[e.name];
      if (slot.done) continue;
      STRATA_ASSIGN_OR_RETURN(erofs::Inode inode, img.GetInode(e.nid));
      STRATA_ASSIGN_OR_RETURN(bool whiteout, IsWhiteout(img, inode));
      if (whiteout) {
        slot.done = true;
        continue;
      }
      if (inode.type != erofs::FileType::kDirectory) {
        if (!slot.entry) slot.entry = MergedEntry{false, {{d.layer, inode}}};
        slot.done = true;
        continue;
      }
      if (!slot.entry) slot.entry = MergedEntry{true, {}};
      slot.entry->from.push_back({d.layer, inode});
      STRATA_ASSIGN_OR_RETURN(bool opaque, IsOpaqueDir(img, inode));
      if (opaque) slot.done = true;
    }
  }
  std::vector<std::pair<std::string, MergedEntry>> out;
  for (auto& [name, slot] : slots) {
    if (slot.entry) out.emplace_back(name, std::move(*slot.entry));
  }
  return out;
}

}  // namespace strata::packdiff
