// Both kinds of file are written under a temporary name and renamed into
// place, so two launchers making the same one at once both end with a whole
// file and a reader never sees half of one.
#include "vmm/guest_files.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "common/archive_api.h"
#include "common/fs.h"
#include "common/hash.h"
#include "common/strings.h"
#include "common/subprocess.h"

namespace strata::vmm {

namespace {

Status WriteCpio(const std::string& path, const std::string& init, const std::vector<InitramfsFile>& files) {
  const ArchiveApi& api = Archive();
  STRATA_RETURN_IF_ERROR(api.status);
  archive* a = api.write_new();
  if (!a) return Error(ENOMEM, "initramfs: archive_write_new");
  auto fail = [&](const char* step) {
    Status s = Error(EIO, StrCat("initramfs ", path, ": ", step, ": ", api.error_string(a) ? api.error_string(a) : "?"));
    api.write_free(a);
    return s;
  };
  if (api.write_set_format_cpio_newc(a) != ARCHIVE_OK) return fail("cpio format");
  if (api.write_open_filename(a, path.c_str()) != ARCHIVE_OK) return fail("open");
  struct Item {
    const char* name;
    unsigned type;
    unsigned perm;
    dev_t rdev;
    const std::string* data;
  };
  std::vector<Item> items = {
      {"dev", AE_IFDIR, 0755, 0, nullptr},           {"dev/console", AE_IFCHR, 0600, makedev(5, 1), nullptr},
      {"proc", AE_IFDIR, 0555, 0, nullptr},          {"sys", AE_IFDIR, 0555, 0, nullptr},
      {"mnt", AE_IFDIR, 0755, 0, nullptr},           {"init", AE_IFREG, 0755, 0, &init},
  };
  for (const auto& f : files) items.push_back({f.name.c_str(), AE_IFREG, 0644, 0, &f.data});
  for (const Item& item : items) {
    archive_entry* e = api.entry_new();
    api.entry_set_pathname(e, item.name);
    api.entry_set_filetype(e, item.type);
    api.entry_set_perm(e, item.perm);
    api.entry_set_nlink(e, item.type == AE_IFDIR ? 2 : 1);
    if (item.type == AE_IFCHR) api.entry_set_rdev(e, item.rdev);
    api.entry_set_size(e, item.data ? static_cast<int64_t>(item.data->size()) : 0);
    int r = api.write_header(a, e);
    api.entry_free(e);
    if (r != ARCHIVE_OK) return fail(item.name);
    if (item.data && api.write_data(a, item.data->data(), item.data->size()) != static_cast<ssize_t>(item.data->size())) {
      return fail(item.name);
    }
  }
  if (api.write_close(a) != ARCHIVE_OK) return fail("close");
  api.write_free(a);
  return OkStatus();
}

}  // namespace

Result<std::string> EnsureInitramfs(const std::string& agent_binary, const std::vector<InitramfsFile>& files,
                                    const std::string& cache_dir) {
  for (const auto& f : files) {
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "init") {
      return Error(EINVAL, "initramfs: a file named \"" + f.name + "\" (a name at the root, not init)");
    }
  }
  // The agent hashed once per (path, size, mtime) in this process: every
  // create asks. (The other files are small.)
  struct stat st{};
  if (::stat(agent_binary.c_str(), &st) != 0) return ErrnoError(errno, "initramfs: stat the agent " + agent_binary);
  std::string extras;
  for (const auto& f : files) extras += StrCat(f.name, "\n", f.data.size(), "\n", f.data);
  const std::string key = StrCat(agent_binary, "\n", st.st_size, "\n", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "\n", cache_dir,
                                 "\n", HashBytes(extras).Hex());
  static std::mutex mu;
  static std::map<std::string, std::string> made;
  {
    std::lock_guard lock(mu);
    if (auto it = made.find(key); it != made.end() && ::access(it->second.c_str(), R_OK) == 0) return it->second;
  }
  auto init = ReadFileToString(agent_binary);
  if (!init.ok()) return init.status().Annotate("initramfs: read the agent");
  const std::string path = StrCat(cache_dir, "/initramfs-", HashBytes(*init + extras).Hex().substr(0, 16), ".cpio");
  auto remember = [&] {
    std::lock_guard lock(mu);
    made[key] = path;
  };
  if (::access(path.c_str(), R_OK) == 0) {
    remember();
    return path;
  }
  STRATA_RETURN_IF_ERROR(MakeDirs(cache_dir, 0755));
  const std::string tmp = StrCat(path, ".tmp.", ::getpid(), ".", ::gettid());  // (one per thread)
  Status s = WriteCpio(tmp, *init, files);
  if (s.ok() && ::chmod(tmp.c_str(), 0644) != 0) s = ErrnoError(errno, "chmod " + tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoError(errno, "rename " + tmp);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  remember();
  return path;
}

Result<std::string> EnsureExt4Template(const std::string& dir, uint64_t bytes) {
  if (bytes < (uint64_t{16} << 20)) return Error(EINVAL, StrCat("upper disk of ", bytes, " bytes: at least 16 MiB"));
  // ("v2": the options below; a template of other options is another file.)
  const std::string path = StrCat(dir, "/ext4-v2-", bytes, ".img");
  if (::access(path.c_str(), R_OK) == 0) return path;
  STRATA_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  const std::string tmp = StrCat(path, ".tmp.", ::getpid(), ".", ::gettid());  // (one per thread)
  Status s;
  {
    auto fd = OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!fd.ok()) return fd.status().Annotate("upper disk template");
    if (::ftruncate(fd->get(), static_cast<off_t>(bytes)) != 0) s = ErrnoError(errno, "truncate " + tmp);
  }
  // No lazy initialisation (a guest would write its inode tables over its
  // first minutes); no reserved blocks (one user). No journal and no
  // metadata checksums: the disk dies with its VM (a crash loses nothing
  // anyone keeps), a snapshot freezes the filesystem first, and both cost
  // a guest under TCG time at every mount and write.
  if (s.ok()) {
    s = RunChecked({.argv = {"mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal,^metadata_csum", "-E",
                             "lazy_itable_init=0,lazy_journal_init=0,nodiscard", "-L", "strata-upper", tmp},
                    .timeout = std::chrono::minutes(2)},
                   "make the upper disk template")
            .status();
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoError(errno, "rename " + tmp);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return path;
}

Status CloneFile(const std::string& source, const std::string& target) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd in, OpenFile(source, O_RDONLY));
  STRATA_ASSIGN_OR_RETURN(UniqueFd out, OpenFile(target, O_WRONLY | O_CREAT | O_EXCL, 0600));
  if (::ioctl(out.get(), FICLONE, in.get()) != 0) {
    int e = errno;
    ::unlink(target.c_str());
    return ErrnoError(e, StrCat("reflink ", source, " to ", target));
  }
  return OkStatus();
}

}  // namespace strata::vmm
