// Rich test trees and tree snapshots.
#include "tests/testing/tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include "common/fs.h"
#include "common/hash.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "common/unix_socket.h"
#include "tests/testing/test_util.h"

namespace strata::testing {
namespace {

// Linux's longest name (NAME_MAX); strata's image writer keeps it whole.
constexpr size_t kLongestName = 255;

Status Check(int rc, std::string_view what) {
  return rc == 0 ? OkStatus() : ErrnoError(errno, StrCat("rich tree: ", what));
}

Status WriteAt(const std::string& path, const std::string& data, uint64_t offset = 0) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT, 0644));
  return PwriteFull(fd.get(), data, offset);
}

Status SetTimes(const std::string& path, int64_t sec, long nsec) {
  timespec t[2] = {{sec, nsec}, {sec, nsec}};
  return Check(::utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW), "utimensat " + path);
}

}  // namespace

Status MakeRichTree(const std::string& root, const RichTreeOptions& options) {
  std::mt19937_64 rng(options.seed);
  auto p = [&](std::string_view rel) { return JoinPath(root, rel); };
  constexpr uint64_t kMiB = 1 << 20;

  // Regular files of awkward sizes.
  for (const auto& dir : {"files", "deep", "dev", "links", "modes", "owners", "xattrs", "names", "opaque"}) {
    STRATA_RETURN_IF_ERROR(MakeDirs(p(dir)));
  }
  const std::vector<uint64_t> sizes = {0, 1, 100, 4095, 4096, 4097, 65536, kMiB - 1, kMiB, kMiB + 1, 3 * kMiB + 12345};
  for (uint64_t s : sizes) STRATA_RETURN_IF_ERROR(WriteAt(p(StrCat("files/size-", s)), RandomBytes(s, options.seed + s)));
  STRATA_RETURN_IF_ERROR(WriteAt(p("files/copy-a"), RandomBytes(2 * kMiB, 77)));
  STRATA_RETURN_IF_ERROR(WriteAt(p("files/copy-b"), RandomBytes(2 * kMiB, 77)));  // identical content
  STRATA_RETURN_IF_ERROR(WriteAt(p("files/zeros"), std::string(kMiB + 10, '\0')));
  // Sparse: holes around data, and (optionally) past 4 GiB.
  STRATA_RETURN_IF_ERROR(WriteAt(p("files/sparse"), "middle", 5 * kMiB));
  STRATA_RETURN_IF_ERROR(Check(::truncate(p("files/sparse").c_str(), 9 * kMiB), "truncate sparse"));
  if (options.large_sparse_file) {
    STRATA_RETURN_IF_ERROR(WriteAt(p("files/large"), "head"));
    STRATA_RETURN_IF_ERROR(WriteAt(p("files/large"), "beyond-4GiB", (4ull << 30) + 12345));
  }

  // Hardlinks.
  STRATA_RETURN_IF_ERROR(WriteAt(p("links/original"), "shared inode"));
  STRATA_RETURN_IF_ERROR(Check(::link(p("links/original").c_str(), p("links/hard-1").c_str()), "link"));
  STRATA_RETURN_IF_ERROR(Check(::link(p("links/original").c_str(), p("files/hard-2").c_str()), "link"));
  // Symlinks.
  STRATA_RETURN_IF_ERROR(Check(::symlink("original", p("links/relative").c_str()), "symlink"));
  STRATA_RETURN_IF_ERROR(Check(::symlink("/usr/bin/python3", p("links/absolute").c_str()), "symlink"));
  STRATA_RETURN_IF_ERROR(Check(::symlink("does/not/exist", p("links/dangling").c_str()), "symlink"));
  STRATA_RETURN_IF_ERROR(Check(::symlink(std::string(1000, 'x').c_str(), p("links/long-target").c_str()), "symlink"));
  STRATA_RETURN_IF_ERROR(Check(::symlink("../files", p("links/to-dir").c_str()), "symlink"));

  // Devices, FIFO, socket.
  STRATA_RETURN_IF_ERROR(Check(::mknod(p("dev/null").c_str(), S_IFCHR | 0666, makedev(1, 3)), "mknod"));
  STRATA_RETURN_IF_ERROR(Check(::mknod(p("dev/loop9").c_str(), S_IFBLK | 0660, makedev(7, 9)), "mknod"));
  STRATA_RETURN_IF_ERROR(Check(::mknod(p("dev/whiteout").c_str(), S_IFCHR | 0, makedev(0, 0)), "mknod"));
  STRATA_RETURN_IF_ERROR(Check(::mkfifo(p("dev/fifo").c_str(), 0620), "mkfifo"));
  STRATA_RETURN_IF_ERROR(ListenUnix(p("dev/socket"), 0755).status().Annotate("rich tree"));

  // Modes and owners.
  struct ModeFile {
    const char* name;
    mode_t mode;
  };
  for (const auto& m : {ModeFile{"setuid", 04755}, ModeFile{"setgid", 02711}, ModeFile{"none", 0},
                        ModeFile{"world", 0777}, ModeFile{"all-bits", 07777}}) {
    STRATA_RETURN_IF_ERROR(WriteAt(p(StrCat("modes/", m.name)), m.name));
    STRATA_RETURN_IF_ERROR(Check(::chmod(p(StrCat("modes/", m.name)).c_str(), m.mode), "chmod"));
  }
  STRATA_RETURN_IF_ERROR(MakeDirs(p("modes/sticky")));
  STRATA_RETURN_IF_ERROR(Check(::chmod(p("modes/sticky").c_str(), 01777), "chmod"));
  struct Owner {
    uid_t uid;
    gid_t gid;
  };
  for (const auto& o : {Owner{0, 0}, Owner{1000, 1001}, Owner{65534, 65534}, Owner{100000, 165535}}) {
    std::string f = p(StrCat("owners/", o.uid, "-", o.gid));
    STRATA_RETURN_IF_ERROR(WriteAt(f, "owned"));
    STRATA_RETURN_IF_ERROR(Check(::lchown(f.c_str(), o.uid, o.gid), "lchown"));
  }
  STRATA_RETURN_IF_ERROR(Check(::symlink("0-0", p("owners/link-owned").c_str()), "symlink"));
  STRATA_RETURN_IF_ERROR(Check(::lchown(p("owners/link-owned").c_str(), 1000, 1000), "lchown symlink"));
  // setuid after chown (chown clears it).
  STRATA_RETURN_IF_ERROR(Check(::chmod(p("owners/1000-1001").c_str(), 06750), "chmod"));

  // Xattrs: many files share some (EROFS shares those), others are unique.
  for (int i = 0; i < 8; ++i) {
    std::string f = p(StrCat("xattrs/f", i));
    STRATA_RETURN_IF_ERROR(WriteAt(f, StrCat("x", i)));
    STRATA_RETURN_IF_ERROR(Check(::lsetxattr(f.c_str(), "user.shared", "same-value", 10, 0), "setxattr"));
    std::string unique = StrCat("unique-", i, std::string(static_cast<size_t>(i) * 50, 'u'));
    STRATA_RETURN_IF_ERROR(Check(::lsetxattr(f.c_str(), "user.unique", unique.data(), unique.size(), 0), "setxattr"));
    STRATA_RETURN_IF_ERROR(Check(::lsetxattr(f.c_str(), "trusted.strata.test", "t", 1, 0), "setxattr"));
  }
  std::string big_value = RandomBytes(1000, 5);
  STRATA_RETURN_IF_ERROR(Check(::lsetxattr(p("xattrs/f0").c_str(), "user.big", big_value.data(), big_value.size(), 0), "setxattr"));
  STRATA_RETURN_IF_ERROR(Check(::lsetxattr(p("xattrs/f1").c_str(), "user.empty", "", 0, 0), "setxattr"));
  // security.capability v2: cap_net_bind_service permitted+effective.
  const unsigned char cap[20] = {0x01, 0x00, 0x00, 0x02, 0x00, 0x04, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  STRATA_RETURN_IF_ERROR(WriteAt(p("xattrs/capable"), "cap"));
  STRATA_RETURN_IF_ERROR(Check(::lsetxattr(p("xattrs/capable").c_str(), "security.capability", cap, sizeof cap, 0), "setxattr"));
  STRATA_RETURN_IF_ERROR(Check(::lsetxattr(p("opaque").c_str(), "trusted.overlay.opaque", "y", 1, 0), "setxattr"));
  STRATA_RETURN_IF_ERROR(Check(::lsetxattr(p("links/absolute").c_str(), "trusted.strata.on-symlink", "s", 1, 0), "setxattr symlink"));

  // Names: odd bytes, 255 bytes, leading dash, dots.
  for (std::string name : {std::string("with space"), std::string("new\nline"), std::string("tab\there"),
                           std::string("\x01\x02\x7f"), std::string("\xff\xfe binary"), std::string("ünïcødé-名前"),
                           std::string("-leading-dash"), std::string(".hidden"), std::string("..."),
                           std::string(kLongestName, 'n'), std::string("back\\slash"), std::string("*?[glob]")}) {
    STRATA_RETURN_IF_ERROR(WriteAt(p("names/" + name), name));
  }

  // Deep and wide directories.
  std::string deep = p("deep");
  for (int i = 0; i < 40; ++i) deep += StrCat("/d", i);
  STRATA_RETURN_IF_ERROR(MakeDirs(deep));
  STRATA_RETURN_IF_ERROR(WriteAt(deep + "/bottom", "deep"));
  STRATA_RETURN_IF_ERROR(MakeDirs(p("empty-dir")));
  if (options.wide_directory) {
    STRATA_RETURN_IF_ERROR(MakeDirs(p("wide")));
    for (int i = 0; i < 1200; ++i) STRATA_RETURN_IF_ERROR(WriteAt(p(StrCat("wide/entry-", i, "-", std::string(static_cast<size_t>(i % 60), 'w'))), ""));
  }

  // Nanosecond mtimes on everything, directories last and deepest first.
  std::vector<std::string> dirs;
  std::function<Status(const std::string&)> stamp = [&](const std::string& dir) -> Status {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return ErrnoError(errno, "opendir " + dir);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
    for (const auto& n : names) {
      std::string path = dir + "/" + n;
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0) return ErrnoError(errno, "lstat " + path);
      if (S_ISDIR(st.st_mode)) {
        STRATA_RETURN_IF_ERROR(stamp(path));
        dirs.push_back(path);
      } else {
        STRATA_RETURN_IF_ERROR(SetTimes(path, 1500000000 + static_cast<int64_t>(rng() % 100000000), static_cast<long>(rng() % 1000000000)));
      }
    }
    return OkStatus();
  };
  STRATA_RETURN_IF_ERROR(stamp(root));
  for (const auto& d : dirs) STRATA_RETURN_IF_ERROR(SetTimes(d, 1600000000 + static_cast<int64_t>(rng() % 1000), static_cast<long>(rng() % 1000000000)));
  return SetTimes(root, 1700000000, 42);
}

namespace {

Result<std::map<std::string, std::string>> ReadXattrs(const std::string& path, const SnapshotOptions& options) {
  std::map<std::string, std::string> out;
  std::vector<char> names(65536);
  ssize_t n = ::llistxattr(path.c_str(), names.data(), names.size());
  if (n < 0) {
    if (errno == ENOTSUP) return out;
    return ErrnoError(errno, "llistxattr " + path);
  }
  for (size_t i = 0; i < static_cast<size_t>(n);) {
    std::string name(names.data() + i);
    i += name.size() + 1;
    bool ignored = false;
    for (const auto& prefix : options.ignore_xattr_prefixes) ignored |= name.starts_with(prefix);
    if (ignored) continue;
    std::vector<char> value(65536);
    ssize_t v = ::lgetxattr(path.c_str(), name.c_str(), value.data(), value.size());
    if (v < 0) return ErrnoError(errno, "lgetxattr " + name + " of " + path);
    out[name] = std::string(value.data(), static_cast<size_t>(v));
  }
  return out;
}

Result<std::string> HashFileContent(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY | O_NOFOLLOW));
  // Holes are skipped without reading them.
  ContentHasher h;
  std::vector<char> buf(1 << 20);
  uint64_t off = 0;
  while (true) {
    off_t data = ::lseek(fd.get(), static_cast<off_t>(off), SEEK_DATA);
    if (data < 0) break;  // ENXIO: only a hole remains
    h.Zeros(static_cast<uint64_t>(data) - off);
    off = static_cast<uint64_t>(data);
    STRATA_ASSIGN_OR_RETURN(size_t n, PreadFull(fd.get(), buf, off));
    if (n == 0) break;
    h.Update(std::string_view(buf.data(), n));
    off += n;
  }
  struct stat st;
  if (::fstat(fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_size) > off) h.Zeros(static_cast<uint64_t>(st.st_size) - off);
  return h.Finish();
}

}  // namespace

void ContentHasher::FlushZeros() {
  if (zeros_) hasher_.Update(StrCat("<", zeros_, " zeros>"));
  zeros_ = 0;
}

void ContentHasher::Update(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    size_t j = i;
    while (j < bytes.size() && bytes[j] == 0) ++j;
    zeros_ += j - i;
    size_t k = j;
    while (k < bytes.size() && bytes[k] != 0) ++k;
    if (k > j) {
      FlushZeros();
      hasher_.Update(bytes.substr(j, k - j));
    }
    i = k;
  }
}

std::string ContentHasher::Finish() {
  FlushZeros();
  return hasher_.Finish().Hex();
}

std::string ContentHash(std::string_view bytes) {
  ContentHasher h;
  h.Update(bytes);
  return h.Finish();
}

Result<TreeSnapshot> SnapshotTree(const std::string& root, const SnapshotOptions& options) {
  TreeSnapshot snap;
  std::map<std::pair<dev_t, ino_t>, std::string> inodes;
  std::function<Status(const std::string&)> walk = [&](const std::string& rel) -> Status {
    std::string path = rel == "." ? root : root + "/" + rel;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return ErrnoError(errno, "lstat " + path);
    NodeInfo info;
    info.mode = st.st_mode;
    info.uid = st.st_uid;
    info.gid = st.st_gid;
    info.nlink = options.nlink && (options.directory_nlink || !S_ISDIR(st.st_mode)) ? static_cast<uint32_t>(st.st_nlink) : 0;
    info.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (S_ISDIR(st.st_mode) && !options.directory_mtimes) info.mtime_ns = 0;
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) info.rdev = st.st_rdev;
    STRATA_ASSIGN_OR_RETURN(info.xattrs, ReadXattrs(path, options));
    if (S_ISREG(st.st_mode)) {
      info.size = static_cast<uint64_t>(st.st_size);
      STRATA_ASSIGN_OR_RETURN(info.content_hash, HashFileContent(path));
    } else if (S_ISLNK(st.st_mode)) {
      std::vector<char> buf(8192);
      ssize_t n = ::readlink(path.c_str(), buf.data(), buf.size());
      if (n < 0) return ErrnoError(errno, "readlink " + path);
      info.link.assign(buf.data(), static_cast<size_t>(n));
      info.size = static_cast<uint64_t>(n);
    }
    if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
      auto [it, inserted] = inodes.emplace(std::make_pair(st.st_dev, st.st_ino), rel);
      info.hardlink_group = it->second;
    }
    if (rel != "." || options.root_attributes) snap[rel] = info;
    if (S_ISDIR(st.st_mode)) {
      DIR* d = ::opendir(path.c_str());
      if (!d) return ErrnoError(errno, "opendir " + path);
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      ::closedir(d);
      std::sort(names.begin(), names.end());
      for (const auto& n : names) STRATA_RETURN_IF_ERROR(walk(rel == "." ? n : rel + "/" + n));
    }
    return OkStatus();
  };
  STRATA_RETURN_IF_ERROR(walk("."));
  // Hardlink groups are named by their first path in sorted order, so two
  // trees with the same links agree regardless of walk order.
  std::map<std::string, std::string> first;
  for (auto& [path, info] : snap) {
    if (info.hardlink_group.empty()) continue;
    auto [it, inserted] = first.emplace(info.hardlink_group, path);
    info.hardlink_group = it->second;
  }
  return snap;
}

Result<TreeSnapshot> SnapshotImage(const erofs::Image& image, const SnapshotOptions& options) {
  TreeSnapshot snap;
  std::map<uint64_t, std::string> inodes;  // nid -> first path
  std::vector<char> buf(1 << 20);
  STRATA_RETURN_IF_ERROR(image.Walk([&](const std::string& walked, const erofs::Inode& inode) -> Status {
    const std::string rel = walked == "/" ? "." : walked.substr(1);
    NodeInfo info;
    info.mode = inode.mode;
    info.uid = inode.uid;
    info.gid = inode.gid;
    info.nlink = options.nlink && (options.directory_nlink || !S_ISDIR(inode.mode)) ? inode.nlink : 0;
    info.mtime_ns = inode.mtime * 1000000000 + inode.mtime_nsec;
    if (S_ISDIR(inode.mode) && !options.directory_mtimes) info.mtime_ns = 0;
    if (S_ISCHR(inode.mode) || S_ISBLK(inode.mode)) info.rdev = inode.rdev;
    STRATA_ASSIGN_OR_RETURN(auto xattrs, image.ListXattrs(inode));
    for (auto& x : xattrs) {
      bool ignored = false;
      for (const auto& prefix : options.ignore_xattr_prefixes) ignored |= x.name.starts_with(prefix);
      if (!ignored) info.xattrs[x.name] = std::move(x.value);
    }
    if (S_ISREG(inode.mode)) {
      info.size = inode.size;
      STRATA_ASSIGN_OR_RETURN(auto extents, image.MapFile(inode));
      ContentHasher h;
      for (const auto& e : extents) {
        if (e.hole) {
          h.Zeros(e.length);
          continue;
        }
        for (uint64_t done = 0; done < e.length;) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), e.length - done));
          STRATA_ASSIGN_OR_RETURN(size_t got, image.Read(inode, e.file_offset + done, std::span<char>(buf.data(), n)));
          if (got != n) return Error(EIO, StrCat("short read of ", walked));
          h.Update(std::string_view(buf.data(), n));
          done += n;
        }
      }
      info.content_hash = h.Finish();
    } else if (S_ISLNK(inode.mode)) {
      STRATA_ASSIGN_OR_RETURN(info.link, image.ReadLink(inode));
      info.size = info.link.size();
    }
    if (!S_ISDIR(inode.mode) && inode.nlink > 1) {
      auto [it, inserted] = inodes.emplace(inode.nid, rel);
      info.hardlink_group = it->second;
    }
    if (rel != "." || options.root_attributes) snap[rel] = std::move(info);
    return OkStatus();
  }));
  std::map<std::string, std::string> first;
  for (auto& [path, info] : snap) {
    if (info.hardlink_group.empty()) continue;
    auto [it, inserted] = first.emplace(info.hardlink_group, path);
    info.hardlink_group = it->second;
  }
  return snap;
}

std::vector<std::string> DiffTrees(const TreeSnapshot& want, const TreeSnapshot& got, size_t max) {
  std::vector<std::string> out;
  auto add = [&](std::string line) {
    if (out.size() < max) out.push_back(std::move(line));
  };
  for (const auto& [path, w] : want) {
    auto it = got.find(path);
    if (it == got.end()) {
      add("missing: " + Quote(path));
      continue;
    }
    const NodeInfo& g = it->second;
    auto field = [&](const char* name, auto a, auto b) {
      if (a != b) add(StrCat(Quote(path), ": ", name, " ", std::to_string(a), " != ", std::to_string(b)));
    };
    field("mode", w.mode, g.mode);
    field("uid", w.uid, g.uid);
    field("gid", w.gid, g.gid);
    field("size", w.size, g.size);
    field("mtime_ns", w.mtime_ns, g.mtime_ns);
    field("rdev", w.rdev, g.rdev);
    field("nlink", w.nlink, g.nlink);
    if (w.link != g.link) add(StrCat(Quote(path), ": link target ", Quote(w.link), " != ", Quote(g.link)));
    if (w.content_hash != g.content_hash) add(StrCat(Quote(path), ": content differs"));
    if (w.hardlink_group != g.hardlink_group) {
      add(StrCat(Quote(path), ": hardlink group ", Quote(w.hardlink_group), " != ", Quote(g.hardlink_group)));
    }
    if (w.xattrs != g.xattrs) {
      std::vector<std::string> wn, gn;
      for (const auto& [k, v] : w.xattrs) wn.push_back(k + "=" + std::to_string(v.size()) + "B");
      for (const auto& [k, v] : g.xattrs) gn.push_back(k + "=" + std::to_string(v.size()) + "B");
      add(StrCat(Quote(path), ": xattrs [", Join(wn, ","), "] != [", Join(gn, ","), "]"));
    }
  }
  for (const auto& [path, g] : got) {
    if (!want.count(path)) add("unexpected: " + Quote(path));
  }
  return out;
}

Status MakeBusyboxRoot(const std::string& root) {
  for (const char* d : {"bin", "proc", "sys", "dev", "tmp", "etc", "root", "mnt"}) STRATA_RETURN_IF_ERROR(MakeDirs(root + "/" + d));
  STRATA_RETURN_IF_ERROR(RunChecked({.argv = {"cp", "/bin/busybox", root + "/bin/busybox"}}, "copy busybox").status());
  STRATA_ASSIGN_OR_RETURN(auto list, RunChecked({.argv = {"/bin/busybox", "--list"}}, "list applets"));
  for (const auto& applet : Split(list.out, '\n')) {
    if (applet.empty() || applet == "busybox") continue;
    if (::symlink("busybox", (root + "/bin/" + applet).c_str()) != 0 && errno != EEXIST) {
      return ErrnoError(errno, "symlink " + applet);
    }
  }
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(root + "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"));
  if (::chmod((root + "/tmp").c_str(), 01777) != 0) return ErrnoError(errno, "chmod tmp");
  return OkStatus();
}

}  // namespace strata::testing
