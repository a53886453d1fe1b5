// Filesystem helpers with errors that name the path and the step.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata {

// open(2) that retries EINTR; the error names `path`.
Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode = 0644);

// Reads or writes exactly the whole span, retrying short transfers and
// EINTR. ReadFull returns the bytes read, short only at end of file.
Result<size_t> PreadFull(int fd, std::span<char> out, uint64_t offset);
Status PwriteFull(int fd, std::span<const char> data, uint64_t offset);
Status WriteFull(int fd, std::span<const char> data);

Result<std::string> ReadFileToString(const std::string& path);

// Writes `data` to a temporary file beside `path`, fsyncs it when `durable`,
// and renames it over `path`: readers see the old file or the new one,
// never a part.
// The file gets `mode` (less the umask).
Status WriteFileAtomic(const std::string& path, std::string_view data, bool durable = true, mode_t mode = 0644);

// mkdir -p: `path` gets `mode`, any missing parent 0755 (both less the
// umask). Existing directories are fine and keep their mode.
Status MakeDirs(const std::string& path, mode_t mode = 0755);

// rm -rf that never follows symlinks and never crosses into another
// filesystem (a mount left below `path` makes it fail instead of emptying
// the mount). A missing path is fine.
Status RemoveTree(const std::string& path);

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on
// destruction.
class TempDir {
 public:
  static Result<TempDir> Create(std::string_view prefix = "strata");
  // Takes ownership of an existing directory (e.g. from mkdtemp elsewhere).
  static TempDir Adopt(std::string path) { return TempDir(std::move(path)); }
  TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::string& path() const { return path_; }
  std::string Sub(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// "a/b" + "c" -> "a/b/c".
std::string JoinPath(std::string_view a, std::string_view b);
std::string Dirname(std::string_view path);
std::string Basename(std::string_view path);

// This boot's id (/proc/sys/kernel/random/boot_id), "" if unreadable:
// what was written in an earlier boot is told by it.
std::string BootId();

}  // namespace strata
