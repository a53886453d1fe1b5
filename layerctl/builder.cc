// Layer builds: a directory walk or a tar stream into the EROFS image
// writer, then the manifest.
#include "layerctl/builder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "common/erofs/writer.h"

namespace strata::layerctl {
namespace {

// Removes the temporary image files unless the build got to move them.
class TempFiles {
 public:
  explicit TempFiles(std::vector<std::string> paths) : paths_(std::move(paths)) {}
  ~TempFiles() {
    for (const auto& p : paths_) ::unlink(p.c_str());
  }
  void Release() { paths_.clear(); }

 private:
  std::vector<std::string> paths_;
};

// The image from `fill`, then the manifest, then everything into place.
Result<BuiltLayer> Build(const BuildOptions& options, const FillImage& fill,
                         const std::function<SourceFacts()>& source_facts) {
  const std::string& out = options.output_dir;
  auto where = [&](std::string_view step) { return StrCat("build layer from ", options.source, ": ", step); };
  STRATA_RETURN_IF_ERROR(MakeDirs(out));

  // 1. The image, under temporary names.
  const std::string meta_tmp = JoinPath(out, ".meta.tmp"), blob_tmp = JoinPath(out, ".blob.tmp");
  TempFiles temps({meta_tmp, blob_tmp});
  auto writer = erofs::ImageWriter::Create({.block_size = 4096, .chunk_size = options.chunk_size, .group_size = options.group_size,
                                      .blob_path = blob_tmp});
  if (!writer.ok()) return writer.status().Annotate(where("start the image"));
  STRATA_RETURN_IF_ERROR(fill(**writer));
  auto image = (*writer)->Finish(meta_tmp);
  if (!image.ok()) return image.status().Annotate(where("write the image"));

  // 2. The manifest.
  BuiltLayer layer;
  cache::Manifest& m = layer.manifest;
  m.kind = options.kind;
  m.name = options.name;
  m.parents = options.parents;
  m.chunk_size = options.chunk_size;
  m.block_size = 4096;
  m.meta_hash = image->meta_hash;
  m.meta_size = image->meta_size;
  m.blob_size = image->blob_size;
  m.extents.reserve(image->extents.size());
  for (const erofs::BlobExtent& e : image->extents) m.extents.push_back({.offset = e.offset, .length = e.length, .hash = e.hash});
  m.files = image->inodes;
  m.bytes = image->file_bytes;
  const SourceFacts facts = source_facts();
  m.source = facts.hash;
  STRATA_RETURN_IF_ERROR(m.Validate().Annotate(where("manifest")));
  std::string manifest_json = m.ToJson();
  layer.digest = HashBytes(manifest_json);
  layer.dir = out;
  layer.source_bytes = facts.bytes;

  // 3. Into place; the manifest last so a reader of DIR never sees a
  //    manifest that does not describe the images beside it.
  if (::rename(meta_tmp.c_str(), JoinPath(out, kMetaFile).c_str()) != 0 ||
      ::rename(blob_tmp.c_str(), JoinPath(out, kBlobFile).c_str()) != 0) {
    return ErrnoError(errno, where("move images into " + out));
  }
  temps.Release();
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(out, kManifestFile), manifest_json + "\n"));
  return layer;
}


}  // namespace

Status CheckBuildOptions(const BuildOptions& options) {
  if (options.chunk_size < 4096 || (options.chunk_size & (options.chunk_size - 1))) {
    return Error(EINVAL, StrCat("chunk size ", options.chunk_size, ": must be a power of two of at least 4096"));
  }
  if (options.group_size != 0 && options.group_size < 8192) {
    // A member is under half the group and takes a 4 KiB block at least.
    return Error(EINVAL, StrCat("group size ", options.group_size, ": must be 0 (no groups) or at least 8K"));
  }
  if (options.kind != cache::LayerKind::kDiff && !options.parents.empty()) {
    return Error(EINVAL, "only diff layers have parents");
  }
  return OkStatus();
}

Result<BuiltLayer> BuildLayerFrom(const BuildOptions& options, const FillImage& fill,
                                  const std::function<SourceFacts()>& source_facts) {
  STRATA_RETURN_IF_ERROR(CheckBuildOptions(options));
  return Build(options, fill, source_facts ? source_facts : [] { return SourceFacts{}; });
}

Result<BuiltLayer> OpenLayerDir(const std::string& dir) {
  auto text = ReadFileToString(JoinPath(dir, kManifestFile));
  if (!text.ok()) return text.status().Annotate("open layer directory " + dir);
  while (!text->empty() && text->back() == '\n') text->pop_back();
  auto manifest = cache::Manifest::FromJson(*text);
  if (!manifest.ok()) return manifest.status().Annotate(JoinPath(dir, kManifestFile));
  struct stat meta_st, blob_st;
  if (::stat(JoinPath(dir, kMetaFile).c_str(), &meta_st) != 0 || ::stat(JoinPath(dir, kBlobFile).c_str(), &blob_st) != 0) {
    return ErrnoError(errno, "open layer directory " + dir + ": meta.img and blob.img");
  }
  if (static_cast<uint64_t>(meta_st.st_size) != manifest->meta_size ||
      static_cast<uint64_t>(blob_st.st_size) != manifest->blob_size) {
    return Error(EINVAL, "layer directory " + dir + ": image sizes do not match manifest.json");
  }
  BuiltLayer layer;
  layer.digest = HashBytes(*text);
  layer.manifest = std::move(*manifest);
  layer.dir = dir;
  return layer;
}

}  // namespace strata::layerctl
