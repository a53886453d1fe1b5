// The files a microVM boots from and writes to, made once per node and
// reused: the initramfs (the agent as /init) and ready-made ext4 images
// for upper disks, copied per VM by reflink (no mkfs per VM).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::vmm {

inline constexpr const char* kDefaultGuestCache = "/var/cache/strata/vm";

// A file of the initramfs besides /init: its name at the root, mode 0644.
struct InitramfsFile {
  std::string name;
  std::string data;
};

// An initramfs (cpio "newc", written with libarchive) whose /init is
// `agent_binary`, with /dev/console, the mount points the agent uses and
// `files`. Cached in `cache_dir` by the hash of what it holds; returns its
// path.
Result<std::string> EnsureInitramfs(const std::string& agent_binary, const std::vector<InitramfsFile>& files = {},
                                    const std::string& cache_dir = kDefaultGuestCache);

// An empty ext4 filesystem image of `bytes` (sparse) in `dir`, made once
// per size with mkfs.ext4 (every inode table written, so guests never
// initialise it lazily); returns its path.
Result<std::string> EnsureExt4Template(const std::string& dir, uint64_t bytes);

// Copies `source` to `target` sharing its extents (FICLONE: btrfs, XFS);
// EOPNOTSUPP on a filesystem that cannot. `target` must not exist.
Status CloneFile(const std::string& source, const std::string& target);

}  // namespace strata::vmm
