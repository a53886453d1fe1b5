// The EROFS reader as a second opinion on the kernel: the same images are
// mounted by the kernel's EROFS driver (file-backed mounts, the blob as
// device=) and everything the reader returns is compared with the mounted
// tree. Needs root and a kernel with EROFS; skips otherwise.
#include <errno.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>

#include "common/erofs/reader.h"
#include "common/fs.h"
#include "common/strings.h"
#include "tests/common/erofs_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::erofs {
namespace {

using testing::BuiltImage;
using testing::CompareImageWithTree;
using testing::CompareOptions;
using testing::MakeImage;
using testing::OpenImage;

// A read-only kernel mount of an EROFS image, detached when it goes away
// (whatever the test's outcome).
class KernelMount {
 public:
  static Result<KernelMount> Create(const BuiltImage& image, const std::string& target) {
    std::string options = image.blob.empty() ? "" : "device=" + image.blob;
    if (::mount(image.meta.c_str(), target.c_str(), "erofs", MS_RDONLY, options.c_str()) != 0) {
      return ErrnoError(errno, StrCat("mount erofs ", image.meta, " at ", target));
    }
    return KernelMount(target);
  }
  KernelMount(KernelMount&& other) noexcept : target_(std::move(other.target_)) { other.target_.clear(); }
  KernelMount& operator=(KernelMount&&) = delete;
  ~KernelMount() {
    if (!target_.empty() && ::umount2(target_.c_str(), MNT_DETACH) != 0) {
      ADD_FAILURE() << "umount " << target_ << ": " << std::strerror(errno);
    }
  }
  const std::string& path() const { return target_; }

 private:
  explicit KernelMount(std::string target) : target_(std::move(target)) {}
  std::string target_;
};

class ErofsKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting EROFS needs root";
    if (!testing::HaveMkfs()) GTEST_SKIP() << "mkfs.erofs not found (Debian: erofs-utils)";
    ASSERT_OK(MakeDirs(dir_.Sub("mnt")));
  }

  // Mounts `built` and compares the reader's view with the kernel's.
  void CompareWithKernel(const BuiltImage& built) {
    auto mount = KernelMount::Create(built, dir_.Sub("mnt"));
    if (!mount.ok()) {
      if (mount.status().code() == ENODEV || mount.status().code() == EPERM) {
        GTEST_SKIP() << "the kernel cannot mount EROFS here: " << mount.status().ToString();
      }
      FAIL() << mount.status().ToString();
    }
    ASSERT_OK_AND_ASSIGN(auto image, OpenImage(built));
    CompareOptions options;
    options.device_paths = {built.meta};
    if (!built.blob.empty()) options.device_paths.push_back(built.blob);
    CompareImageWithTree(*image, mount->path(), options);
  }

  TempDir dir_ = strata::testing::MakeTempDir();
};

TEST_F(ErofsKernelTest, RichTreeInEveryLayout) {
  ASSERT_OK(testing::BuildRichTree(dir_.Sub("src")).status());
  struct Case {
    const char* name;
    std::vector<std::string> args;
    bool blobdev;
  } cases[] = {
      {"inline", {}, false},
      {"plain", {"-Enoinline_data"}, false},
      {"compact", {"-Eforce-inode-compact", "--force-uid=7", "--force-gid=8", "-T1700000000"}, false},
      {"chunk4k", {"--chunksize=4096"}, false},
      {"chunk64k_indexes", {"--chunksize=65536", "-Eforce-chunk-indexes"}, false},
      {"chunk4k_blob", {"--chunksize=4096"}, true},
      {"chunk1m_blob", {"--chunksize=1048576", "-Eforce-inode-extended"}, true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(BuiltImage built, MakeImage(dir_.Sub("src"), dir_.path(), c.name, c.args, c.blobdev));
    CompareWithKernel(built);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}

// The patched images hold what mkfs.erofs 1.5 cannot write; the kernel
// reading them the same way shows the patches follow the format.
TEST_F(ErofsKernelTest, LongXattrPrefixesAgree) {
  ASSERT_OK(testing::BuildSmallTree(dir_.Sub("src")));
  ASSERT_OK_AND_ASSIGN(BuiltImage built, testing::MakeLongPrefixImage(dir_.Sub("src"), dir_.path()));
  CompareWithKernel(built);
}

TEST_F(ErofsKernelTest, LongXattrPrefixesInThePackedInodeAgree) {
  ASSERT_OK(testing::BuildSmallTree(dir_.Sub("src")));
  ASSERT_OK_AND_ASSIGN(BuiltImage built, testing::MakePackedPrefixImage(dir_.Sub("src"), dir_.path()));
  CompareWithKernel(built);
}

TEST_F(ErofsKernelTest, ChunkHolesAgree) {
  ASSERT_OK(testing::BuildSmallTree(dir_.Sub("src")));
  for (bool blobdev : {false, true}) {
    SCOPED_TRACE(blobdev ? "blob" : "block map");
    ASSERT_OK_AND_ASSIGN(BuiltImage built, testing::MakeChunkHoleImage(dir_.Sub("src"), dir_.path(), blobdev));
    CompareWithKernel(built);
  }
}

}  // namespace
}  // namespace strata::erofs
