// TreeFs: libfuse low-level operations over erofs::Image.
//
// The filesystem keeps no per-inode state: a FUSE node id is the nid (the
// root is remapped to FUSE_ROOT_ID), every operation re-reads what it needs
// from the image, and lookup counts need no bookkeeping (forget is a no-op).
// Opens cost a round trip each for nothing, so where the kernel allows it
// (FUSE_CAP_NO_OPEN_SUPPORT, FUSE_CAP_NO_OPENDIR_SUPPORT) open and opendir
// answer ENOSYS: the kernel then opens without asking, keeps file pages and
// directory listings cached, and sends no release. Where it does not, open
// files carry their parsed inode and open directories their entries.
// Readdir offsets are indexes into the entries, which never change.
#define FUSE_USE_VERSION 312
#include "lazyfs/tree_fs.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "common/log.h"
#include "common/strings.h"

namespace strata::lazyfs {

namespace {

constexpr double kForever = 86400.0 * 365;  // layers never change under a name
// Past this many, only every kLogEvery-th error is logged (a corrupt layer
// read by many sandboxes must not flood the log).
constexpr uint64_t kLogFirst = 100, kLogEvery = 1000;

class LayerBlockSource final : public erofs::BlockSource {
 public:
  LayerBlockSource(std::shared_ptr<ServedLayer> layer, bool blob) : layer_(std::move(layer)), blob_(blob) {}
  uint64_t size() const override { return blob_ ? layer_->manifest().blob_size : layer_->manifest().meta_size; }
  Result<size_t> ReadAt(uint64_t offset, std::span<char> out) const override {
    const uint64_t end = size();
    if (offset >= end) return size_t{0};
    out = out.first(static_cast<size_t>(std::min<uint64_t>(out.size(), end - offset)));
    auto n = blob_ ? layer_->ReadBlob(offset, out) : layer_->ReadMeta(offset, out);
    if (!n.ok()) return Error(EIO, n.status().ToString());
    return *n;
  }

 private:
  std::shared_ptr<ServedLayer> layer_;
  bool blob_;
};

}  // namespace

std::shared_ptr<erofs::BlockSource> MetaBlockSource(std::shared_ptr<ServedLayer> layer) {
  return std::make_shared<LayerBlockSource>(std::move(layer), false);
}

std::shared_ptr<erofs::BlockSource> BlobBlockSource(std::shared_ptr<ServedLayer> layer) {
  return std::make_shared<LayerBlockSource>(std::move(layer), true);
}

// The FUSE operations, with access to TreeFs's members.
struct TreeFsOps {
  struct DirHandle {
    erofs::Inode dir;
    std::vector<erofs::DirEntry> entries;  // with "." and "..", in on-disk order
  };

  static TreeFs* Fs(fuse_req_t req) { return static_cast<TreeFs*>(FuseMount::Owner(req)); }

  // The inode an open file carries, or (no open was sent) the one `ino` names.
  static Result<erofs::Inode> FileInode(const TreeFs& fs, fuse_ino_t ino, const fuse_file_info* fi) {
    if (fi != nullptr && fi->fh != 0) return *reinterpret_cast<const erofs::Inode*>(fi->fh);
    return fs.image_->GetInode(NidOf(fs, ino));
  }

  static uint64_t NidOf(const TreeFs& fs, fuse_ino_t ino) {
    return ino == FUSE_ROOT_ID ? fs.image_->info().root_nid : ino - 2;
  }
  static fuse_ino_t InoOf(const TreeFs& fs, uint64_t nid) {
    return nid == fs.image_->info().root_nid ? FUSE_ROOT_ID : nid + 2;
  }

  // Replies EIO and logs which step failed on which inode of which layer.
  static void FailIo(fuse_req_t req, const TreeFs& fs, std::string_view step, uint64_t nid, const Status& s) {
    const uint64_t n = fs.errors_.fetch_add(1, std::memory_order_relaxed);
    if (n < kLogFirst || n % kLogEvery == 0) {
      STRATA_LOG(kWarn) << "lazyfs: layer " << fs.layer_->digest().Hex() << ": " << step << " of inode " << nid
                        << ": " << s.ToString() << (n >= kLogFirst ? StrCat(" (", n + 1, " errors so far)") : "");
    }
    fuse_reply_err(req, EIO);
  }

  // Replies with the reader's own errno when the caller should see it
  // (the `expected` codes), else EIO.
  static void Fail(fuse_req_t req, const TreeFs& fs, std::string_view step, uint64_t nid, const Status& s,
                   std::initializer_list<int> expected) {
    for (int code : expected) {
      if (s.code() == code) {
        fuse_reply_err(req, code);
        return;
      }
    }
    FailIo(req, fs, step, nid, s);
  }

  static struct stat StatOf(const TreeFs& fs, const erofs::Inode& in) {
    struct stat st{};
    const uint32_t block = fs.image_->info().block_size;
    st.st_ino = in.nid;  // what the kernel's EROFS reports on 64-bit hosts
    st.st_mode = in.mode;
    st.st_nlink = in.nlink;
    st.st_uid = in.uid;
    st.st_gid = in.gid;
    st.st_rdev = in.rdev;  // the kernel's encoding, which FUSE's attr carries too
    st.st_size = static_cast<off_t>(in.size);
    st.st_blksize = block;
    // As the kernel's EROFS counts uncompressed inodes: whole blocks of the size.
    st.st_blocks = static_cast<blkcnt_t>((in.size + block - 1) / block * (block / 512));
    st.st_mtim = {static_cast<time_t>(in.mtime), static_cast<long>(in.mtime_nsec)};
    st.st_atim = st.st_mtim;
    st.st_ctim = st.st_mtim;
    return st;
  }

  static mode_t TypeBits(erofs::FileType type) {
    switch (type) {
      case erofs::FileType::kRegular: return S_IFREG;
      case erofs::FileType::kDirectory: return S_IFDIR;
      case erofs::FileType::kSymlink: return S_IFLNK;
      case erofs::FileType::kCharDevice: return S_IFCHR;
      case erofs::FileType::kBlockDevice: return S_IFBLK;
      case erofs::FileType::kFifo: return S_IFIFO;
      case erofs::FileType::kSocket: return S_IFSOCK;
    }
    return 0;
  }

  static void Init(void* userdata, fuse_conn_info* conn) {
    auto* fs = static_cast<TreeFs*>(FuseMount::OwnerOfSession(userdata));
    fs->no_open_ = (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) != 0;
    fs->no_opendir_ = (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) != 0;
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS) conn->want |= FUSE_CAP_CACHE_SYMLINKS;
    if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO;
    // Nothing ever changes: no need to compare mtimes to drop cached pages.
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    conn->time_gran = 1;
  }

  static void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      const uint64_t dir_nid = NidOf(fs, parent);
      auto dir = fs.image_->GetInode(dir_nid);
      if (!dir.ok()) return FailIo(req, fs, "lookup: read directory", dir_nid, dir.status());
      auto entry = fs.image_->Lookup(*dir, name);
      if (!entry.ok() && entry.status().code() == ENOENT) {
        // Cache the absence too: the name will never appear.
        fuse_entry_param e{};
        e.entry_timeout = kForever;
        fuse_reply_entry(req, &e);
        return;
      }
      if (!entry.ok()) {
        return Fail(req, fs, StrCat("lookup ", Quote(name)), dir_nid, entry.status(), {ENAMETOOLONG, ENOTDIR});
      }
      auto inode = fs.image_->GetInode(entry->nid);
      if (!inode.ok()) return FailIo(req, fs, StrCat("lookup ", Quote(name), ": read inode"), entry->nid, inode.status());
      fuse_entry_param e{};
      e.ino = InoOf(fs, inode->nid);
      e.attr = StatOf(fs, *inode);
      e.attr_timeout = kForever;
      e.entry_timeout = kForever;
      fuse_reply_entry(req, &e);
    });
  }

  static void Forget(fuse_req_t req, fuse_ino_t, uint64_t) { fuse_reply_none(req); }
  static void ForgetMulti(fuse_req_t req, size_t, fuse_forget_data*) { fuse_reply_none(req); }

  static void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      auto inode = fs.image_->GetInode(NidOf(fs, ino));
      if (!inode.ok()) return FailIo(req, fs, "getattr", NidOf(fs, ino), inode.status());
      struct stat st = StatOf(fs, *inode);
      fuse_reply_attr(req, &st, kForever);
    });
  }

  static void Readlink(fuse_req_t req, fuse_ino_t ino) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      const uint64_t nid = NidOf(fs, ino);
      auto inode = fs.image_->GetInode(nid);
      if (!inode.ok()) return FailIo(req, fs, "readlink", nid, inode.status());
      auto target = fs.image_->ReadLink(*inode);
      if (!target.ok()) return Fail(req, fs, "readlink", nid, target.status(), {EINVAL});
      fuse_reply_readlink(req, target->c_str());
    });
  }

  static void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      if ((fi->flags & O_ACCMODE) != O_RDONLY) return (void)fuse_reply_err(req, EROFS);
      // The kernel treats this as success from now on (the mount is
      // read-only, so it refuses writers itself).
      if (fs.no_open_) return (void)fuse_reply_err(req, ENOSYS);
      const uint64_t nid = NidOf(fs, ino);
      auto inode = fs.image_->GetInode(nid);
      if (!inode.ok()) return FailIo(req, fs, "open", nid, inode.status());
      if (inode->type == erofs::FileType::kDirectory) return (void)fuse_reply_err(req, EISDIR);
      if (inode->type != erofs::FileType::kRegular) return (void)fuse_reply_err(req, EINVAL);
      fi->fh = reinterpret_cast<uint64_t>(new erofs::Inode(std::move(*inode)));
      fi->keep_cache = 1;  // the pages stay valid for ever
      fi->noflush = 1;     // nothing to flush on close
      if (fuse_reply_open(req, fi) != 0) delete reinterpret_cast<erofs::Inode*>(fi->fh);  // interrupted
    });
  }

  static void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      auto file = FileInode(fs, ino, fi);
      if (!file.ok()) return FailIo(req, fs, "read", NidOf(fs, ino), file.status());
      if (file->type != erofs::FileType::kRegular) return (void)fuse_reply_err(req, EINVAL);
      const erofs::Inode* inode = &*file;
      thread_local std::vector<char> buf;
      if (buf.size() < size) buf.resize(size);
      auto n = fs.image_->Read(*inode, static_cast<uint64_t>(off), std::span<char>(buf.data(), size));
      if (!n.ok()) return FailIo(req, fs, StrCat("read at ", off), inode->nid, n.status());
      fuse_reply_buf(req, buf.data(), *n);
    });
  }

  static void Release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    delete reinterpret_cast<erofs::Inode*>(fi->fh);
    fuse_reply_err(req, 0);
  }

  // SEEK_DATA and SEEK_HOLE (the kernel answers the other whences itself),
  // from the file's extents: a sparse file is read without its holes.
  static void Lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info* fi) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      auto file = FileInode(fs, ino, fi);
      if (!file.ok()) return FailIo(req, fs, "seek", NidOf(fs, ino), file.status());
      if (file->type != erofs::FileType::kRegular) return (void)fuse_reply_err(req, EINVAL);
      const erofs::Inode* inode = &*file;
      if (whence != SEEK_DATA && whence != SEEK_HOLE) return (void)fuse_reply_err(req, EINVAL);
      const uint64_t pos = static_cast<uint64_t>(off);
      if (off < 0 || pos >= inode->size) return (void)fuse_reply_err(req, ENXIO);
      auto extents = fs.image_->MapFile(*inode);
      if (!extents.ok()) return FailIo(req, fs, "seek: map file", inode->nid, extents.status());
      for (const auto& e : *extents) {
        if (e.file_offset + e.length <= pos) continue;
        if (e.hole == (whence == SEEK_HOLE)) {
          fuse_reply_lseek(req, static_cast<off_t>(std::max(pos, e.file_offset)));
          return;
        }
      }
      // No data after pos; the end of the file is a hole.
      if (whence == SEEK_DATA) return (void)fuse_reply_err(req, ENXIO);
      fuse_reply_lseek(req, static_cast<off_t>(inode->size));
    });
  }

  // A directory's entries with "." and ".." in the places the kernel's
  // EROFS lists them; replies the error itself and returns null on failure.
  static std::unique_ptr<DirHandle> MakeDirHandle(fuse_req_t req, const TreeFs& fs, uint64_t nid, const char* step) {
    auto dir = fs.image_->GetInode(nid);
    if (!dir.ok()) {
      FailIo(req, fs, step, nid, dir.status());
      return nullptr;
    }
    auto entries = fs.image_->ReadDir(*dir);
    if (!entries.ok()) {
      Fail(req, fs, "readdir", nid, entries.status(), {ENOTDIR});
      return nullptr;
    }
    auto handle = std::make_unique<DirHandle>();
    // ".." as the image stores it (the root's is the root itself).
    uint64_t parent = nid;
    if (nid != fs.image_->info().root_nid) {
      auto dotdot = fs.image_->Lookup(*dir, "..");
      if (dotdot.ok()) parent = dotdot->nid;
    }
    // "." and ".." in their sorted place among the names (on-disk order is
    // byte-wise ascending).
    handle->entries = std::move(*entries);
    for (const char* name : {".", ".."}) {
      auto at = std::lower_bound(handle->entries.begin(), handle->entries.end(), std::string_view(name),
                                 [](const erofs::DirEntry& e, std::string_view n) { return e.name < n; });
      handle->entries.insert(at, {name, name[1] ? parent : nid, erofs::FileType::kDirectory});
    }
    handle->dir = std::move(*dir);
    return handle;
  }

  static void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      // From now on the kernel opens directories itself and caches their
      // listings (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR); readdir comes
      // without a handle.
      if (fs.no_opendir_) return (void)fuse_reply_err(req, ENOSYS);
      auto handle = MakeDirHandle(req, fs, NidOf(fs, ino), "opendir");
      if (!handle) return;
      fi->fh = reinterpret_cast<uint64_t>(handle.get());
      fi->keep_cache = 1;
      fi->cache_readdir = 1;  // the kernel keeps the listing
      if (fuse_reply_open(req, fi) == 0) handle.release();
    });
  }

  static void ReaddirImpl(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi, bool plus) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      // Without opendir, the entries are read again for each call; the
      // kernel caches the listing, so that is once per directory.
      std::unique_ptr<DirHandle> fresh;
      const DirHandle* handle = reinterpret_cast<const DirHandle*>(fi->fh);
      if (handle == nullptr) {
        fresh = MakeDirHandle(req, fs, NidOf(fs, ino), "readdir");
        if (!fresh) return;
        handle = fresh.get();
      }
      std::vector<char> buf(size);
      size_t used = 0;
      for (size_t i = static_cast<size_t>(std::max<off_t>(off, 0)); i < handle->entries.size(); ++i) {
        const erofs::DirEntry& entry = handle->entries[i];
        const off_t next = static_cast<off_t>(i + 1);
        size_t need;
        if (!plus) {
          struct stat st{};
          st.st_ino = entry.nid;
          st.st_mode = TypeBits(entry.type);
          need = fuse_add_direntry(req, buf.data() + used, size - used, entry.name.c_str(), &st, next);
        } else {
          fuse_entry_param e{};
          e.attr.st_ino = entry.nid;
          e.attr.st_mode = TypeBits(entry.type);
          // "." and ".." are not linked by the kernel; node id 0 says so.
          if (entry.name != "." && entry.name != "..") {
            auto inode = fs.image_->GetInode(entry.nid);
            if (inode.ok()) {
              e.ino = InoOf(fs, inode->nid);
              e.attr = StatOf(fs, *inode);
              e.attr_timeout = kForever;
              e.entry_timeout = kForever;
            } else {
              // List the name anyway (as the kernel's EROFS does); a
              // lookup of it then fails with EIO.
              const uint64_t n = fs.errors_.fetch_add(1, std::memory_order_relaxed);
              if (n < kLogFirst) {
                STRATA_LOG(kWarn) << "lazyfs: layer " << fs.layer_->digest().Hex() << ": readdirplus of inode "
                                  << handle->dir.nid << ": entry " << Quote(entry.name) << ": "
                                  << inode.status().ToString();
              }
            }
          }
          need = fuse_add_direntry_plus(req, buf.data() + used, size - used, entry.name.c_str(), &e, next);
        }
        if (need > size - used) break;
        used += need;
      }
      fuse_reply_buf(req, buf.data(), used);
    });
  }

  static void Readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
    ReaddirImpl(req, ino, size, off, fi, false);
  }
  static void Readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
    ReaddirImpl(req, ino, size, off, fi, true);
  }

  static void Releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    delete reinterpret_cast<DirHandle*>(fi->fh);
    fuse_reply_err(req, 0);
  }

  static void Getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      const uint64_t nid = NidOf(fs, ino);
      auto inode = fs.image_->GetInode(nid);
      if (!inode.ok()) return FailIo(req, fs, "getxattr", nid, inode.status());
      auto value = fs.image_->GetXattr(*inode, name);
      if (!value.ok()) return Fail(req, fs, StrCat("getxattr ", Quote(name)), nid, value.status(), {ENODATA});
      if (size == 0) return (void)fuse_reply_xattr(req, value->size());
      if (value->size() > size) return (void)fuse_reply_err(req, ERANGE);
      fuse_reply_buf(req, value->data(), value->size());
    });
  }

  static void Listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      const uint64_t nid = NidOf(fs, ino);
      auto inode = fs.image_->GetInode(nid);
      if (!inode.ok()) return FailIo(req, fs, "listxattr", nid, inode.status());
      auto xattrs = fs.image_->ListXattrs(*inode);
      if (!xattrs.ok()) return FailIo(req, fs, "listxattr", nid, xattrs.status());
      // The kernel's EROFS lists trusted.* only to CAP_SYS_ADMIN; here the
      // caller's uid stands in for it.
      const bool privileged = fuse_req_ctx(req)->uid == 0;
      std::string names;
      for (const auto& x : *xattrs) {
        if (!privileged && x.name.starts_with("trusted.")) continue;
        names += x.name;
        names.push_back('\0');
      }
      if (size == 0) return (void)fuse_reply_xattr(req, names.size());
      if (names.size() > size) return (void)fuse_reply_err(req, ERANGE);
      fuse_reply_buf(req, names.data(), names.size());
    });
  }

  static void Statfs(fuse_req_t req, fuse_ino_t) {
    Guard(req, [&] {
      const TreeFs& fs = *Fs(req);
      const erofs::ImageInfo& info = fs.image_->info();
      struct statvfs st{};
      st.f_bsize = info.block_size;
      st.f_frsize = info.block_size;
      uint64_t blocks = 0;
      for (uint64_t b : info.device_blocks) blocks += b;
      if (blocks == info.device_blocks[0]) {  // the device table gave no blob size
        blocks += (fs.layer_->manifest().blob_size + info.block_size - 1) / info.block_size;
      }
      st.f_blocks = blocks;
      // As the kernel's EROFS (6.18) reports them: no limit on inodes.
      st.f_files = UINT64_MAX;
      st.f_ffree = UINT64_MAX - info.inode_count;
      st.f_namemax = 255;
      fuse_reply_statfs(req, &st);
    });
  }

  static fuse_lowlevel_ops Make() {
    fuse_lowlevel_ops ops{};
    ops.init = Init;
    ops.lookup = Lookup;
    ops.forget = Forget;
    ops.forget_multi = ForgetMulti;
    ops.getattr = Getattr;
    ops.readlink = Readlink;
    ops.open = Open;
    ops.read = Read;
    ops.release = Release;
    ops.lseek = Lseek;
    ops.opendir = Opendir;
    ops.readdir = Readdir;
    ops.readdirplus = Readdirplus;
    ops.releasedir = Releasedir;
    ops.getxattr = Getxattr;
    ops.listxattr = Listxattr;
    ops.statfs = Statfs;
    return ops;
  }
};

namespace {
const fuse_lowlevel_ops kTreeOps = TreeFsOps::Make();
}

Result<std::unique_ptr<TreeFs>> TreeFs::Open(std::shared_ptr<ServedLayer> layer, const std::string& mountpoint) {
  const std::string what = StrCat("serve layer ", layer->digest().Hex(), " in fuse mode");
  // The device table says whether the layer has a blob (a tree without
  // file data has none).
  auto probe = erofs::Image::Open(MetaBlockSource(layer));
  if (!probe.ok()) return probe.status().Annotate(what);
  const size_t extra = (*probe)->info().device_blocks.size() - 1;
  if (extra > 1) {
    return Error(ENOTSUP, StrCat(what, ": the image lists ", extra, " extra devices; a layer has one blob"));
  }
  std::vector<std::shared_ptr<erofs::BlockSource>> devices;
  if (extra == 1) devices.push_back(BlobBlockSource(layer));
  auto image = erofs::Image::Open(MetaBlockSource(layer), std::move(devices));
  if (!image.ok()) return image.status().Annotate(what);

  std::unique_ptr<TreeFs> fs(new TreeFs());
  fs->mountpoint_ = mountpoint;
  fs->layer_ = std::move(layer);
  fs->image_ = std::move(*image);
  return fs;
}

FuseMountOptions TreeFs::Options() const {
  FuseMountOptions options;
  // suid and dev as the kernel mode's EROFS mount has them: a root
  // filesystem's setuid binaries and device nodes keep working.
  options.options = {"fsname=lazyfs:" + layer_->digest().Hex(),
                     "subtype=lazyfs",
                     "ro",
                     "suid",
                     "dev",
                     "default_permissions",
                     "allow_other"};
  options.max_threads = 64;
  options.max_idle_threads = 4;
  return options;
}

Result<std::unique_ptr<TreeFs>> TreeFs::Mount(std::shared_ptr<ServedLayer> layer, const std::string& mountpoint) {
  STRATA_ASSIGN_OR_RETURN(auto fs, Open(layer, mountpoint));
  auto fuse = FuseMount::Start(mountpoint, kTreeOps, fs.get(), fs->Options());
  if (!fuse.ok()) return fuse.status().Annotate(StrCat("serve layer ", layer->digest().Hex(), " in fuse mode"));
  fs->fuse_ = std::move(*fuse);
  return fs;
}

Result<std::unique_ptr<TreeFs>> TreeFs::Adopt(std::shared_ptr<ServedLayer> layer, const std::string& mountpoint,
                                              UniqueFd fd, FuseInit init) {
  STRATA_ASSIGN_OR_RETURN(auto fs, Open(layer, mountpoint));
  auto fuse = FuseMount::Adopt(mountpoint, std::move(fd), std::move(init), kTreeOps, fs.get(), fs->Options());
  if (!fuse.ok()) return fuse.status().Annotate(StrCat("serve layer ", layer->digest().Hex(), " in fuse mode"));
  fs->fuse_ = std::move(*fuse);
  // File handles are stateless only where the kernel opens without asking;
  // elsewhere they point into the dead process.
  if (!fs->no_open_ || !fs->no_opendir_) {
    return Error(ENOTSUP, StrCat("take over layer ", layer->digest().Hex(),
                                 " in fuse mode: this kernel asks to open files (no FUSE_NO_OPEN_SUPPORT), so their "
                                 "handles did not survive"));
  }
  return fs;
}

TreeFs::~TreeFs() { fuse_.reset(); }

}  // namespace strata::lazyfs
