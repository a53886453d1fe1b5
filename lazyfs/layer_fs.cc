// LayerFs: libfuse low-level operations over ServedLayers.
#define FUSE_USE_VERSION 312
#include "lazyfs/layer_fs.h"

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"

namespace strata::lazyfs {
namespace {

constexpr double kForever = 86400.0 * 365;  // layers never change under a name

LayerFs* Fs(fuse_req_t req) { return static_cast<LayerFs*>(FuseMount::Owner(req)); }

// Root's only (the mount is allow_other for microVMs' descriptors, and
// default_permissions holds every other user to these modes).
struct stat StatOf(const LayerFs::Node* node) {
  struct stat st{};
  if (!node) {
    st.st_ino = FUSE_ROOT_ID;
    st.st_mode = S_IFDIR | 0500;
    st.st_nlink = 2;
  } else {
    st.st_ino = node->ino;
    st.st_mode = S_IFREG | 0400;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(node->size);
    st.st_blocks = static_cast<blkcnt_t>((node->size + 511) / 512);
  }
  st.st_blksize = 4096;
  return st;
}

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guard(req, [&] {
    auto node = parent == FUSE_ROOT_ID ? Fs(req)->LookUp(name) : nullptr;
    if (!node) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    fuse_entry_param e{};
    e.ino = node->ino;
    e.attr = StatOf(node.get());
    e.attr_timeout = kForever;
    e.entry_timeout = kForever;
    fuse_reply_entry(req, &e);
  });
}

void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  Guard(req, [&] {
    if (ino == FUSE_ROOT_ID) {
      struct stat st = StatOf(nullptr);
      fuse_reply_attr(req, &st, 1.0);
      return;
    }
    auto node = Fs(req)->FindByIno(ino);
    if (!node) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    struct stat st = StatOf(node.get());
    fuse_reply_attr(req, &st, kForever);
  });
}

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guard(req, [&] {
    auto node = Fs(req)->FindByIno(ino);
    if (!node) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY) {
      fuse_reply_err(req, EROFS);
      return;
    }
    // The blob's pages are cached by EROFS above us; caching them here too
    // would hold every byte twice. Either FUSE reads the blob direct, or
    // EROFS mounted with `directio` asks for direct reads itself. The
    // metadata image is read through this page cache by EROFS, so it keeps it.
    fi->direct_io = node->blob && Fs(req)->blob_direct_io() ? 1 : 0;
    fi->keep_cache = node->blob ? 0 : 1;
    fuse_reply_open(req, fi);
  });
}

void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  Guard(req, [&] {
    auto node = Fs(req)->FindByIno(ino);
    if (!node) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    thread_local std::vector<char> buf;
    if (buf.size() < size) buf.resize(size);
    std::span<char> out(buf.data(), size);
    auto n = node->blob ? node->layer->ReadBlob(static_cast<uint64_t>(off), out)
                        : node->layer->ReadMeta(static_cast<uint64_t>(off), out);
    if (!n.ok()) {
      STRATA_LOG(kWarn) << "lazyfs: read " << (node->blob ? "blob" : "metadata") << " of layer "
                        << node->layer->digest().Hex() << " at " << off << ": " << n.status().ToString();
      fuse_reply_err(req, EIO);
      return;
    }
    fuse_reply_buf(req, buf.data(), *n);
  });
}

void OpRelease(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Fs(req)->Forget(ino, nlookup);
  fuse_reply_none(req);
}

void OpForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) Fs(req)->Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  Guard(req, [&] {
    if (ino != FUSE_ROOT_ID) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    std::vector<std::pair<std::string, struct stat>> entries;
    struct stat dir = StatOf(nullptr);
    entries.push_back({".", dir});
    entries.push_back({"..", dir});
    for (const auto& [name, node] : Fs(req)->List()) entries.push_back({name, StatOf(node.get())});
    std::vector<char> buf(size);
    size_t used = 0;
    for (size_t i = static_cast<size_t>(off); i < entries.size(); ++i) {
      size_t need = fuse_add_direntry(req, buf.data() + used, size - used, entries[i].first.c_str(),
                                      &entries[i].second, static_cast<off_t>(i + 1));
      if (need > size - used) break;
      used += need;
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

void OpStatfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs st{};
  st.f_bsize = 4096;
  st.f_frsize = 4096;
  st.f_namemax = 255;
  fuse_reply_statfs(req, &st);
}

const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops ops{};
  ops.lookup = OpLookup;
  ops.getattr = OpGetattr;
  ops.open = OpOpen;
  ops.read = OpRead;
  ops.release = OpRelease;
  ops.forget = OpForget;
  ops.forget_multi = OpForgetMulti;
  ops.readdir = OpReaddir;
  ops.statfs = OpStatfs;
  return ops;
}();

}  // namespace

namespace {
// allow_other: a microVM's QEMU, jailed as its own uid, reads a layer's
// files through descriptors root opened, and FUSE refuses every request
// (even fstat) of another uid without it. The mount point stays in the
// daemon's 0700 state directory, so no other user reaches it by path.
FuseMountOptions LayerFsOptions() {
  FuseMountOptions options;
  options.options = {"fsname=lazyfs", "subtype=strata", "default_permissions", "allow_other"};
  return options;
}
}  // namespace

Result<std::unique_ptr<LayerFs>> LayerFs::Mount(const std::string& mountpoint, bool blob_direct_io) {
  std::unique_ptr<LayerFs> fs(new LayerFs());
  fs->mountpoint_ = mountpoint;
  fs->blob_direct_io_ = blob_direct_io;
  STRATA_ASSIGN_OR_RETURN(fs->fuse_, FuseMount::Start(mountpoint, kOps, fs.get(), LayerFsOptions()));
  return fs;
}

Result<std::unique_ptr<LayerFs>> LayerFs::Adopt(const std::string& mountpoint, bool blob_direct_io, UniqueFd fd,
                                                FuseInit init, const std::vector<std::shared_ptr<ServedLayer>>& layers) {
  std::unique_ptr<LayerFs> fs(new LayerFs());
  fs->mountpoint_ = mountpoint;
  fs->blob_direct_io_ = blob_direct_io;
  for (const auto& layer : layers) {
    STRATA_RETURN_IF_ERROR(fs->Add(layer));
    // How many references the kernel holds is not known after a takeover:
    // enough that a layer removed later stays readable while the kernel
    // holds it (a busy EROFS mount detached), for the rest of this process.
    for (bool blob : {false, true}) fs->by_ino_[InoFor(layer->digest(), blob)]->lookups = uint64_t{1} << 40;
  }
  STRATA_ASSIGN_OR_RETURN(fs->fuse_,
                          FuseMount::Adopt(mountpoint, std::move(fd), std::move(init), kOps, fs.get(), LayerFsOptions()));
  return fs;
}

LayerFs::~LayerFs() { fuse_.reset(); }

uint64_t LayerFs::InoFor(const Digest128& digest, bool blob) {
  // 62 bits of the digest and the file's kind, above the root's number.
  return (((digest.low & ((uint64_t{1} << 61) - 1)) << 1) | (blob ? 1 : 0)) + 2;
}

Status LayerFs::Add(std::shared_ptr<ServedLayer> layer) {
  std::lock_guard lock(mu_);
  std::string hex = layer->digest().Hex();
  for (bool blob : {false, true}) {
    const uint64_t ino = InoFor(layer->digest(), blob);
    auto same = by_ino_.find(ino);
    if (same != by_ino_.end() && same->second->layer->digest() != layer->digest()) {
      return Error(EEXIST, StrCat("layer ", hex, ": its inode number is that of layer ", same->second->layer->digest().Hex()));
    }
    auto node = std::make_shared<Node>(
        Node{ino, layer, blob, blob ? layer->manifest().blob_size : layer->manifest().meta_size});
    if (same != by_ino_.end()) node->lookups = same->second->lookups;  // the kernel still holds the old one
    by_name_[hex + (blob ? ".blob" : ".meta")] = node;
    by_ino_[node->ino] = node;
  }
  return OkStatus();
}

void LayerFs::Remove(const Digest128& digest) {
  std::lock_guard lock(mu_);
  std::string hex = digest.Hex();
  for (const char* suffix : {".meta", ".blob"}) {
    auto it = by_name_.find(hex + suffix);
    if (it == by_name_.end()) continue;
    it->second->removed = true;
    if (it->second->lookups == 0) by_ino_.erase(it->second->ino);
    by_name_.erase(it);
  }
}

std::string LayerFs::MetaPath(const Digest128& digest) const { return mountpoint_ + "/" + digest.Hex() + ".meta"; }
std::string LayerFs::BlobPath(const Digest128& digest) const { return mountpoint_ + "/" + digest.Hex() + ".blob"; }

std::shared_ptr<LayerFs::Node> LayerFs::LookUp(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  ++it->second->lookups;
  return it->second;
}

void LayerFs::Forget(uint64_t ino, uint64_t n) {
  std::lock_guard lock(mu_);
  auto it = by_ino_.find(ino);
  if (it == by_ino_.end()) return;
  it->second->lookups -= std::min(n, it->second->lookups);
  if (it->second->lookups == 0 && it->second->removed) by_ino_.erase(it);
}

std::shared_ptr<LayerFs::Node> LayerFs::FindByIno(uint64_t ino) {
  std::lock_guard lock(mu_);
  auto it = by_ino_.find(ino);
  return it == by_ino_.end() ? nullptr : it->second;
}

std::map<std::string, std::shared_ptr<LayerFs::Node>> LayerFs::List() {
  std::lock_guard lock(mu_);
  return by_name_;
}

}  // namespace strata::lazyfs
