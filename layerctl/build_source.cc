// BuildLayer: a layer from a directory or a tar archive. On its own so that
// programs building only from their own entries (BuildLayerFrom: packdiff,
// the launcher) do not link the tar reader and, with it, libarchive.
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/strings.h"
#include "layerctl/builder.h"
#include "layerctl/dir_reader.h"
#include "layerctl/tar_reader.h"

namespace strata::layerctl {

namespace {

// True when `inner` is `outer` or lies below it (compared by inode, so a
// symlink cannot hide it).
bool Contains(const std::string& outer, const std::string& inner) {
  struct stat o, st;
  if (::stat(outer.c_str(), &o) != 0) return false;
  std::string path = inner;
  for (int depth = 0; depth < 4096; ++depth) {
    if (::stat(path.c_str(), &st) != 0) return false;
    if (st.st_dev == o.st_dev && st.st_ino == o.st_ino) return true;
    struct stat up;
    const std::string parent = path + "/..";
    if (::stat(parent.c_str(), &up) != 0 || (up.st_dev == st.st_dev && up.st_ino == st.st_ino)) return false;
    path = parent;
  }
  return false;
}

}  // namespace

Result<BuiltLayer> BuildLayer(const BuildOptions& options) {
  auto where = [&](std::string_view step) { return StrCat("build layer from ", options.source, ": ", step); };
  STRATA_RETURN_IF_ERROR(CheckBuildOptions(options));
  struct stat src_st;
  const bool is_dir = options.source != "-" && ::stat(options.source.c_str(), &src_st) == 0 && S_ISDIR(src_st.st_mode);
  if (!is_dir && options.source != "-" && ::access(options.source.c_str(), R_OK) != 0) {
    return ErrnoError(errno, where("open source"));
  }
  STRATA_RETURN_IF_ERROR(MakeDirs(options.output_dir));
  if (is_dir && Contains(options.source, options.output_dir)) {
    return Error(EINVAL, where(StrCat("the output directory ", options.output_dir, " lies inside the source")));
  }
  TarStats tar;
  auto fill = [&](erofs::ImageWriter& writer) -> Status {
    if (is_dir) return AddDirectoryTree(options.source, writer).Annotate(where("read the tree"));
    auto read = AddTar(options.source, writer);
    if (!read.ok()) return read.status().Annotate(where("read the archive"));
    tar = *read;
    return OkStatus();
  };
  return BuildLayerFrom(options, fill, [&] { return is_dir ? SourceFacts{} : SourceFacts{tar.source.Hex(), tar.source_bytes}; });
}

}  // namespace strata::layerctl
