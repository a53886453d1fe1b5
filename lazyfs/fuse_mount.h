// FuseMount: a libfuse low-level session mounted at a directory and served
// on libfuse's multi-threaded loop. Both lazyfs filesystems (LayerFs, the
// kernel mode's metadata and blob files, and TreeFs, the fuse mode's layer
// trees) run on one.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

struct fuse_session;
struct fuse_lowlevel_ops;

namespace strata::lazyfs {

struct FuseMountOptions {
  // libfuse `-o` options, e.g. "fsname=lazyfs", "ro", "default_permissions".
  std::vector<std::string> options;
  int max_threads = 64;
  int max_idle_threads = 8;
};

class FuseMount {
 public:
  // Creates the session with `ops` (which must outlive the mount) and
  // `userdata` (what fuse_req_userdata returns), mounts it at `mountpoint`
  // (created if missing) and starts the loop.
  static Result<std::unique_ptr<FuseMount>> Start(const std::string& mountpoint, const fuse_lowlevel_ops& ops,
                                                  void* userdata, const FuseMountOptions& options);
  // Unmounts and waits for the loop to end. It never hangs: when something
  // still holds the superblock (an open file under a detached mount, a
  // bind mount elsewhere), the connection is aborted through fusectl after
  // a second, and those users get ENOTCONN from then on.
  ~FuseMount();
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  const std::string& mountpoint() const { return mountpoint_; }
  // The mount's device (st_dev of its root).
  dev_t device() const { return device_; }

 private:
  FuseMount() = default;
  bool WaitForLoop(std::chrono::milliseconds timeout);

  std::string mountpoint_;
  dev_t device_ = 0;
  fuse_session* session_ = nullptr;
  std::thread loop_;
  std::mutex mu_;
  std::condition_variable loop_done_cv_;
  bool loop_done_ = false;
};

// Aborts the FUSE connection of the mount with device `device` (writes to
// /sys/fs/fuse/connections/N/abort, mounting fusectl there first if
// needed): its pending and future requests fail with ENOTCONN.
Status AbortFuseConnection(dev_t device);

}  // namespace strata::lazyfs
