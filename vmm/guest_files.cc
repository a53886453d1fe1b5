// Both kinds of file are written under a temporary name and renamed into
// place, so two launchers making the same one at once both end with a whole
// file and a reader never sees half of one.
#include "vmm/guest_files.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "common/dynlib.h"
#include "common/fs.h"
#include "common/hash.h"
#include "common/strings.h"
#include "common/subprocess.h"

namespace strata::vmm {

namespace {

// libarchive is loaded on first use (common/dynlib.h), as the API's tar
// bridge does: most launcher runs never make an initramfs.
struct CpioApi {
  Status status;
  decltype(&archive_write_new) write_new = nullptr;
  decltype(&archive_write_set_format_cpio_newc) set_format = nullptr;
  decltype(&archive_write_open_filename) open_filename = nullptr;
  decltype(&archive_write_header) write_header = nullptr;
  decltype(&archive_write_data) write_data = nullptr;
  decltype(&archive_write_close) write_close = nullptr;
  decltype(&archive_write_free) write_free = nullptr;
  decltype(&archive_error_string) error_string = nullptr;
  decltype(&archive_entry_new) entry_new = nullptr;
  decltype(&archive_entry_free) entry_free = nullptr;
  decltype(&archive_entry_set_pathname) set_pathname = nullptr;
  decltype(&archive_entry_set_filetype) set_filetype = nullptr;
  decltype(&archive_entry_set_perm) set_perm = nullptr;
  decltype(&archive_entry_set_size) set_size = nullptr;
  decltype(&archive_entry_set_rdev) set_rdev = nullptr;
  decltype(&archive_entry_set_nlink) set_nlink = nullptr;
};

const CpioApi& Cpio() {
  static const CpioApi api = [] {
    CpioApi a;
    auto lib = DynamicLibrary::Open(STRATA_ARCHIVE_SONAME, "libarchive13");
    if (!lib.ok()) {
      a.status = lib.status();
      return a;
    }
    auto get = [&](auto& fn, const char* name) {
      if (a.status.ok()) a.status = lib->Resolve(fn, name);
    };
    get(a.write_new, "archive_write_new");
    get(a.set_format, "archive_write_set_format_cpio_newc");
    get(a.open_filename, "archive_write_open_filename");
    get(a.write_header, "archive_write_header");
    get(a.write_data, "archive_write_data");
    get(a.write_close, "archive_write_close");
    get(a.write_free, "archive_write_free");
    get(a.error_string, "archive_error_string");
    get(a.entry_new, "archive_entry_new");
    get(a.entry_free, "archive_entry_free");
    get(a.set_pathname, "archive_entry_set_pathname");
    get(a.set_filetype, "archive_entry_set_filetype");
    get(a.set_perm, "archive_entry_set_perm");
    get(a.set_size, "archive_entry_set_size");
    get(a.set_rdev, "archive_entry_set_rdev");
    get(a.set_nlink, "archive_entry_set_nlink");
    return a;
  }();
  return api;
}

Status WriteCpio(const std::string& path, const std::string& init) {
  const CpioApi& api = Cpio();
  STRATA_RETURN_IF_ERROR(api.status);
  archive* a = api.write_new();
  if (!a) return Error(ENOMEM, "initramfs: archive_write_new");
  auto fail = [&](const char* step) {
    Status s = Error(EIO, StrCat("initramfs ", path, ": ", step, ": ", api.error_string(a) ? api.error_string(a) : "?"));
    api.write_free(a);
    return s;
  };
  if (api.set_format(a) != ARCHIVE_OK) return fail("cpio format");
  if (api.open_filename(a, path.c_str()) != ARCHIVE_OK) return fail("open");
  struct Item {
    const char* name;
    unsigned type;
    unsigned perm;
    dev_t rdev;
    const std::string* data;
  };
  const Item items[] = {
      {"dev", AE_IFDIR, 0755, 0, nullptr},           {"dev/console", AE_IFCHR, 0600, makedev(5, 1), nullptr},
      {"proc", AE_IFDIR, 0555, 0, nullptr},          {"sys", AE_IFDIR, 0555, 0, nullptr},
      {"mnt", AE_IFDIR, 0755, 0, nullptr},           {"init", AE_IFREG, 0755, 0, &init},
  };
  for (const Item& item : items) {
    archive_entry* e = api.entry_new();
    api.set_pathname(e, item.name);
    api.set_filetype(e, item.type);
    api.set_perm(e, item.perm);
    api.set_nlink(e, item.type == AE_IFDIR ? 2 : 1);
    if (item.type == AE_IFCHR) api.set_rdev(e, item.rdev);
    api.set_size(e, item.data ? static_cast<int64_t>(item.data->size()) : 0);
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

Result<std::string> EnsureInitramfs(const std::string& agent_binary, const std::string& cache_dir) {
  // The agent hashed once per (path, size, mtime) in this process: every
  // create asks.
  struct stat st{};
  if (::stat(agent_binary.c_str(), &st) != 0) return ErrnoError(errno, "initramfs: stat the agent " + agent_binary);
  const std::string key = StrCat(agent_binary, "\n", st.st_size, "\n", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "\n", cache_dir);
  static std::mutex mu;
  static std::map<std::string, std::string> made;
  {
    std::lock_guard lock(mu);
    if (auto it = made.find(key); it != made.end() && ::access(it->second.c_str(), R_OK) == 0) return it->second;
  }
  auto init = ReadFileToString(agent_binary);
  if (!init.ok()) return init.status().Annotate("initramfs: read the agent");
  const std::string path = StrCat(cache_dir, "/initramfs-", HashBytes(*init).Hex().substr(0, 16), ".cpio");
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
  Status s = WriteCpio(tmp, *init);
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
