// Filesystem helpers.
#include "common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/strings.h"

namespace strata {

Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(errno, StrCat("open ", path));
  return UniqueFd(fd);
}

Result<size_t> PreadFull(int fd, std::span<char> out, uint64_t offset) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, StrCat("pread at offset ", offset + done));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

Status PwriteFull(int fd, std::span<const char> data, uint64_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, StrCat("pwrite at offset ", offset + done));
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

Status WriteFull(int fd, std::span<const char> data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write");
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

Result<std::string> ReadFileToString(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, StrCat("read ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

namespace {
std::string RandomSuffix() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string s(10, 'x');
  for (auto& c : s) c = kChars[rng() % 36];
  return s;
}
}  // namespace

Status WriteFileAtomic(const std::string& path, std::string_view data, bool durable, mode_t mode) {
  std::string tmp = StrCat(path, ".tmp-", getpid(), "-", RandomSuffix());
  {
    STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp, O_WRONLY | O_CREAT | O_EXCL, mode));
    Status s = WriteFull(fd.get(), data);
    if (s.ok() && durable && ::fsync(fd.get()) != 0) s = ErrnoError(errno, "fsync");
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s.Annotate(StrCat("write ", tmp));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = ErrnoError(errno, StrCat("rename ", tmp, " to ", path));
    ::unlink(tmp.c_str());
    return s;
  }
  return OkStatus();
}

Status MakeDirs(const std::string& path, mode_t mode) {
  if (path.empty()) return OkStatus();
  if (::mkdir(path.c_str(), mode) == 0) return OkStatus();
  if (errno == EEXIST) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return OkStatus();
    return Error(ENOTDIR, StrCat("mkdir ", path, ": exists and is not a directory"));
  }
  if (errno != ENOENT) return ErrnoError(errno, StrCat("mkdir ", path));
  // Missing parents get 0755, as `mkdir -p` makes them: a private leaf
  // (0700) must not make its parents private too, which would shut every
  // other user out of their siblings (a sandbox's mapped root out of
  // /run/strata/sandboxes when /run/strata/claims came first).
  std::string parent = Dirname(path);
  if (parent != path) STRATA_RETURN_IF_ERROR(MakeDirs(parent, 0755));
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) return ErrnoError(errno, StrCat("mkdir ", path));
  return OkStatus();
}

namespace {

Status RemoveAt(int parent_fd, const std::string& name, const std::string& display, dev_t dev) {
  struct stat st;
  if (::fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoError(errno, StrCat("stat ", display));
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoError(errno, StrCat("unlink ", display));
    }
    return OkStatus();
  }
  if (st.st_dev != dev) return Error(EBUSY, StrCat("remove ", display, ": another filesystem is mounted there"));
  int fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, StrCat("open ", display));
  DIR* dir = ::fdopendir(fd);
  if (!dir) {
    ::close(fd);
    return ErrnoError(errno, StrCat("opendir ", display));
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  Status status;
  for (const auto& n : names) {
    status = RemoveAt(::dirfd(dir), n, display + "/" + n, dev);
    if (!status.ok()) break;
  }
  ::closedir(dir);
  STRATA_RETURN_IF_ERROR(status);
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return ErrnoError(errno, StrCat("rmdir ", display));
  }
  return OkStatus();
}

}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoError(errno, StrCat("stat ", path));
  }
  std::string parent = Dirname(path);
  int parent_fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent_fd < 0) return ErrnoError(errno, StrCat("open ", parent));
  Status s = RemoveAt(parent_fd, Basename(path), path, st.st_dev);
  ::close(parent_fd);
  return s;
}

Result<TempDir> TempDir::Create(std::string_view prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = StrCat(base && *base ? base : "/tmp", "/", prefix, "-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoError(errno, StrCat("mkdtemp ", tmpl));
  return TempDir(tmpl);
}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    if (!path_.empty()) RemoveTree(path_).IgnoreError();
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

TempDir::~TempDir() {
  if (!path_.empty()) RemoveTree(path_).IgnoreError();
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  std::string out(a);
  if (out.back() != '/') out.push_back('/');
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  out.append(b);
  return out;
}

std::string Dirname(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t pos = path.rfind('/');
  if (pos == std::string_view::npos) return ".";
  if (pos == 0) return "/";
  return std::string(path.substr(0, pos));
}

std::string Basename(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t pos = path.rfind('/');
  if (pos == std::string_view::npos) return std::string(path);
  return std::string(path.substr(pos + 1));
}

std::string BootId() {
  auto s = ReadFileToString("/proc/sys/kernel/random/boot_id");
  if (!s.ok()) return "";
  std::string id = *s;
  while (!id.empty() && id.back() == '\n') id.pop_back();
  return id;
}

}  // namespace strata
