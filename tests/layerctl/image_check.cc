// Reader, fsck.erofs and kernel checks of written images.
#include "tests/layerctl/image_check.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/erofs/format.h"
#include "common/fs.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/subprocess.h"

namespace strata::testing {

Result<CheckedImage> CheckImage(const std::string& meta, const std::string& blob, const std::string& scratch) {
  CheckedImage out;
  STRATA_ASSIGN_OR_RETURN(auto meta_source, erofs::FileSource(meta));
  STRATA_ASSIGN_OR_RETURN(auto blob_source, erofs::FileSource(blob));
  auto image = erofs::Image::Open(meta_source, {blob_source});
  if (!image.ok()) return image.status().Annotate("our reader opens the image");
  out.image = std::move(*image);
  const erofs::ImageInfo& info = out.image->info();
  if (!info.checksum_verified) return Error(EINVAL, "the superblock carries no checksum");
  if (info.device_blocks.size() != 2 || info.device_blocks[1] * info.block_size != blob_source->size()) {
    return Error(EINVAL, StrCat("the device table does not give the blob's size (", blob_source->size(), " bytes)"));
  }
  auto tree = SnapshotImage(*out.image);
  if (!tree.ok()) return tree.status().Annotate("our reader walks the image");
  out.tree = std::move(*tree);

  auto fsck = RunCommand({.argv = {"fsck.erofs", "--device=" + blob, meta}});
  if (!fsck.ok()) return fsck.status().Annotate("run fsck.erofs");
  if (!fsck->success()) {
    return Error(EINVAL, StrCat("fsck.erofs ", fsck->Describe(), ": ", fsck->out, fsck->err));
  }

  if (::geteuid() != 0) return out;
  const std::string at = JoinPath(scratch, "kernel-mount");
  STRATA_RETURN_IF_ERROR(MakeDirs(at));
  {
    auto mnt = MountPoint::Mount(meta, at, "erofs", MS_RDONLY, "device=" + blob);
    if (!mnt.ok()) return mnt.status().Annotate("the kernel mounts the image");
    auto kernel = SnapshotTree(at);
    if (!kernel.ok()) return kernel.status().Annotate("walk the kernel mount");
    auto diff = DiffTrees(out.tree, *kernel);
    if (!diff.empty()) return Error(EINVAL, "the kernel and our reader disagree:\n" + Join(diff, "\n"));
  }
  ::rmdir(at.c_str());
  out.kernel_checked = true;
  return out;
}

}  // namespace strata::testing
