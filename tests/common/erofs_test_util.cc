// Helpers for the EROFS reader tests.
#include "tests/common/erofs_test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <set>

#include "common/erofs/format.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "common/unix_socket.h"
#include "tests/testing/test_util.h"

namespace strata::erofs::testing {

namespace {

Status Check(int rc, std::string_view what) {
  if (rc != 0) return ErrnoError(errno, what);
  return OkStatus();
}

Status WriteFile(const std::string& path, std::string_view data, mode_t mode = 0644) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, mode));
  STRATA_RETURN_IF_ERROR(WriteFull(fd.get(), std::span<const char>(data.data(), data.size())));
  return Check(::fchmod(fd.get(), mode), StrCat("chmod ", path));
}

Status SetXattr(const std::string& path, const std::string& name, std::string_view value) {
  return Check(::lsetxattr(path.c_str(), name.c_str(), value.data(), value.size(), 0),
               StrCat("setxattr ", name, " on ", path));
}

std::string Join2(const std::string& a, const std::string& b) { return a + "/" + b; }

// Sets every mtime (deterministic, with nanoseconds) bottom-up, so that
// creating children never disturbs a parent's time afterwards.
Status SetTimes(const std::string& path, uint64_t* counter) {
  struct stat st;
  STRATA_RETURN_IF_ERROR(Check(::lstat(path.c_str(), &st), StrCat("lstat ", path)));
  if (S_ISDIR(st.st_mode)) {
    DIR* d = ::opendir(path.c_str());
    if (!d) return ErrnoError(errno, StrCat("opendir ", path));
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& n : names) STRATA_RETURN_IF_ERROR(SetTimes(Join2(path, n), counter));
  }
  uint64_t i = (*counter)++;
  struct timespec ts[2];
  ts[0].tv_sec = 1500000000;
  ts[0].tv_nsec = 0;
  ts[1].tv_sec = static_cast<time_t>(1500000000 + i * 7919);
  ts[1].tv_nsec = static_cast<long>((i * 123456791) % 1000000000);
  if (path.ends_with("/old")) ts[1].tv_sec = -1000000;  // before 1970
  return Check(::utimensat(AT_FDCWD, path.c_str(), ts, AT_SYMLINK_NOFOLLOW), StrCat("utimensat ", path));
}

struct SourceEntry {
  struct stat st;
  std::string target;
  std::map<std::string, std::string> xattrs;
  std::vector<std::string> children;
};

std::map<std::string, std::string> ListSourceXattrs(const std::string& path) {
  std::map<std::string, std::string> out;
  ssize_t n = ::llistxattr(path.c_str(), nullptr, 0);
  if (n <= 0) return out;
  std::string names(static_cast<size_t>(n), '\0');
  n = ::llistxattr(path.c_str(), names.data(), names.size());
  if (n <= 0) return out;
  names.resize(static_cast<size_t>(n));
  size_t pos = 0;
  while (pos < names.size()) {
    std::string name = names.c_str() + pos;
    pos += name.size() + 1;
    ssize_t vn = ::lgetxattr(path.c_str(), name.c_str(), nullptr, 0);
    std::string value(vn > 0 ? static_cast<size_t>(vn) : 0, '\0');
    if (vn > 0) vn = ::lgetxattr(path.c_str(), name.c_str(), value.data(), value.size());
    if (vn >= 0) {
      value.resize(static_cast<size_t>(vn));
      out[name] = value;
    }
  }
  return out;
}

void ScanSource(const std::string& root, const std::string& rel, std::map<std::string, SourceEntry>* out) {
  std::string path = rel == "/" ? root : root + rel;
  SourceEntry e;
  if (::lstat(path.c_str(), &e.st) != 0) {
    ADD_FAILURE() << "lstat " << path << ": " << strerror(errno);
    return;
  }
  e.xattrs = ListSourceXattrs(path);
  if (S_ISLNK(e.st.st_mode)) {
    char buf[8192];
    ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
    if (n >= 0) e.target.assign(buf, static_cast<size_t>(n));
  }
  if (S_ISDIR(e.st.st_mode)) {
    DIR* d = ::opendir(path.c_str());
    if (d) {
      while (dirent* de = ::readdir(d)) {
        std::string n = de->d_name;
        if (n != "." && n != "..") e.children.push_back(n);
      }
      ::closedir(d);
    }
    std::sort(e.children.begin(), e.children.end());
  }
  std::vector<std::string> children = e.children;
  (*out)[rel] = std::move(e);
  for (const auto& c : children) ScanSource(root, rel == "/" ? "/" + c : rel + "/" + c, out);
}

FileType TypeOf(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFDIR: return FileType::kDirectory;
    case S_IFLNK: return FileType::kSymlink;
    case S_IFCHR: return FileType::kCharDevice;
    case S_IFBLK: return FileType::kBlockDevice;
    case S_IFIFO: return FileType::kFifo;
    case S_IFSOCK: return FileType::kSocket;
    default: return FileType::kRegular;
  }
}

std::string ReadThrough(const Image& image, const Inode& inode, size_t piece) {
  std::string out;
  std::string buf(piece, '\0');
  uint64_t off = 0;
  while (true) {
    auto n = image.Read(inode, off, std::span<char>(buf));
    if (!n.ok()) {
      ADD_FAILURE() << "read nid " << inode.nid << " at " << off << ": " << n.status().ToString();
      return out;
    }
    if (*n == 0) break;
    out.append(buf.data(), *n);
    off += *n;
  }
  return out;
}

}  // namespace

bool HaveMkfs() {
  auto r = RunCommand({.argv = {"mkfs.erofs", "--help"}});
  return r.ok() && r->exit_code != 127 && r->exit_code != -1;
}

Result<TreeFeatures> BuildRichTree(const std::string& root) {
  TreeFeatures f;
  auto p = [&](const std::string& rel) { return root + "/" + rel; };
  STRATA_RETURN_IF_ERROR(MakeDirs(root));
  for (const char* d : {"files", "links", "special", "modes", "owners", "names", "xattrs", "wide", "empty-dir",
                        "deep"}) {
    STRATA_RETURN_IF_ERROR(MakeDirs(p(d)));
  }

  // Regular files of many sizes, incl. around block and chunk boundaries.
  STRATA_RETURN_IF_ERROR(WriteFile(p("files/empty"), ""));
  uint64_t seed = 1;
  for (size_t size : {size_t{1}, size_t{100}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{8191},
                      size_t{65536}, size_t{65537}, size_t{300001}}) {
    STRATA_RETURN_IF_ERROR(WriteFile(p(StrCat("files/size-", size)), strata::testing::RandomBytes(size, seed++)));
  }
  // More than several 1 MiB chunks, not a block multiple.
  STRATA_RETURN_IF_ERROR(WriteFile(p("files/multi-chunk"), strata::testing::RandomBytes((5 << 20) + 123, seed++)));
  // Repeating content: identical chunks inside one file and across files.
  std::string block = strata::testing::RandomBytes(65536, seed++);
  std::string repeated;
  for (int i = 0; i < 20; ++i) repeated += block;
  STRATA_RETURN_IF_ERROR(WriteFile(p("files/repeated"), repeated));
  STRATA_RETURN_IF_ERROR(WriteFile(p("files/repeated-copy"), repeated));
  // Sparse: data, a hole, data, a hole to the end.
  {
    STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(p("files/sparse"), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    std::string a = strata::testing::RandomBytes(5000, seed++);
    STRATA_RETURN_IF_ERROR(PwriteFull(fd.get(), std::span<const char>(a.data(), a.size()), 0));
    STRATA_RETURN_IF_ERROR(PwriteFull(fd.get(), std::span<const char>(a.data(), a.size()), 1500000));
    STRATA_RETURN_IF_ERROR(Check(::ftruncate(fd.get(), 3 << 20), "truncate sparse"));
  }
  STRATA_RETURN_IF_ERROR(WriteFile(p("files/text"), "hello erofs\n"));

  // Hardlinks across directories.
  STRATA_RETURN_IF_ERROR(WriteFile(p("links/target"), strata::testing::RandomBytes(10000, seed++)));
  STRATA_RETURN_IF_ERROR(Check(::link(p("links/target").c_str(), p("links/hard1").c_str()), "link"));
  STRATA_RETURN_IF_ERROR(Check(::link(p("links/target").c_str(), p("files/hard2").c_str()), "link"));
  STRATA_RETURN_IF_ERROR(WriteFile(p("links/small"), "tiny"));
  STRATA_RETURN_IF_ERROR(Check(::link(p("links/small").c_str(), p("links/small-link").c_str()), "link"));
  // Symlinks: relative, absolute, dangling, long (4095 bytes, the most
  // PATH_MAX allows), to a directory.
  STRATA_RETURN_IF_ERROR(Check(::symlink("target", p("links/rel").c_str()), "symlink"));
  STRATA_RETURN_IF_ERROR(Check(::symlink("/usr/bin/env", p("links/abs").c_str()), "symlink"));
  STRATA_RETURN_IF_ERROR(Check(::symlink("does/not/exist", p("links/dangling").c_str()), "symlink"));
  STRATA_RETURN_IF_ERROR(Check(::symlink("../files", p("links/dir").c_str()), "symlink"));
  {
    std::string longt;
    while (longt.size() < 4095) longt += "segment-of-a-long-link/";
    longt.resize(4095);
    STRATA_RETURN_IF_ERROR(Check(::symlink(longt.c_str(), p("links/long").c_str()), "symlink"));
    std::string mid(300, 'm');
    STRATA_RETURN_IF_ERROR(Check(::symlink(mid.c_str(), p("links/mid").c_str()), "symlink"));
  }

  // Special files.
  STRATA_RETURN_IF_ERROR(Check(::mkfifo(p("special/fifo").c_str(), 0640), "mkfifo"));
  STRATA_RETURN_IF_ERROR(ListenUnix(p("special/sock"), 0755).status());
  if (::mknod(p("special/null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    f.devices = true;
    STRATA_RETURN_IF_ERROR(Check(::mknod(p("special/sda").c_str(), S_IFBLK | 0660, makedev(8, 0)), "mknod"));
    // A large major and minor exercise every bit of the encoding.
    STRATA_RETURN_IF_ERROR(
        Check(::mknod(p("special/big").c_str(), S_IFCHR | 0600, makedev(4000, (1 << 20) - 3)), "mknod"));
  }

  // Mode bits.
  struct { const char* name; mode_t mode; } modes[] = {
      {"setuid", 04755}, {"setgid", 02711}, {"sticky-file", 01644}, {"none", 0},
      {"all", 07777},    {"exec", 0755},    {"private", 0600},
  };
  for (const auto& m : modes) {
    STRATA_RETURN_IF_ERROR(WriteFile(p(StrCat("modes/", m.name)), m.name));
    STRATA_RETURN_IF_ERROR(Check(::chmod(p(StrCat("modes/", m.name)).c_str(), m.mode), "chmod"));
  }
  STRATA_RETURN_IF_ERROR(MakeDirs(p("modes/sticky-dir")));
  STRATA_RETURN_IF_ERROR(Check(::chmod(p("modes/sticky-dir").c_str(), 01777), "chmod"));
  STRATA_RETURN_IF_ERROR(MakeDirs(p("modes/setgid-dir")));
  STRATA_RETURN_IF_ERROR(Check(::chmod(p("modes/setgid-dir").c_str(), 02775), "chmod"));

  // Owners, including ids that need extended inodes.
  struct { const char* name; uid_t uid; gid_t gid; } owners[] = {
      {"root", 0, 0},        {"user", 1000, 1000},         {"nobody", 65534, 65534},
      {"big", 100000, 100001}, {"huge", 4000000000u, 3000000000u}, {"mixed", 5, 70000},
  };
  for (const auto& o : owners) {
    std::string path = p(StrCat("owners/", o.name));
    STRATA_RETURN_IF_ERROR(WriteFile(path, o.name));
    if (::lchown(path.c_str(), o.uid, o.gid) == 0) f.owners = true;
  }
  if (f.owners) {
    STRATA_RETURN_IF_ERROR(Check(::symlink("root", p("owners/link").c_str()), "symlink"));
    (void)::lchown(p("owners/link").c_str(), 1234, 5678);
    (void)::lchown(p("owners").c_str(), 100000, 100000);
  }

  // Names: long, odd bytes, every byte but '/' and NUL.
  // mkfs.erofs 1.5 cuts names at 254 bytes (NAME_MAX is 255): the longest
  // name it stores intact.
  STRATA_RETURN_IF_ERROR(WriteFile(p("names/" + std::string(254, 'L')), "longest name"));
  for (const char* n : {"with space", "new\nline", "tab\tchar", "-dash", "UPPER", "ünïcødé", "back\\slash",
                        "quote\"'", "...", ".hidden", "~tilde", "a", "b", "A"}) {
    STRATA_RETURN_IF_ERROR(WriteFile(p(StrCat("names/", n)), n));
  }
  {
    std::string all;
    for (int c = 1; c < 256; ++c) {
      if (c != '/') all.push_back(static_cast<char>(c));
    }
    for (size_t i = 0; i < all.size(); i += 60) {
      std::string name = "bytes-" + all.substr(i, 60);
      STRATA_RETURN_IF_ERROR(WriteFile(p("names/" + name), name));
    }
  }

  // Xattrs: unique inline ones, ones shared by many inodes, odd names,
  // large values, on files, directories and symlinks.
  for (int i = 0; i < 24; ++i) {
    std::string path = p(StrCat("xattrs/f", i));
    STRATA_RETURN_IF_ERROR(WriteFile(path, StrCat("file ", i)));
    STRATA_RETURN_IF_ERROR(SetXattr(path, "user.common", "shared by every file"));
    STRATA_RETURN_IF_ERROR(SetXattr(path, "user.mime_type", i % 2 ? "text/plain" : "application/octet-stream"));
    STRATA_RETURN_IF_ERROR(SetXattr(path, StrCat("user.unique", i), StrCat("value-", i)));
    if (i % 3 == 0) STRATA_RETURN_IF_ERROR(SetXattr(path, "user.empty", ""));
  }
  {
    std::string path = p("xattrs/many");
    STRATA_RETURN_IF_ERROR(WriteFile(path, "many xattrs"));
    for (int i = 0; i < 40; ++i) {
      STRATA_RETURN_IF_ERROR(SetXattr(path, StrCat("user.attr-", i), std::string(static_cast<size_t>(i), 'v')));
    }
    std::string odd = "user.odd ";
    odd += "\x01\x7f\xc3\xa9\xff name";
    STRATA_RETURN_IF_ERROR(SetXattr(p("xattrs/f1"), odd, std::string("\0binary\0value\xff", 14)));
    STRATA_RETURN_IF_ERROR(SetXattr(p("xattrs/f2"), "user." + std::string(240, 'n'), "long name"));
    STRATA_RETURN_IF_ERROR(SetXattr(p("xattrs/f3"), "user.big", strata::testing::RandomBytes(3000, 99)));
    STRATA_RETURN_IF_ERROR(SetXattr(p("xattrs"), "user.on-dir", "dir value"));
  }
  if (SetXattr(p("xattrs/f4"), "trusted.overlay.opaque", "y").ok()) {
    f.trusted_xattrs = true;
    for (const char* d : {"wide", "empty-dir", "deep", "modes", "xattrs"}) {
      STRATA_RETURN_IF_ERROR(SetXattr(p(d), "trusted.overlay.opaque", "y"));
    }
    STRATA_RETURN_IF_ERROR(SetXattr(p("links/rel"), "trusted.on-symlink", "ok"));
    STRATA_RETURN_IF_ERROR(SetXattr(p("links/hard1"), "trusted.overlay.origin", std::string("\0\x01\x02", 3)));
  }
  {
    // security.capability v2: cap_net_bind_service permitted.
    std::string cap("\x00\x00\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 20);
    if (SetXattr(p("xattrs/f5"), "security.capability", cap).ok()) {
      f.capabilities = true;
      for (int i : {6, 7, 8}) STRATA_RETURN_IF_ERROR(SetXattr(p(StrCat("xattrs/f", i)), "security.capability", cap));
    }
  }

  // A wide directory spanning many blocks, and a deep one.
  for (int i = 0; i < 2000; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "entry-%05d-%s", (i * 7919) % 2000, i % 3 ? "padding-padding" : "x");
    STRATA_RETURN_IF_ERROR(WriteFile(p(StrCat("wide/", name)), i % 50 ? "" : name));
  }
  {
    std::string d = p("deep");
    for (int i = 0; i < 48; ++i) {
      d += StrCat("/level-", i);
      STRATA_RETURN_IF_ERROR(MakeDirs(d));
    }
    STRATA_RETURN_IF_ERROR(WriteFile(d + "/bottom", "at the bottom"));
  }
  STRATA_RETURN_IF_ERROR(WriteFile(p("old"), "from before 1970"));

  uint64_t counter = 0;
  STRATA_RETURN_IF_ERROR(SetTimes(root, &counter));
  return f;
}

namespace {
std::string LongPrefixTable();
}  // namespace

Status BuildSmallTree(const std::string& root) {
  STRATA_RETURN_IF_ERROR(MakeDirs(root + "/dir"));
  STRATA_RETURN_IF_ERROR(WriteFile(root + "/file", strata::testing::RandomBytes(20000, 5)));
  STRATA_RETURN_IF_ERROR(WriteFile(root + "/dir/inner", "inner file"));
  STRATA_RETURN_IF_ERROR(Check(::symlink("dir/inner", (root + "/link").c_str()), "symlink"));
  for (int i = 0; i < 4; ++i) {
    std::string path = root + StrCat("/x", i);
    STRATA_RETURN_IF_ERROR(WriteFile(path, StrCat("x", i)));
    STRATA_RETURN_IF_ERROR(SetXattr(path, "user.shared", "same on every x file"));
  }
  STRATA_RETURN_IF_ERROR(SetXattr(root + "/x0", "user.p1", "v1"));
  STRATA_RETURN_IF_ERROR(WriteFile(root + "/packed", LongPrefixTable()));
  uint64_t counter = 0;
  return SetTimes(root, &counter);
}

Result<BuiltImage> MakeImage(const std::string& src, const std::string& out_dir, const std::string& name,
                             const std::vector<std::string>& args, bool blobdev) {
  BuiltImage built;
  built.meta = out_dir + "/" + name + ".erofs";
  std::vector<std::string> argv = {"mkfs.erofs", "--quiet"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (blobdev) {
    built.blob = out_dir + "/" + name + ".blob";
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(built.blob, "", false));
    argv.push_back("--blobdev=" + built.blob);
  }
  argv.push_back(built.meta);
  argv.push_back(src);
  STRATA_RETURN_IF_ERROR(RunChecked({.argv = argv}, StrCat("mkfs.erofs ", name)).status());
  return built;
}

Result<std::unique_ptr<Image>> OpenImage(const BuiltImage& built) {
  STRATA_ASSIGN_OR_RETURN(auto meta, FileSource(built.meta));
  std::vector<std::shared_ptr<BlockSource>> devices;
  if (!built.blob.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto blob, FileSource(built.blob));
    devices.push_back(blob);
  }
  return Image::Open(meta, devices);
}

void CompareImageWithTree(const Image& image, const std::string& root, const CompareOptions& options) {
  std::map<std::string, SourceEntry> source;
  ScanSource(root, "/", &source);

  std::map<std::string, Inode> walked;
  Status walk = image.Walk([&](const std::string& path, const Inode& inode) -> Status {
    walked[path] = inode;
    return OkStatus();
  });
  ASSERT_TRUE(walk.ok()) << walk.ToString();

  std::set<std::string> source_paths, image_paths;
  for (const auto& [path, e] : source) source_paths.insert(path);
  for (const auto& [path, e] : walked) image_paths.insert(path);
  std::vector<std::string> only_source, only_image;
  std::set_difference(source_paths.begin(), source_paths.end(), image_paths.begin(), image_paths.end(),
                      std::back_inserter(only_source));
  std::set_difference(image_paths.begin(), image_paths.end(), source_paths.begin(), source_paths.end(),
                      std::back_inserter(only_image));
  EXPECT_TRUE(only_source.empty()) << "missing from the image: " << Join(only_source, ", ");
  EXPECT_TRUE(only_image.empty()) << "only in the image: " << Join(only_image, ", ");
  EXPECT_GT(image_paths.size(), 1u);

  std::vector<std::unique_ptr<BlockSource>> device_sources;
  std::vector<std::shared_ptr<BlockSource>> devices;
  for (const auto& d : options.device_paths) {
    auto s = FileSource(d);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    devices.push_back(*s);
  }

  std::map<std::pair<dev_t, ino_t>, uint64_t> source_to_nid;
  std::map<uint64_t, std::pair<dev_t, ino_t>> nid_to_source;
  std::mt19937_64 rng(42);

  for (const auto& [path, inode] : walked) {
    auto it = source.find(path);
    if (it == source.end()) continue;
    const SourceEntry& src = it->second;
    const struct stat& st = src.st;
    SCOPED_TRACE("path " + Quote(path) + " nid " + std::to_string(inode.nid));

    EXPECT_EQ(inode.type, TypeOf(st.st_mode));
    EXPECT_EQ(inode.mode, st.st_mode);
    EXPECT_EQ(inode.uid, options.forced_uid.value_or(st.st_uid));
    EXPECT_EQ(inode.gid, options.forced_gid.value_or(st.st_gid));
    if (inode.type != FileType::kDirectory || options.check_dir_nlink) {
      EXPECT_EQ(inode.nlink, st.st_nlink);
    }
    if (options.fixed_mtime) {
      EXPECT_EQ(inode.mtime, *options.fixed_mtime);
    } else if (inode.extended) {
      EXPECT_EQ(inode.mtime, st.st_mtim.tv_sec);
      EXPECT_EQ(inode.mtime_nsec, static_cast<uint32_t>(st.st_mtim.tv_nsec));
    } else {
      EXPECT_EQ(static_cast<uint64_t>(inode.mtime), image.info().build_time);
    }

    // Hardlink groups: one nid per source inode, and back.
    auto key = std::make_pair(st.st_dev, st.st_ino);
    if (inode.type != FileType::kDirectory) {
      auto [s2n, fresh] = source_to_nid.emplace(key, inode.nid);
      EXPECT_EQ(s2n->second, inode.nid) << "hardlinks split across nids";
      auto [n2s, fresh2] = nid_to_source.emplace(inode.nid, key);
      EXPECT_TRUE(n2s->second == key) << "distinct files share a nid";
      (void)fresh;
      (void)fresh2;
    }

    // Xattrs.
    auto xattrs = image.ListXattrs(inode);
    ASSERT_TRUE(xattrs.ok()) << xattrs.status().ToString();
    std::map<std::string, std::string> got;
    for (const auto& x : *xattrs) got[x.name] = x.value;
    EXPECT_EQ(got, src.xattrs);
    for (const auto& [name, value] : src.xattrs) {
      auto v = image.GetXattr(inode, name);
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      EXPECT_EQ(*v, value);
    }
    auto missing = image.GetXattr(inode, "user.no-such-xattr");
    EXPECT_EQ(missing.status().code(), ENODATA);

    switch (inode.type) {
      case FileType::kSymlink: {
        auto target = image.ReadLink(inode);
        ASSERT_TRUE(target.ok()) << target.status().ToString();
        EXPECT_EQ(*target, src.target);
        EXPECT_EQ(inode.size, src.target.size());
        break;
      }
      case FileType::kCharDevice:
      case FileType::kBlockDevice:
        EXPECT_EQ(major(inode.rdev), major(st.st_rdev));
        EXPECT_EQ(minor(inode.rdev), minor(st.st_rdev));
        break;
      case FileType::kDirectory: {
        auto entries = image.ReadDir(inode);
        ASSERT_TRUE(entries.ok()) << entries.status().ToString();
        std::vector<std::string> names;
        for (const auto& e : *entries) names.push_back(e.name);
        EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
        EXPECT_EQ(names, src.children);  // both in byte order
        for (const auto& e : *entries) {
          auto found = image.Lookup(inode, e.name);
          ASSERT_TRUE(found.ok()) << Quote(e.name) << ": " << found.status().ToString();
          EXPECT_EQ(found->nid, e.nid);
          EXPECT_EQ(found->type, e.type);
        }
        for (std::string absent : {std::string("\x01"), std::string("~~~~"), std::string("entry-0")}) {
          if (std::binary_search(names.begin(), names.end(), absent)) continue;
          EXPECT_EQ(image.Lookup(inode, absent).status().code(), ENOENT);
        }
        break;
      }
      case FileType::kRegular: {
        EXPECT_EQ(inode.size, static_cast<uint64_t>(st.st_size));
        std::string want;
        {
          auto r = ReadFileToString(root + (path == "/" ? "" : path));
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          want = std::move(*r);
        }
        std::string got_data = ReadThrough(image, inode, 65536 + 7);
        EXPECT_TRUE(got_data == want) << "content differs (" << got_data.size() << " vs " << want.size()
                                      << " bytes)";
        // Random reads, some crossing block and chunk boundaries.
        for (int i = 0; i < 8 && !want.empty(); ++i) {
          uint64_t off = rng() % want.size();
          size_t len = static_cast<size_t>(rng() % 20000) + 1;
          std::string buf(len, '\0');
          auto n = image.Read(inode, off, std::span<char>(buf));
          ASSERT_TRUE(n.ok()) << n.status().ToString();
          EXPECT_EQ(*n, std::min<uint64_t>(len, want.size() - off));
          EXPECT_TRUE(std::string_view(buf.data(), *n) == std::string_view(want).substr(off, *n))
              << "random read at " << off;
        }
        std::string past(10, 'x');
        auto n = image.Read(inode, want.size() + 5, std::span<char>(past));
        ASSERT_TRUE(n.ok());
        EXPECT_EQ(*n, 0u);

        auto extents = image.MapFile(inode);
        ASSERT_TRUE(extents.ok()) << extents.status().ToString();
        uint64_t next = 0;
        for (const Extent& e : *extents) {
          EXPECT_EQ(e.file_offset, next);
          EXPECT_GT(e.length, 0u);
          if (options.chunk_size) {
            EXPECT_LE(e.length, options.chunk_size);
            EXPECT_EQ(e.file_offset % options.chunk_size, 0u);
          }
          next = e.file_offset + e.length;
          if (e.hole) {
            EXPECT_EQ(std::string_view(want).substr(e.file_offset, e.length),
                      std::string(e.length, '\0'));
          } else if (e.device < devices.size()) {
            std::string bytes(e.length, '\0');
            auto got_n = devices[e.device]->ReadAt(e.physical, std::span<char>(bytes));
            ASSERT_TRUE(got_n.ok());
            EXPECT_EQ(*got_n, e.length);
            EXPECT_TRUE(bytes == std::string_view(want).substr(e.file_offset, e.length))
                << "extent at file offset " << e.file_offset << " on device " << e.device << " byte "
                << e.physical << " does not hold the file's bytes";
          }
        }
        EXPECT_EQ(next, want.size());
        break;
      }
      default:
        break;
    }
  }
}

std::string ReadAll(const std::string& path) {
  auto r = ReadFileToString(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::string();
}

void WriteAll(const std::string& path, const std::string& data) {
  Status s = WriteFileAtomic(path, data, false);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

void PutLe16(std::string& image, uint64_t offset, uint16_t v) {
  for (int i = 0; i < 2; ++i) image[offset + i] = static_cast<char>(v >> (8 * i));
}
void PutLe32(std::string& image, uint64_t offset, uint32_t v) {
  for (int i = 0; i < 4; ++i) image[offset + i] = static_cast<char>(v >> (8 * i));
}
void PutLe64(std::string& image, uint64_t offset, uint64_t v) {
  for (int i = 0; i < 8; ++i) image[offset + i] = static_cast<char>(v >> (8 * i));
}
uint16_t GetLe16(const std::string& image, uint64_t offset) {
  return static_cast<uint16_t>(static_cast<uint8_t>(image[offset]) | static_cast<uint8_t>(image[offset + 1]) << 8);
}
uint32_t GetLe32(const std::string& image, uint64_t offset) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(image[offset + i]);
  return v;
}

void FixChecksum(std::string& image) {
  const uint64_t sb = kSuperOffset;
  if (image.size() < sb + sizeof(SuperBlock)) return;
  if (!(GetLe32(image, sb + offsetof(SuperBlock, feature_compat)) & kCompatSbChecksum)) return;
  uint64_t blksz = 1ULL << static_cast<uint8_t>(image[sb + offsetof(SuperBlock, blkszbits)]);
  uint64_t len = blksz > kSuperOffset ? blksz - kSuperOffset : blksz;
  PutLe32(image, sb + offsetof(SuperBlock, checksum), 0);
  PutLe32(image, sb + offsetof(SuperBlock, checksum), Crc32c(~0u, std::string_view(image).substr(sb, len)));
}

uint64_t DirDataOffset(const Image& image, const Inode& dir) {
  const uint64_t blksz = image.info().block_size;
  if (dir.layout == DataLayout::kFlatInline && dir.size <= blksz) {
    return dir.meta_offset + dir.inode_size + dir.xattr_size;
  }
  return uint64_t{dir.start_block} * blksz;
}

namespace {

// The long prefix table BuildSmallTree's /packed file holds, and that
// MakeLongPrefixImage appends: trusted. + "overlay.", user. + "long.prefix.".
std::string LongPrefixTable() {
  std::string table;
  for (const auto& [base, infix] : {std::pair<uint8_t, std::string>{kXattrIndexTrusted, "overlay."},
                                    std::pair<uint8_t, std::string>{kXattrIndexUser, "long.prefix."}}) {
    std::string entry(2, '\0');
    PutLe16(entry, 0, static_cast<uint16_t>(1 + infix.size()));
    entry.push_back(static_cast<char>(base));
    entry += infix;
    entry.resize((entry.size() + 3) / 4 * 4, '\0');
    table += entry;
  }
  return table;
}

// Points /x0's inline "user.p1" at long prefix 0 and the shared
// "user.shared" at long prefix 1.
Status UseLongPrefixes(std::string& bytes) {
  STRATA_ASSIGN_OR_RETURN(auto image, Image::Open(MemorySource(bytes)));
  STRATA_ASSIGN_OR_RETURN(Inode x0, image->LookupPath("/x0"));
  const uint64_t blksz = image->info().block_size;
  if (x0.xattr_size == 0 || x0.xattr_shared_count == 0) {
    return Error(EINVAL, "mkfs.erofs did not give /x0 both inline and shared xattrs");
  }
  // Inline entries follow the header and the shared ids.
  const uint64_t area = x0.meta_offset + x0.inode_size;
  const uint64_t end = area + x0.xattr_size;
  bool patched_inline = false;
  for (uint64_t pos = area + 12 + 4 * uint64_t{x0.xattr_shared_count}; pos + 4 <= end;) {
    uint8_t name_len = static_cast<uint8_t>(bytes[pos]);
    uint8_t index = static_cast<uint8_t>(bytes[pos + 1]);
    uint16_t value_len = GetLe16(bytes, pos + 2);
    if (index == kXattrIndexUser && std::string_view(bytes).substr(pos + 4, name_len) == "p1") {
      bytes[pos + 1] = static_cast<char>(kXattrLongPrefix | 0);
      patched_inline = true;
    }
    pos += (4 + name_len + value_len + 3) / 4 * 4;
  }
  // The shared entry named by /x0's first shared id.
  const uint32_t id = GetLe32(bytes, area + 12);
  const uint64_t shared = uint64_t{image->info().xattr_blkaddr} * blksz + uint64_t{id} * 4;
  if (!patched_inline || bytes[shared + 1] != kXattrIndexUser ||
      std::string_view(bytes).substr(shared + 4, 6) != "shared") {
    return Error(EINVAL, "unexpected xattr layout in the mkfs.erofs image");
  }
  bytes[shared + 1] = static_cast<char>(kXattrLongPrefix | 1);
  return OkStatus();
}

void SetPrefixTable(std::string& bytes, uint64_t start, uint32_t extra_incompat) {
  const uint64_t sb = kSuperOffset;
  bytes[sb + offsetof(SuperBlock, xattr_prefix_count)] = 2;
  PutLe32(bytes, sb + offsetof(SuperBlock, xattr_prefix_start), static_cast<uint32_t>(start / 4));
  PutLe32(bytes, sb + offsetof(SuperBlock, feature_incompat),
          GetLe32(bytes, sb + offsetof(SuperBlock, feature_incompat)) | kIncompatXattrPrefixes | extra_incompat);
}

}  // namespace

Result<BuiltImage> MakeLongPrefixImage(const std::string& src, const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(BuiltImage built, MakeImage(src, dir, "long-prefix", {}, false));
  std::string bytes = ReadAll(built.meta);
  STRATA_RETURN_IF_ERROR(UseLongPrefixes(bytes));
  // The table goes into a new block at the end of the image.
  const uint64_t blksz = 1ULL << static_cast<uint8_t>(bytes[kSuperOffset + offsetof(SuperBlock, blkszbits)]);
  const uint64_t table = bytes.size();
  std::string entries = LongPrefixTable();
  bytes += entries;
  bytes.resize(table + blksz, '\0');
  SetPrefixTable(bytes, table, 0);
  PutLe32(bytes, kSuperOffset + offsetof(SuperBlock, blocks_lo), static_cast<uint32_t>(bytes.size() / blksz));
  FixChecksum(bytes);
  WriteAll(built.meta, bytes);
  return built;
}

Result<BuiltImage> MakePackedPrefixImage(const std::string& src, const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(BuiltImage built, MakeImage(src, dir, "packed-prefix", {}, false));
  std::string bytes = ReadAll(built.meta);
  STRATA_ASSIGN_OR_RETURN(auto image, Image::Open(MemorySource(bytes)));
  STRATA_ASSIGN_OR_RETURN(Inode packed, image->LookupPath("/packed"));
  STRATA_RETURN_IF_ERROR(UseLongPrefixes(bytes));
  PutLe64(bytes, kSuperOffset + offsetof(SuperBlock, packed_nid), packed.nid);
  SetPrefixTable(bytes, 0, kIncompatFragments);
  FixChecksum(bytes);
  WriteAll(built.meta, bytes);
  return built;
}

Result<BuiltImage> MakeChunkHoleImage(const std::string& src, const std::string& dir, bool blobdev) {
  STRATA_ASSIGN_OR_RETURN(BuiltImage built,
                          MakeImage(src, dir, blobdev ? "hole-blob" : "hole", {"--chunksize=4096"}, blobdev));
  std::string bytes = ReadAll(built.meta);
  STRATA_ASSIGN_OR_RETURN(auto image, Image::Open(MemorySource(bytes)));
  STRATA_ASSIGN_OR_RETURN(Inode file, image->LookupPath("/file"));
  if (file.layout != DataLayout::kChunkBased || file.chunk_bits != 12) {
    return Error(EINVAL, "mkfs.erofs did not make /file chunk-based with 4 KiB chunks");
  }
  const uint64_t unit = file.chunk_indexes ? 8 : 4;
  const uint64_t table = (file.meta_offset + file.inode_size + file.xattr_size + unit - 1) / unit * unit;
  // Chunk 1's block address (the low 32 bits of an 8-byte index).
  PutLe32(bytes, table + unit * 1 + (file.chunk_indexes ? 4 : 0), kNullAddr);
  FixChecksum(bytes);
  WriteAll(built.meta, bytes);
  return built;
}

}  // namespace strata::erofs::testing
