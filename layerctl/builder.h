// The layer builder: a directory or tar archive in, the three files of a
// layer out (metadata image, data blob, manifest).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache/manifest.h"
#include "common/erofs/writer.h"
#include "common/status.h"

namespace strata::layerctl {

// File names inside a layer directory (`build -o DIR`, `pull -o DIR`).
inline constexpr const char* kMetaFile = "meta.img";
inline constexpr const char* kBlobFile = "blob.img";
inline constexpr const char* kManifestFile = "manifest.json";

// Extents of small files' chunks grouped, at most (BuildOptions::group_size).
inline constexpr uint32_t kDefaultGroupSize = 128 << 10;

struct BuildOptions {
  std::string source;      // directory, tar archive, or "-" (tar on stdin)
  std::string output_dir;  // created if missing; the three files are replaced
  cache::LayerKind kind = cache::LayerKind::kBase;
  std::string name;
  std::vector<Digest128> parents;  // diffs: the stack below, bottom first
  uint32_t chunk_size = 1 << 20;
  // Small files' chunks side by side are grouped into extents of at most
  // this many bytes (and the chunk size); 0: one extent per chunk, else at
  // least 8 KiB (erofs::ImageWriter::Options).
  uint32_t group_size = kDefaultGroupSize;
};

struct BuiltLayer {
  cache::Manifest manifest;
  Digest128 digest;
  std::string dir;
  uint64_t source_bytes = 0;  // bytes read from the input archive (0 for a directory)
};

// Builds the layer with the EROFS image writer (common/erofs/writer.h):
// a directory through a sorted walk (layerctl/dir_reader.h), an archive
// streamed entry by entry (layerctl/tar_reader.h). Deterministic: the same
// tree (names, types, modes, owners, mtimes, xattrs, contents) gives the
// same metadata image, blob and digest, on any machine. Writes nothing into
// output_dir's final names unless every step succeeded, and leaves no
// temporary files behind on failure. output_dir must not lie inside a
// source directory.
Result<BuiltLayer> BuildLayer(const BuildOptions& options);

// Adds a layer's entries to the writer (packdiff's way in: it translates an
// overlayfs upper directory entry by entry).
using FillImage = std::function<Status(erofs::ImageWriter& writer)>;

// What an input was, once read: manifest.build.source (an archive's hash)
// and BuiltLayer::source_bytes.
struct SourceFacts {
  std::string hash;
  uint64_t bytes = 0;
};

// BuildLayer with the entries `fill` adds instead of a directory or an
// archive; options.source only names the input in messages, and
// `source_facts` (asked once `fill` succeeded; none: "" and 0) describes it.
// Same guarantees: nothing under the final names unless every step
// succeeded, no temporary files left on failure.
// Whether the options make sense (chunk size, parents only for diffs).
Status CheckBuildOptions(const BuildOptions& options);

Result<BuiltLayer> BuildLayerFrom(const BuildOptions& options, const FillImage& fill,
                                  const std::function<SourceFacts()>& source_facts = {});

// Reads DIR/manifest.json and checks that DIR's image files match it.
Result<BuiltLayer> OpenLayerDir(const std::string& dir);

}  // namespace strata::layerctl
