// packdiff: the writable state a sandbox left (an overlayfs upper directory)
// in, a published diff layer out, so any number of new sandboxes can start
// from that state; and squash: a chain of diffs in, one equivalent diff out.
//
// A diff layer is an ordinary layer (kind "diff") that records its parents
// as digests, bottom first, and holds overlayfs's own markers: whiteouts
// (character devices 0/0) and opaque directories (trusted.overlay.opaque=y).
// Stacked over its parents it shows what the sandbox showed. The format and
// the translation rules are in docs/formats.md, "Diff layers".
//
// Both calls read the parents straight from the store (metadata images,
// and data only where an upper entry is not self-contained), build the
// layer in a directory of their own, and publish it with layerctl's Push:
// chunks, then the metadata image, the manifest, and the tag last, so a
// call that fails or is killed part-way publishes nothing a reader can
// find. File data is cut into chunks of the parents' chunk size, so data
// the parents already hold gets the same chunk names and is not uploaded
// again. Neither call needs root unless the upper's files need it to be read,
// nor any mount.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/catalog.h"
#include "layerctl/publish.h"
#include "packdiff/change_tree.h"
#include "packdiff/id_shift.h"
#include "packdiff/upper_reader.h"

namespace strata::packdiff {

struct PackOptions {
  std::string upper;                 // the overlayfs upper directory
  // The layers the upper was made on, bottom first (REFs: NAME:VERSION or
  // digests), resolved as `launcher --layer` resolves them: a diff named
  // first brings its recorded parents. At least one.
  std::vector<std::string> parents;
  std::optional<cache::LayerRef> tag;  // published under this NAME:VERSION
  bool publish = true;               // false: build only (see output_dir)
  std::string name;                  // the manifest's name; default: the tag's name
  std::vector<std::string> excludes; // globs of upper paths left out (see Excluded())
  std::optional<IdShift> id_shift;   // map a sandbox's host ids back to the container's
  bool keep_devices = false;         // pack device nodes instead of refusing them
  // Where to leave meta.img, blob.img and manifest.json; empty: a temporary
  // directory, removed before returning.
  std::string output_dir;
  size_t parallel = 16;              // concurrent chunk uploads
  // Called once the upper is listed, before any file data is read. For
  // tests (and progress output); may be empty.
  std::function<void()> after_listing;
};

struct PackReport {
  Digest128 digest;
  std::vector<Digest128> parents;  // as recorded, bottom first
  cache::Manifest manifest;
  UpperStats upper;                // PackUpper only
  WriteStats written;
  uint64_t layer_bytes = 0;        // metadata image + blob
  // When published: bytes and chunks uploaded, and those the store already
  // had (chunks of unchanged data shared with the parents).
  std::optional<layerctl::PushReport> push;
};

// Packs the upper directory as a diff over `parents` and (unless
// !publish) publishes it. The upper must not change meanwhile: every file
// is checked against its listing as it is read, and every entry once more
// at the end (EAGAIN naming the path otherwise). Errors name the step and
// the upper path; nothing is published on error.
//
// `launcher snapshot` packs a read-only btrfs snapshot of the sandbox's
// upper subvolume (so the sandbox is frozen only while the snapshot is
// taken), with the sandbox's stack as digests and the node's id mapping:
//
//   auto report = PackUpper({.upper = snapshot + "/upper",
//                            .parents = {base.Hex(), workspace.Hex()},  // bottom first
//                            .tag = cache::LayerRef{"env-42", "1"},
//                            .id_shift = IdShift{100000, 65536}},
//                           catalog);
//   // report->digest: the new layer, tagged env-42:1
Result<PackReport> PackUpper(const PackOptions& options, const cache::Catalog& catalog);

struct SquashOptions {
  std::vector<std::string> diffs;  // REFs, bottom first: each one's parents are the previous one's plus it
  std::optional<cache::LayerRef> tag;
  bool publish = true;
  std::string name;                // default: the tag's name
  std::string output_dir;          // as PackOptions::output_dir
  size_t parallel = 16;
};

// Merges a chain of diffs into one diff whose parents are the bottom diff's
// parents and which, stacked on them, shows what the chain showed. Reads the
// diffs through the store (no mounts); uploads only the new metadata image
// (every data chunk is already there).
Result<PackReport> Squash(const SquashOptions& options, const cache::Catalog& catalog);

// Removes the build directories ($TMPDIR/strata-packdiff.<pid>-*) of
// packdiff runs that were killed; PackUpper and Squash call it first.
void SweepStaleBuildDirs();

}  // namespace strata::packdiff
