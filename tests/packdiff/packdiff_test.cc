// System tests of packdiff: layers served by lazyfs, overlays mounted by the
// test the way sandboxes mount them, changes made by a script running as a
// sandbox's root (a user namespace mapping 0 to host 100000, chrooted into
// the overlay), then the upper packed and stacked again under a fresh
// overlay, which must show exactly what the first one showed.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/idmap.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "common/unix_socket.h"
#include "layerctl/builder.h"
#include "layerctl/inspect.h"
#include "layerctl/publish.h"
#include "lazyfs/daemon.h"
#include "packdiff/packdiff.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/test_util.h"
#include "tests/testing/tree.h"

namespace strata::packdiff {
namespace {

using namespace std::chrono_literals;
using testing::MakeTempDir;
using testing::RandomBytes;

constexpr uint32_t kShift = 100000;
const IdMapping kSandboxIds{0, kShift, 65536};

// Runs argv as the root of a sandbox (the user namespace `userns_fd`,
// uid/gid 0 inside), chrooted into `root` when it is not empty. Returns the
// exit status; stdout and stderr go to `log`.
Result<int> RunAsSandboxRoot(int userns_fd, const std::string& root, const std::vector<std::string>& argv,
                             const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  STRATA_ASSIGN_OR_RETURN(UniqueFd out, OpenFile(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoError(errno, "fork");
  if (pid == 0) {  // async-signal-safe calls only: the test process has threads
    ::dup2(out.get(), 1);
    ::dup2(out.get(), 2);
    if (::setns(userns_fd, CLONE_NEWUSER) != 0) ::_exit(120);
    if (::setgroups(0, nullptr) != 0) ::_exit(121);
    if (::setresgid(0, 0, 0) != 0 || ::setresuid(0, 0, 0) != 0) ::_exit(122);
    if (!root.empty() && (::chroot(root.c_str()) != 0 || ::chdir("/") != 0)) ::_exit(123);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class PackdiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: FUSE, EROFS and overlay mounts, user namespaces";
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "needs /dev/fuse";
    // A sandbox's root (host 100000) must reach the overlays below.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0711), 0);
    store_url_ = "file://" + dir_.Sub("store");
    auto store = cache::OpenStore(store_url_);
    ASSERT_TRUE(store.ok());
    inner_ = *store;
    store_ = std::make_shared<testing::FaultyStore>(inner_);
    catalog_ = std::make_unique<cache::Catalog>(store_);
    lazyfs::DaemonOptions o;
    o.socket_path = dir_.Sub("lazyfs.sock");
    o.cache_dir = dir_.Sub("cache");
    o.grace = 0s;
    o.node = "test-node";
    o.open_store = [this](std::string_view) -> Result<std::shared_ptr<cache::ObjectStore>> { return inner_; };
    auto d = lazyfs::Daemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
    auto ns = CreateUserNamespace(kSandboxIds);
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    userns_ = std::move(*ns);
  }

  void TearDown() override {
    while (!overlays_.empty()) Unmount(overlays_.begin()->first);
    while (!scratch_mounts_.empty()) {  // after the overlays that may sit on them
      EXPECT_OK(scratch_mounts_.back().Unmount());
      scratch_mounts_.pop_back();
    }
    daemon_.reset();
    for (const auto& mp : MountsBelow(dir_.path())) {
      ADD_FAILURE() << "mount left behind: " << mp;
      ::umount2(mp.c_str(), MNT_DETACH);
    }
  }

  // Builds `src` as a base layer and publishes it as NAME:1.
  Digest128 PublishBase(const std::string& src, const std::string& name) {
    auto built = layerctl::BuildLayer({.source = src, .output_dir = dir_.Sub("build-" + name), .name = name});
    EXPECT_TRUE(built.ok()) << built.status().ToString();
    EXPECT_OK(layerctl::Push(*built, *catalog_, cache::LayerRef{name, "1"}).status());
    return built->digest;
  }

  // The busybox tree plus a rich tree under it, published as base:1.
  void PublishRichBase() {
    const std::string src = dir_.Sub("base-src");
    ASSERT_OK(MakeDirs(src));
    ASSERT_OK(testing::MakeBusyboxRoot(src));
    ASSERT_OK(testing::MakeRichTree(src, {.large_sparse_file = false}));
    // A whiteout in a directory no layer merges with shows as a broken
    // entry in any overlay; a base has no use for one.
    ASSERT_OK(RemoveTree(src + "/dev/whiteout"));
    PublishBase(src, "base");
  }

  struct Overlay {
    std::string holder;
    std::vector<Digest128> layers;
    MountPoint mount;
    std::string upper, work;
  };

  // Mounts the stack `refs` (bottom first, resolved as a sandbox resolves
  // it) through lazyfs and an overlay on top at dir/NAME, with an upper and
  // work directory unless `writable` is false. With `idmapped`, the layers
  // are the node's idmapped views and the upper belongs to the sandbox's
  // root, as in a sandbox. The upper and work directories are made in
  // `volume` when it is given (as the launcher makes them in a sandbox's
  // btrfs subvolume), else beside the mount point.
  std::string MountStack(const std::string& name, const std::vector<std::string>& refs, bool writable, bool idmapped,
                         const std::string& extra = "redirect_dir=off,metacopy=off,index=off",
                         const std::string& volume = "") {
    Overlay o;
    o.holder = "test-" + name;
    auto stack = catalog_->ResolveStack(refs);
    EXPECT_TRUE(stack.ok()) << stack.status().ToString();
    if (!stack.ok()) return "";
    std::vector<std::string> lowers;
    for (const auto& layer : *stack) {
      auto h = daemon_->Acquire(layer.digest.Hex(), store_url_, o.holder,
                                idmapped ? std::optional<IdMapping>(kSandboxIds) : std::nullopt);
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      if (!h.ok()) {
        for (const auto& d : o.layers) daemon_->Release(d, o.holder).IgnoreError();
        return "";
      }
      o.layers.push_back(layer.digest);
      lowers.insert(lowers.begin(), h->path);
    }
    const std::string at = dir_.Sub(name);
    EXPECT_OK(MakeDirs(at));
    std::string options = "lowerdir=" + Join(lowers, ":");
    if (writable) {
      o.upper = volume.empty() ? dir_.Sub(name + "-upper") : volume + "/upper";
      o.work = volume.empty() ? dir_.Sub(name + "-work") : volume + "/work";
      EXPECT_OK(MakeDirs(o.upper));
      EXPECT_OK(MakeDirs(o.work));
      if (idmapped) {
        EXPECT_EQ(::chown(o.upper.c_str(), kShift, kShift), 0);
      }
      options += ",upperdir=" + o.upper + ",workdir=" + o.work + "," + extra;
    }
    auto mnt = MountPoint::Mount("overlay", at, "overlay", writable ? 0 : MS_RDONLY, options);
    EXPECT_TRUE(mnt.ok()) << mnt.status().ToString();
    if (!mnt.ok()) {
      for (const auto& d : o.layers) daemon_->Release(d, o.holder).IgnoreError();
      return "";
    }
    o.mount = std::move(*mnt);
    overlays_[at] = std::move(o);
    return at;
  }

  // Unmounts the overlay at `at` and releases its layers; returns its upper.
  std::string Unmount(const std::string& at) {
    auto it = overlays_.find(at);
    if (it == overlays_.end()) return "";
    Overlay o = std::move(it->second);
    overlays_.erase(it);
    EXPECT_OK(o.mount.Unmount());
    for (const auto& d : o.layers) EXPECT_OK(daemon_->Release(d, o.holder));
    return o.upper;
  }

  // Runs a shell script as the sandbox's root, chrooted into `root`.
  void RunScript(const std::string& root, const std::string& script) {
    const std::string log = dir_.Sub("script.log");
    auto rc = RunAsSandboxRoot(userns_.get(), root, {"/bin/sh", "-c", "set -e\n" + script}, log);
    ASSERT_TRUE(rc.ok()) << rc.status().ToString();
    EXPECT_EQ(*rc, 0) << ReadFileToString(log).value_or("");
  }

  // Runs python3 (the host's) as the sandbox's root, not chrooted: for
  // xattrs, which busybox cannot set. `code` sees the overlay as sys.argv[1].
  void RunPython(const std::string& at, const std::string& code) {
    const std::string log = dir_.Sub("python.log");
    auto rc = RunAsSandboxRoot(userns_.get(), "", {"python3", "-c", "import os, struct, sys\nm = sys.argv[1]\n" + code, at},
                               log);
    ASSERT_TRUE(rc.ok()) << rc.status().ToString();
    EXPECT_EQ(*rc, 0) << ReadFileToString(log).value_or("");
  }

  // overlayfs hides its own xattrs from the view. With `directory_nlink`
  // false, directories' link counts are not compared: overlayfs reports 1
  // for a directory merged from several layers and the real count for one
  // from a single layer, and squash (or a redirected directory made whole)
  // changes how many layers a directory is merged from.
  static testing::SnapshotOptions ViewOptions(bool directory_nlink = true) {
    return {.directory_nlink = directory_nlink, .ignore_xattr_prefixes = {"trusted.overlay."}};
  }

  // Compares the view at `at` with `want`, which was taken with the same
  // `directory_nlink`.
  void ExpectSameView(const testing::TreeSnapshot& want, const std::string& at, bool directory_nlink = true) {
    ASSERT_OK_AND_ASSIGN(auto got, testing::SnapshotTree(at, ViewOptions(directory_nlink)));
    auto diff = testing::DiffTrees(want, got, 40);
    EXPECT_TRUE(diff.empty()) << Join(diff, "\n");
    EXPECT_GT(want.size(), 100u);
  }

  Result<PackReport> Pack(const std::string& upper, std::vector<std::string> parents, const std::string& tag,
                          bool shift = true) {
    PackOptions options;
    options.upper = upper;
    options.parents = std::move(parents);
    options.tag = cache::LayerRef{tag, "1"};
    if (shift) options.id_shift = IdShift{kShift, 65536};
    return PackUpper(options, *catalog_);
  }

  std::string Tool(const std::string& name) const { return testing::TestBinaryDir() + "/../../" + name + "/" + name; }

  // A small btrfs on a sparse loop file at dir/NAME, as the launcher's
  // uppers are (`launcher doctor --fix` makes them so). Unmounted, which
  // frees its loop device, in TearDown after the overlays on it.
  Result<std::string> MountScratchBtrfs(const std::string& name) {
    const std::string image = dir_.Sub(name + ".img"), at = dir_.Sub(name);
    STRATA_RETURN_IF_ERROR(RunChecked({.argv = {"truncate", "-s", "256M", image}}, "truncate").status());
    STRATA_RETURN_IF_ERROR(RunChecked({.argv = {"mkfs.btrfs", "-q", image}}, "mkfs.btrfs").status());
    STRATA_RETURN_IF_ERROR(MakeDirs(at));
    STRATA_RETURN_IF_ERROR(RunChecked({.argv = {"mount", "-o", "loop", image, at}}, "mount " + image).status());
    scratch_mounts_.push_back(MountPoint::Adopt(at));
    return at;
  }

  TempDir dir_ = MakeTempDir();
  std::string store_url_;
  std::shared_ptr<cache::ObjectStore> inner_;
  std::shared_ptr<testing::FaultyStore> store_;
  std::unique_ptr<cache::Catalog> catalog_;
  std::unique_ptr<lazyfs::Daemon> daemon_;
  UniqueFd userns_;
  std::map<std::string, Overlay> overlays_;
  std::vector<MountPoint> scratch_mounts_;
};

// Every kind of change a sandbox makes, in one script.
constexpr const char* kEveryChange = R"(
# created: files, nested directories, a FIFO, empty files and directories
echo new > /files/new-file
mkdir -p /newdir/sub/deeper
echo hi > /newdir/sub/deeper/f
echo top > /newdir/top
mkfifo /newdir/fifo
touch /files/empty-new
mkdir /empty-new-dir
# modified: appended, overwritten in place (one chunk of several)
echo appended >> /files/size-100
dd if=/bin/busybox of=/files/size-3157873 bs=1 count=100 skip=5000 seek=1500000 conv=notrunc
# deleted: files (several whiteouts, which overlayfs hardlinks together) and a subtree
rm /files/size-1 /files/size-4095 '/names/with space' /names/-leading-dash
rm -rf /deep/d0/d1/d2
# removed and recreated: an opaque directory
rm -rf /wide
mkdir /wide
echo fresh > /wide/only
# renamed: a directory (copied, as redirect_dir=off makes mv do) and a file
mv /modes /modes-renamed
mv /files/size-65536 /files/renamed-65536
# modes and owners
chmod 4711 /files/size-4096
chmod 700 /links
chown 1000:1000 /files/size-4097
chown 2000:3000 /newdir/top
# hardlinks: to a lower file, between new files; one name of a lower pair changed
ln /files/size-0 /files/hardlink-to-lower
ln /newdir/top /newdir/top-link
echo changed >> /links/hard-1
# symlinks: new, replaced
ln -s ../files/new-file /newdir/sym
rm /links/dangling
ln -s now/dangles/elsewhere /links/dangling
# truncated: to zero, shorter, longer (a sparse tail)
truncate -s 0 /files/size-1048576
truncate -s 1000 /files/copy-a
truncate -s 5000000 /files/size-65537
# mtimes
touch -d '2001-02-03 04:05:06' /files/size-4096
# type changes, and a deleted file recreated
rm -rf /empty-dir
echo now-a-file > /empty-dir
rm /files/size-1048575
mkdir /files/size-1048575
echo inside > /files/size-1048575/x
rm /files/copy-b
echo recreated > /files/copy-b
)";

// Xattrs, which busybox cannot set: user.* on new and lower entries, one
// removed, and a file capability (the kernel stores it as v3 with the
// sandbox's root, host 100000).
constexpr const char* kXattrChanges = R"(
os.setxattr(m + '/files/new-file', 'user.note', b'hello')
os.setxattr(m + '/newdir', 'user.dir', b'd')
os.setxattr(m + '/files/size-4096', 'user.changed', b'c')
os.removexattr(m + '/xattrs/f2', 'user.unique')
cap = struct.pack('<IIIII', 0x02000001, 0x400, 0, 0, 0)  # v2: cap_net_bind_service, effective
os.setxattr(m + '/files/new-file', 'security.capability', cap)
)";

TEST_F(PackdiffTest, EveryKindOfChangeSurvivesTheRoundTrip) {
  PublishRichBase();
  const std::string first = MountStack("first", {"base:1"}, true, true);
  ASSERT_FALSE(first.empty());
  RunScript(first, kEveryChange);
  RunPython(first, kXattrChanges);
  ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(first, ViewOptions()));
  const std::string upper = Unmount(first);

  // What the kernel left: whiteouts sharing one inode, a v3 capability
  // naming the sandbox's root by its host id.
  struct stat wh;
  ASSERT_EQ(::lstat((upper + "/files/size-1").c_str(), &wh), 0);
  EXPECT_TRUE(S_ISCHR(wh.st_mode) && wh.st_rdev == 0);
  EXPECT_GT(wh.st_nlink, 1u);
  auto cap_root = [](std::string_view cap) {
    uint32_t root = UINT32_MAX;
    if (cap.size() == 24) std::memcpy(&root, cap.data() + 20, 4);
    return root;
  };
  char cap[64];
  ssize_t n = ::lgetxattr((upper + "/files/new-file").c_str(), "security.capability", cap, sizeof cap);
  ASSERT_EQ(n, 24);
  EXPECT_EQ(cap_root(std::string_view(cap, 24)), kShift);

  ASSERT_OK_AND_ASSIGN(PackReport report, Pack(upper, {"base:1"}, "diff"));
  EXPECT_EQ(report.manifest.kind, cache::LayerKind::kDiff);
  ASSERT_OK_AND_ASSIGN(auto layer, PublishedLayer::Open(*catalog_, report.digest));
  ASSERT_OK_AND_ASSIGN(erofs::Inode new_file, layer->image().LookupPath("files/new-file"));
  EXPECT_EQ(new_file.uid, 0u);
  ASSERT_OK_AND_ASSIGN(std::string layer_cap, layer->image().GetXattr(new_file, "security.capability"));
  EXPECT_EQ(cap_root(layer_cap), 0u);
  ASSERT_OK_AND_ASSIGN(erofs::Inode top, layer->image().LookupPath("newdir/top"));
  EXPECT_EQ(top.uid, 2000u);
  EXPECT_EQ(top.gid, 3000u);
  ASSERT_OK_AND_ASSIGN(Digest128 base, catalog_->Resolve("base:1"));
  EXPECT_EQ(report.parents, std::vector<Digest128>{base});
  EXPECT_GE(report.written.whiteouts, 6u);
  EXPECT_GE(report.written.opaque_directories, 1u);
  EXPECT_GE(report.written.hardlinks, 2u);
  ASSERT_TRUE(report.push);

  // The diff alone names its parents; parents + diff under a fresh overlay.
  const std::string second = MountStack("second", {"diff:1"}, false, true);
  ASSERT_FALSE(second.empty());
  ExpectSameView(want, second);
  // And as a sandbox stacks it: with a fresh upper (the root's own
  // attributes then come from that upper).
  const std::string third = MountStack("third", {"base:1", "diff:1"}, true, true);
  ASSERT_FALSE(third.empty());
  ASSERT_OK_AND_ASSIGN(auto got, testing::SnapshotTree(third, ViewOptions()));
  want.erase(".");
  got.erase(".");
  auto diff = testing::DiffTrees(want, got, 40);
  EXPECT_TRUE(diff.empty()) << Join(diff, "\n");
}

TEST_F(PackdiffTest, AChainOfThreeDiffsAndItsSquash) {
  PublishRichBase();
  const std::vector<std::string> scripts = {
      R"(
mkdir -p /chain/dir /chain/keep
echo a > /chain/a
echo b > /chain/b
echo x > /chain/dir/x
echo y > /chain/dir/y
echo k > /chain/keep/k
rm /files/size-1 /files/size-100
rm -rf /opaque /deep/d0/d1/d2/d3
ln /chain/a /chain/a-link
echo first >> /files/size-4097
)",
      R"(
rm /chain/b
rm -rf /chain/dir
mkdir /chain/dir
echo z > /chain/dir/z
echo back > /files/size-1
rm -rf /deep/d0/d1
chmod 700 /chain/keep
echo second >> /files/size-4097
ln -s /chain/keep/k /chain/k-link
)",
      R"(
mkdir -p /deep/d0/d1
echo again > /deep/d0/d1/f
rm /chain/dir/z
rm /chain/keep/k
echo third >> /files/size-4097
mkdir /files/size-100
echo dir-now > /files/size-100/inside
touch -d '2010-01-01 00:00:00' /chain
)"};
  std::vector<std::string> parents = {"base:1"};
  testing::TreeSnapshot want, want_no_dir_nlink;
  for (size_t i = 0; i < scripts.size(); ++i) {
    SCOPED_TRACE(StrCat("diff ", i + 1));
    const std::string name = StrCat("round", i + 1);
    const std::string at = MountStack(name, parents, true, true);
    ASSERT_FALSE(at.empty());
    RunScript(at, scripts[i]);
    if (i == 1) RunPython(at, "os.setxattr(m + '/chain/keep', 'user.k', b'v')\n");
    ASSERT_OK_AND_ASSIGN(want, testing::SnapshotTree(at, ViewOptions()));
    ASSERT_OK_AND_ASSIGN(want_no_dir_nlink, testing::SnapshotTree(at, ViewOptions(false)));
    const std::string upper = Unmount(at);
    const std::string tag = StrCat("chain", i + 1);
    ASSERT_OK_AND_ASSIGN(PackReport report, Pack(upper, {parents.back()}, tag));
    EXPECT_EQ(report.parents.size(), i + 1);
    parents.push_back(tag + ":1");
    const std::string check = MountStack(name + "-check", {tag + ":1"}, false, true);
    ASSERT_FALSE(check.empty());
    ExpectSameView(want, check);
    Unmount(check);
  }

  ASSERT_OK_AND_ASSIGN(PackReport squashed,
                       Squash({.diffs = {"chain1:1", "chain2:1", "chain3:1"}, .tag = cache::LayerRef{"squashed", "1"}},
                              *catalog_));
  ASSERT_OK_AND_ASSIGN(Digest128 base, catalog_->Resolve("base:1"));
  EXPECT_EQ(squashed.parents, std::vector<Digest128>{base});
  ASSERT_TRUE(squashed.push);
  // Every file's data was there already. What is new is the metadata
  // image, and groups of small files' chunks that now lie side by side
  // (layerctl::BuildOptions::group_size): each new extent holds two or more
  // files' bytes, or one small chunk that was in a group of another layer.
  std::set<Digest128> before;
  for (const std::string ref : {"base:1", "chain1:1", "chain2:1", "chain3:1"}) {
    ASSERT_OK_AND_ASSIGN(Digest128 d, catalog_->Resolve(ref));
    ASSERT_OK_AND_ASSIGN(cache::Manifest m, catalog_->GetManifest(d));
    for (const auto& e : m.extents) before.insert(e.hash);
  }
  std::map<Digest128, std::set<uint64_t>> starts;  // extent -> where files' bytes start in it
  ASSERT_OK(layerctl::ListLayerFiles(*catalog_, squashed.digest, [&](const layerctl::FileEntry& f) {
    for (const auto& e : f.extents) {
      if (e.chunk) starts[*e.chunk].insert(e.chunk_offset);
    }
    return OkStatus();
  }));
  uint64_t regrouped = 0;
  for (const auto& e : squashed.manifest.extents) {
    if (before.count(e.hash)) continue;
    EXPECT_LE(e.length, layerctl::kDefaultGroupSize);
    EXPECT_TRUE(starts[e.hash].size() >= 2 || e.length < layerctl::kDefaultGroupSize / 2)
        << "extent at " << e.offset << " of " << e.length << " bytes is neither a group nor small";
    regrouped += e.length;
  }
  EXPECT_EQ(squashed.push->bytes_uploaded, squashed.manifest.meta_size + regrouped);
  const std::string view = MountStack("squashed", {"squashed:1"}, false, true);
  ASSERT_FALSE(view.empty());
  ExpectSameView(want_no_dir_nlink, view, /*directory_nlink=*/false);

  // Squash checks the chain.
  auto wrong = Squash({.diffs = {"chain2:1", "chain1:1"}, .tag = cache::LayerRef{"bad", "1"}}, *catalog_);
  EXPECT_EQ(wrong.status().code(), EINVAL);
  EXPECT_NE(wrong.status().message().find("was made on"), std::string::npos) << wrong.status().ToString();
}

// An upper made elsewhere, with redirect_dir=on and metacopy=on: renamed
// directories and metadata-only copy-ups are resolved against the parents.
TEST_F(PackdiffTest, RedirectsAndMetacopyEntriesAreResolvedAgainstTheParents) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src + "/dir/sub"));
  ASSERT_OK(MakeDirs(src + "/d2"));
  for (int i = 0; i < 4; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/dir/f", i), RandomBytes(5000 + i, i)));
  ASSERT_OK(WriteFileAtomic(src + "/dir/sub/s", "sub"));
  ASSERT_OK(WriteFileAtomic(src + "/big", RandomBytes(3 << 20, 7)));
  ASSERT_OK(WriteFileAtomic(src + "/d2/x", "x"));
  ASSERT_OK(WriteFileAtomic(src + "/d2/y", "y"));
  for (int i = 0; i < 100; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/d2/n", i), StrCat(i)));
  PublishBase(src, "plain");

  const std::string first = MountStack("first", {"plain:1"}, true, false, "redirect_dir=on,metacopy=on,index=off");
  ASSERT_FALSE(first.empty());
  ASSERT_OK(RunChecked({.argv = {"sh", "-ec",
                                 "cd " + first +
                                     "\nchmod 600 big\nmv dir dir-renamed\necho more >> dir-renamed/f2\n"
                                     "chmod 700 dir-renamed/f3\nmv d2/x d2/x-moved\nln d2/y d2/y-link\n"
                                     "mkdir dir\necho new > dir/new\n"}},
                       "change the overlay")
                .status());
  ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(first, ViewOptions(/*directory_nlink=*/false)));
  const std::string upper = Unmount(first);
  ASSERT_OK_AND_ASSIGN(PackReport report, Pack(upper, {"plain:1"}, "resolved", /*shift=*/false));
  EXPECT_GE(report.upper.metacopy_resolved, 3u);  // big, dir-renamed/f3, d2/x-moved
  EXPECT_GE(report.upper.redirects_resolved, 1u);
  // big's data is the parent's: nothing of it is uploaded again.
  EXPECT_LT(report.push->bytes_uploaded, 1u << 20);
  const std::string second = MountStack("second", {"resolved:1"}, false, false);
  ASSERT_FALSE(second.empty());
  ExpectSameView(want, second, /*directory_nlink=*/false);

  // Without the layers the upper was made on, its metacopy entries cannot
  // be resolved: a clear error, nothing published.
  const std::string other = dir_.Sub("other");
  ASSERT_OK(MakeDirs(other));
  ASSERT_OK(WriteFileAtomic(other + "/unrelated", "u"));
  PublishBase(other, "other");
  auto wrong = Pack(upper, {"other:1"}, "wrong", false);
  EXPECT_EQ(wrong.status().code(), ENOENT);
  EXPECT_NE(wrong.status().message().find("metacopy"), std::string::npos) << wrong.status().ToString();
  EXPECT_FALSE(catalog_->GetTag("wrong", "1").ok());
}

TEST_F(PackdiffTest, OnlyChangedDataIsUploaded) {
  const std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src + "/many"));
  ASSERT_OK(WriteFileAtomic(src + "/big", RandomBytes(8 << 20, 1)));
  for (int i = 0; i < 64; ++i) ASSERT_OK(WriteFileAtomic(src + StrCat("/many/f", i), RandomBytes(1 << 20, 100 + i)));
  PublishBase(src, "large");

  // One small file changed: a tiny layer.
  const std::string a = MountStack("a", {"large:1"}, true, false);
  ASSERT_FALSE(a.empty());
  ASSERT_OK(WriteFileAtomic(a + "/many/config", "key = value\n"));
  ASSERT_OK_AND_ASSIGN(PackReport small, Pack(Unmount(a), {"large:1"}, "small", false));
  EXPECT_LT(small.layer_bytes, 16u << 10);
  EXPECT_LT(small.push->bytes_uploaded, 16u << 10);

  // 100 bytes of an 8 MiB file overwritten: the copy-up holds all 8 MiB,
  // but only the chunk that changed is new.
  const std::string b = MountStack("b", {"large:1"}, true, false);
  ASSERT_FALSE(b.empty());
  ASSERT_OK(RunChecked({.argv = {"dd", "if=/dev/urandom", "of=" + b + "/big", "bs=100", "count=1", "seek=50000",
                                 "conv=notrunc", "status=none"}},
                       "dd")
                .status());
  ASSERT_OK_AND_ASSIGN(PackReport one_chunk, Pack(Unmount(b), {"large:1"}, "one-chunk", false));
  EXPECT_EQ(one_chunk.written.file_bytes, 8u << 20);
  EXPECT_LT(one_chunk.push->bytes_uploaded, (1u << 20) + (16u << 10));
  EXPECT_EQ(one_chunk.push->bytes_present, 7u << 20);
}

// What `launcher snapshot` will do: the sandbox's upper lives in a btrfs
// subvolume (upper/ and work/ in it) under a volatile overlay; the snapshot
// freezes the sandbox, takes a read-only btrfs snapshot of the subvolume,
// thaws it, and packs the snapshot's upper with the sandbox's stack (as
// digests) as parents and the node's id shift. The sandbox goes on
// changing its upper meanwhile; the diff holds what it showed at the
// snapshot.
TEST_F(PackdiffTest, AReadOnlyBtrfsSnapshotOfASandboxUpperPacksAsLauncherSnapshotWill) {
  if (::access("/usr/sbin/mkfs.btrfs", X_OK) != 0 && ::access("/sbin/mkfs.btrfs", X_OK) != 0) {
    GTEST_SKIP() << "needs mkfs.btrfs (btrfs-progs; scripts/setup installs it)";
  }
  PublishRichBase();
  ASSERT_OK_AND_ASSIGN(std::string fs, MountScratchBtrfs("uppers"));
  const std::string volume = fs + "/sb-1";
  ASSERT_OK(RunChecked({.argv = {"btrfs", "-q", "subvolume", "create", volume}}, "create a subvolume").status());
  const std::string sandbox = MountStack("sandbox", {"base:1"}, true, true,
                                         "redirect_dir=off,metacopy=off,index=off,volatile", volume);
  ASSERT_FALSE(sandbox.empty());
  RunScript(sandbox, kEveryChange);
  RunPython(sandbox, kXattrChanges);
  // btrfs counts every directory's links as 1, so the sandbox showed 1 for
  // directories wholly in its upper; the diff's image counts them (2 plus
  // subdirectories), as any layer does. Directory link counts aside, the
  // views must match.
  ASSERT_OK_AND_ASSIGN(auto want, testing::SnapshotTree(sandbox, ViewOptions(/*directory_nlink=*/false)));

  // Nothing runs in the sandbox here, so there is nothing to freeze.
  const std::string snapshot = fs + "/sb-1.snapshot";
  ASSERT_OK(RunChecked({.argv = {"btrfs", "-q", "subvolume", "snapshot", "-r", volume, snapshot}}, "snapshot").status());
  RunScript(sandbox, "echo later > /files/new-file\nrm -rf /newdir\ntouch /after-the-snapshot\n");

  ASSERT_OK_AND_ASSIGN(auto stack, catalog_->ResolveStack({"base:1"}));
  std::vector<std::string> parents;
  for (const auto& layer : stack) parents.push_back(layer.digest.Hex());
  ASSERT_OK_AND_ASSIGN(PackReport report, PackUpper({.upper = snapshot + "/upper",
                                                     .parents = parents,
                                                     .tag = cache::LayerRef{"sb-1-snapshot", "1"},
                                                     .id_shift = IdShift{kShift, 65536}},
                                                    *catalog_));
  EXPECT_EQ(report.parents, std::vector<Digest128>{stack.back().digest});
  ASSERT_OK_AND_ASSIGN(auto layer, PublishedLayer::Open(*catalog_, report.digest));
  ASSERT_OK_AND_ASSIGN(erofs::Inode new_file, layer->image().LookupPath("files/new-file"));
  EXPECT_EQ(new_file.uid, 0u);
  EXPECT_EQ(layer->image().LookupPath("after-the-snapshot").status().code(), ENOENT);
  Unmount(sandbox);

  const std::string view = MountStack("view", {"sb-1-snapshot:1"}, false, true);
  ASSERT_FALSE(view.empty());
  ExpectSameView(want, view, /*directory_nlink=*/false);
}

// An upper directory written by hand, for the inputs a kernel overlay would
// never produce (or a sandbox should not).
class BadUpperTest : public PackdiffTest {
 protected:
  void SetUp() override {
    PackdiffTest::SetUp();
    if (IsSkipped()) return;
    const std::string src = dir_.Sub("src");
    ASSERT_OK(MakeDirs(src + "/etc"));
    ASSERT_OK(WriteFileAtomic(src + "/etc/passwd", "root:x:0:0::/root:/bin/sh\n"));
    ASSERT_OK(WriteFileAtomic(src + "/run.sock", "a file in the base"));
    PublishBase(src, "small");
    upper_ = dir_.Sub("upper");
    ASSERT_OK(MakeDirs(upper_ + "/etc"));
    ASSERT_OK(WriteFileAtomic(upper_ + "/etc/hosts", "127.0.0.1 localhost\n"));
  }

  Result<PackReport> PackIt(PackOptions options = {}) {
    options.upper = upper_;
    options.parents = {"small:1"};
    if (!options.tag) options.tag = cache::LayerRef{"bad", "1"};
    return PackUpper(options, *catalog_);
  }

  std::string upper_;
};

TEST_F(BadUpperTest, DeviceNodesAreRefusedUnlessKept) {
  ASSERT_EQ(::mknod((upper_ + "/etc/null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  auto r = PackIt();
  EXPECT_EQ(r.status().code(), EPERM);
  EXPECT_NE(r.status().message().find("etc/null"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("--keep-devices"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(catalog_->GetTag("bad", "1").ok());
  PackOptions keep;
  keep.keep_devices = true;
  ASSERT_OK_AND_ASSIGN(PackReport kept, PackIt(keep));
  ASSERT_OK_AND_ASSIGN(auto layer, PublishedLayer::Open(*catalog_, kept.digest));
  ASSERT_OK_AND_ASSIGN(erofs::Inode null, layer->image().LookupPath("etc/null"));
  EXPECT_EQ(null.type, erofs::FileType::kCharDevice);
  EXPECT_EQ(null.rdev, makedev(1, 3));
}

TEST_F(BadUpperTest, SocketsAreLeftOutAndHideWhatTheParentsHadThere) {
  for (const std::string& path : {upper_ + "/run.sock", upper_ + "/etc/agent.sock"}) {
    ASSERT_OK(ListenUnix(path, 0755).status());
  }
  ASSERT_OK_AND_ASSIGN(PackReport r, PackIt());
  EXPECT_EQ(r.upper.sockets, 2u);
  EXPECT_EQ(r.written.whiteouts, 1u);  // run.sock hides the base's file; agent.sock hides nothing
  ASSERT_OK_AND_ASSIGN(auto layer, PublishedLayer::Open(*catalog_, r.digest));
  ASSERT_OK_AND_ASSIGN(erofs::Inode run, layer->image().LookupPath("run.sock"));
  ASSERT_OK_AND_ASSIGN(bool whiteout, IsWhiteout(layer->image(), run));
  EXPECT_TRUE(whiteout);
  EXPECT_EQ(layer->image().LookupPath("etc/agent.sock").status().code(), ENOENT);
}

TEST_F(BadUpperTest, RedirectsOutOfTheRootAreRefused) {
  ASSERT_OK(MakeDirs(upper_ + "/moved"));
  for (const char* bad : {"/../../etc", "../x", "a/b", "/etc//x"}) {
    SCOPED_TRACE(bad);
    ASSERT_EQ(::setxattr((upper_ + "/moved").c_str(), "trusted.overlay.redirect", bad, std::strlen(bad), 0), 0);
    auto r = PackIt();
    EXPECT_EQ(r.status().code(), EINVAL);
    EXPECT_NE(r.status().message().find("moved"), std::string::npos) << r.status().ToString();
  }
  EXPECT_FALSE(catalog_->GetTag("bad", "1").ok());
}

// Symlinks are packed as they are, wherever they point, and never
// followed: not while listing, and not when a directory is swapped for a
// symlink to somewhere else between the listing and the read.
TEST_F(BadUpperTest, SymlinksAreStoredAsTheyAreAndNeverFollowed) {
  const std::string outside = dir_.Sub("outside");
  ASSERT_OK(MakeDirs(outside));
  ASSERT_OK(WriteFileAtomic(outside + "/secret", "not in the upper\n"));
  ASSERT_OK(WriteFileAtomic(outside + "/hosts", "not the upper's hosts\n"));
  const std::map<std::string, std::string> links = {
      {"escape", outside}, {"up", "../../../../.."}, {"etc/abs", "/etc/shadow"}, {"etc/loop", "loop"}};
  for (const auto& [path, target] : links) ASSERT_EQ(::symlink(target.c_str(), (upper_ + "/" + path).c_str()), 0);
  ASSERT_OK_AND_ASSIGN(PackReport r, PackIt());
  EXPECT_EQ(r.written.symlinks, links.size());
  ASSERT_OK_AND_ASSIGN(auto layer, PublishedLayer::Open(*catalog_, r.digest));
  for (const auto& [path, target] : links) {
    SCOPED_TRACE(path);
    ASSERT_OK_AND_ASSIGN(erofs::Inode link, layer->image().LookupPath(path));
    EXPECT_EQ(link.type, erofs::FileType::kSymlink);
    ASSERT_OK_AND_ASSIGN(std::string got, layer->image().ReadLink(link));
    EXPECT_EQ(got, target);
  }
  EXPECT_FALSE(layer->image().LookupPath("escape/secret").ok());

  // etc, listed as a directory, is a symlink to `outside` by the time its
  // files are read: an error naming the file, nothing read from outside,
  // nothing published.
  PackOptions swapped;
  swapped.tag = cache::LayerRef{"swapped", "1"};
  swapped.after_listing = [&] {
    ASSERT_EQ(::rename((upper_ + "/etc").c_str(), dir_.Sub("etc-moved").c_str()), 0);
    ASSERT_EQ(::symlink(outside.c_str(), (upper_ + "/etc").c_str()), 0);
  };
  auto s = PackIt(swapped);
  EXPECT_EQ(s.status().code(), EAGAIN) << s.status().ToString();
  EXPECT_NE(s.status().message().find("etc/hosts"), std::string::npos) << s.status().ToString();
  EXPECT_FALSE(catalog_->GetTag("swapped", "1").ok());
}

TEST_F(BadUpperTest, IdsOutsideTheShiftedRangeAreRefused) {
  ASSERT_EQ(::chown(upper_.c_str(), kShift, kShift), 0);
  ASSERT_EQ(::chown((upper_ + "/etc").c_str(), kShift, kShift), 0);
  ASSERT_EQ(::chown((upper_ + "/etc/hosts").c_str(), kShift + 5, kShift + 7), 0);
  PackOptions shifted;
  shifted.id_shift = IdShift{kShift, 65536};
  ASSERT_OK_AND_ASSIGN(PackReport ok, PackIt(shifted));
  ASSERT_OK_AND_ASSIGN(auto layer, PublishedLayer::Open(*catalog_, ok.digest));
  ASSERT_OK_AND_ASSIGN(erofs::Inode hosts, layer->image().LookupPath("etc/hosts"));
  EXPECT_EQ(hosts.uid, 5u);
  EXPECT_EQ(hosts.gid, 7u);

  ASSERT_EQ(::chown((upper_ + "/etc/hosts").c_str(), 5, kShift), 0);
  auto r = PackIt(shifted);
  EXPECT_EQ(r.status().code(), ERANGE);
  EXPECT_NE(r.status().message().find("etc/hosts"), std::string::npos) << r.status().ToString();
}

TEST_F(BadUpperTest, OverlayBookkeepingIsDroppedAndUserXattrsKept) {
  const std::string f = upper_ + "/etc/hosts";
  for (const char* name : {"trusted.overlay.origin", "trusted.overlay.impure", "trusted.overlay.nlink",
                           "trusted.overlay.upper", "trusted.overlay.uuid"}) {
    ASSERT_EQ(::setxattr(f.c_str(), name, "junk", 4, 0), 0) << name;
  }
  ASSERT_EQ(::setxattr(f.c_str(), "trusted.overlay.overlay.mine", "escaped", 7, 0), 0);
  ASSERT_EQ(::setxattr(f.c_str(), "user.keep", "k", 1, 0), 0);
  // The 6.7+ whiteout: an empty file with an xattr, announced by opaque=x.
  ASSERT_OK(WriteFileAtomic(upper_ + "/etc/passwd", ""));
  ASSERT_EQ(::setxattr((upper_ + "/etc/passwd").c_str(), "trusted.overlay.whiteout", "", 0, 0), 0);
  ASSERT_EQ(::setxattr((upper_ + "/etc").c_str(), "trusted.overlay.opaque", "x", 1, 0), 0);
  ASSERT_OK_AND_ASSIGN(PackReport r, PackIt());
  ASSERT_OK_AND_ASSIGN(auto layer, PublishedLayer::Open(*catalog_, r.digest));
  const erofs::Image& img = layer->image();
  ASSERT_OK_AND_ASSIGN(erofs::Inode hosts, img.LookupPath("etc/hosts"));
  ASSERT_OK_AND_ASSIGN(auto xattrs, img.ListXattrs(hosts));
  std::vector<std::string> names;
  for (const auto& x : xattrs) names.push_back(x.name);
  EXPECT_EQ(names, (std::vector<std::string>{"trusted.overlay.overlay.mine", "user.keep"}));
  ASSERT_OK_AND_ASSIGN(erofs::Inode passwd, img.LookupPath("etc/passwd"));
  EXPECT_EQ(passwd.type, erofs::FileType::kCharDevice);
  EXPECT_EQ(passwd.rdev, 0u);
  ASSERT_OK_AND_ASSIGN(erofs::Inode etc, img.LookupPath("etc"));
  EXPECT_EQ(img.GetXattr(etc, "trusted.overlay.opaque").status().code(), ENODATA);
}

TEST_F(BadUpperTest, AnUpperThatChangesWhileItIsReadIsAnError) {
  struct Case {
    const char* what;
    std::function<void()> change;
    const char* names;
  };
  const std::vector<Case> cases = {
      {"written", [&] { ASSERT_OK(WriteFileAtomic(upper_ + "/etc/hosts", "changed\n")); }, "etc/hosts"},
      {"appended",
       [&] {
         std::ofstream out(upper_ + "/etc/hosts", std::ios::app);
         out << "more\n";
       },
       "etc/hosts"},
      {"added", [&] { ASSERT_OK(WriteFileAtomic(upper_ + "/etc/new", "new\n")); }, "etc"},
      {"chmod", [&] { ASSERT_EQ(::chmod((upper_ + "/etc").c_str(), 0700), 0); }, "etc"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PackOptions options;
    options.after_listing = c.change;
    auto r = PackIt(options);
    EXPECT_EQ(r.status().code(), EAGAIN) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.names), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("freeze the sandbox"), std::string::npos);
    EXPECT_FALSE(catalog_->GetTag("bad", "1").ok());
  }
}

TEST_F(BadUpperTest, ExcludedPathsAreLeftOut) {
  ASSERT_OK(MakeDirs(upper_ + "/tmp/cache"));
  ASSERT_OK(WriteFileAtomic(upper_ + "/tmp/cache/blob", "x"));
  ASSERT_OK(WriteFileAtomic(upper_ + "/etc/module.pyc", "x"));
  PackOptions options;
  options.excludes = {"/tmp/cache", "*.pyc"};
  ASSERT_OK_AND_ASSIGN(PackReport r, PackIt(options));
  EXPECT_EQ(r.upper.excluded, 2u);
  ASSERT_OK_AND_ASSIGN(auto layer, PublishedLayer::Open(*catalog_, r.digest));
  EXPECT_OK(layer->image().LookupPath("tmp").status());
  EXPECT_EQ(layer->image().LookupPath("tmp/cache").status().code(), ENOENT);
  EXPECT_EQ(layer->image().LookupPath("etc/module.pyc").status().code(), ENOENT);
  EXPECT_OK(layer->image().LookupPath("etc/hosts").status());
}

TEST_F(BadUpperTest, AFailedPublishLeavesNoTagAndResumes) {
  for (int i = 0; i < 8; ++i) ASSERT_OK(WriteFileAtomic(upper_ + StrCat("/data-", i), RandomBytes(1 << 20, i)));
  store_->FailPutsAfter(3);
  auto failed = PackIt();
  EXPECT_EQ(failed.status().code(), ENOSPC) << failed.status().ToString();
  EXPECT_FALSE(catalog_->GetTag("bad", "1").ok());
  store_->FailPutsAfter(-1);
  ASSERT_OK_AND_ASSIGN(PackReport r, PackIt());
  EXPECT_OK(catalog_->GetTag("bad", "1").status());
  EXPECT_EQ(r.push->chunks_present, 3u);  // what the failed run got through
}

// The command line, killed at any moment: either the tag names a complete
// layer or there is no tag; a rerun publishes; no build directory is left.
TEST_F(BadUpperTest, KilledAtAnyMomentPublishesAllOrNothing) {
  for (int i = 0; i < 48; ++i) ASSERT_OK(WriteFileAtomic(upper_ + StrCat("/data-", i), RandomBytes(1 << 20, 50 + i)));
  const std::string tmp = dir_.Sub("tmp");
  ASSERT_OK(MakeDirs(tmp));
  auto start = [&](const std::string& tag) {
    return Subprocess::Start({.argv = {Tool("packdiff"), upper_, "--parent", "small:1", "--tag", tag, "--store",
                                       store_url_},
                              .env = {"TMPDIR=" + tmp}});
  };
  int completed = 0, left_behind = 0;
  for (int delay_ms : {5, 30, 80, 150, 300, 600}) {
    SCOPED_TRACE(delay_ms);
    const std::string tag = StrCat("killed-", delay_ms);
    ASSERT_OK_AND_ASSIGN(Subprocess p, start(tag + ":1"));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    p.Kill(SIGKILL);
    ASSERT_OK_AND_ASSIGN(auto result, p.Wait());
    ASSERT_OK_AND_ASSIGN(auto in_tmp, RunChecked({.argv = {"ls", "-A", tmp}}, "ls"));
    if (!in_tmp.out.empty()) ++left_behind;
    auto t = catalog_->GetTag(tag, "1");
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), ENOENT);
      continue;
    }
    ++completed;
    ASSERT_OK_AND_ASSIGN(auto report, layerctl::Verify(*catalog_, t->digest));
    EXPECT_TRUE(report.ok()) << Join(report.problems, "\n");
  }
  // Killed runs left their build directories (each run sweeps those of the
  // runs before it); the next run sweeps them.
  EXPECT_GT(left_behind, 0) << "no killed run left a build directory in TMPDIR: the sweep goes untested";
  ASSERT_OK_AND_ASSIGN(Subprocess last, start("final:1"));
  ASSERT_OK_AND_ASSIGN(auto done, last.Wait());
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_OK(catalog_->GetTag("final", "1").status());
  ASSERT_OK_AND_ASSIGN(auto left, RunChecked({.argv = {"ls", "-A", tmp}}, "ls"));
  EXPECT_EQ(left.out, "") << completed << " runs completed before the kill";
}

TEST_F(BadUpperTest, LayerctlShowsADiffsParents) {
  ASSERT_OK_AND_ASSIGN(PackReport r, PackIt());
  ASSERT_OK_AND_ASSIGN(Digest128 small, catalog_->Resolve("small:1"));
  auto layerctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {Tool("layerctl"), "--store", store_url_});
    return RunChecked({.argv = args}, "layerctl");
  };
  ASSERT_OK_AND_ASSIGN(auto inspect, layerctl({"inspect", "bad:1"}));
  EXPECT_NE(inspect.out.find("diff"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find(small.Hex()), std::string::npos) << inspect.out;
  ASSERT_OK_AND_ASSIGN(auto ls, layerctl({"ls"}));
  EXPECT_NE(ls.out.find("PARENTS"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find(small.Hex().substr(0, 12)), std::string::npos) << ls.out;
  EXPECT_NE(r.digest, small);
}

}  // namespace
}  // namespace strata::packdiff
