// layerctl inspect --files: a layer's tree from its metadata image.
#include "layerctl/inspect.h"

#include "cache/chunk_codec.h"
#include "common/strings.h"

namespace strata::layerctl {

char FileTypeLetter(erofs::FileType type) {
  switch (type) {
    case erofs::FileType::kRegular: return '-';
    case erofs::FileType::kDirectory: return 'd';
    case erofs::FileType::kSymlink: return 'l';
    case erofs::FileType::kCharDevice: return 'c';
    case erofs::FileType::kBlockDevice: return 'b';
    case erofs::FileType::kFifo: return 'p';
    case erofs::FileType::kSocket: return 's';
  }
  return '?';
}

Status ListLayerFiles(const cache::Catalog& catalog, const Digest128& digest,
                      const std::function<Status(const FileEntry&)>& visit) {
  const std::string what = StrCat("list files of layer ", digest.Hex());
  auto manifest = catalog.GetManifest(digest);
  if (!manifest.ok()) return manifest.status().Annotate(what);
  auto meta = cache::GetChunk(catalog.store(), manifest->meta_hash, manifest->meta_size);
  if (!meta.ok()) return meta.status().Annotate(StrCat(what, ": metadata image"));
  // Metadata only: MapFile works, data reads are never made.
  auto image = erofs::Image::Open(erofs::MemorySource(std::move(meta->bytes)));
  if (!image.ok()) return image.status().Annotate(what);
  Status s = (*image)->Walk([&](const std::string& path, const erofs::Inode& inode) -> Status {
    FileEntry entry;
    entry.path = path;
    entry.inode = inode;
    if (inode.type == erofs::FileType::kSymlink) {
      STRATA_ASSIGN_OR_RETURN(entry.link_target, (*image)->ReadLink(inode));
    } else if (inode.type == erofs::FileType::kRegular) {
      STRATA_ASSIGN_OR_RETURN(auto extents, (*image)->MapFile(inode));
      for (const auto& e : extents) {
        FileExtent fe{e.file_offset, e.length, e.hole, !e.hole && e.device == 0, 0, std::nullopt};
        if (!e.hole && e.device != 0) {
          fe.blob_offset = e.physical;
          if (const cache::Extent* m = manifest->FindExtent(e.physical)) {
            fe.chunk = m->hash;
            fe.chunk_offset = e.physical - m->offset;
          }
        }
        entry.extents.push_back(fe);
      }
    }
    return visit(entry);
  });
  return s.ok() ? s : s.Annotate(what);
}

}  // namespace strata::layerctl
