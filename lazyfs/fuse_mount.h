// FuseMount: a libfuse low-level session mounted at a directory and served
// on libfuse's multi-threaded loop. Both lazyfs filesystems (LayerFs, the
// kernel mode's metadata and blob files, and TreeFs, the fuse mode's layer
// trees) run on one.
//
// Takeover. A mount's /dev/fuse descriptor may outlive the process serving
// it (the supervisor keeps a copy: lazyfs/supervisor.h). A new process
// adopts the connection with Adopt(): libfuse 3.14 answers every request
// before its own INIT with an error and cannot be handed a connection the
// kernel has initialised, so each mount records the kernel's INIT request
// and libfuse's reply as they pass (init()), and Adopt() replays that INIT
// to the new session through libfuse's custom I/O hooks — the reply is
// swallowed, not sent: the kernel negotiated once — so libfuse's session
// state is what it was. Then FUSE_NOTIFY_RESEND (Linux 6.9) asks the
// kernel to queue again every request the dead process had read but not
// answered; without it those readers wait until the connection is aborted.
#pragma once

#include <sys/types.h>

#include <cxxabi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

struct fuse_session;
struct fuse_lowlevel_ops;
struct fuse_req;
struct iovec;

namespace strata::lazyfs {

struct FuseMountOptions {
  // libfuse `-o` options, e.g. "fsname=lazyfs", "ro", "default_permissions".
  std::vector<std::string> options;
  int max_threads = 64;
  int max_idle_threads = 8;
};

// The connection's INIT as it passed: the kernel's request and libfuse's
// reply, bytes as on /dev/fuse.
struct FuseInit {
  std::string request;
  std::string reply;
};

class FuseMount {
 public:
  // Creates the session with `ops` (which must outlive the mount) and
  // `userdata` (what Owner() returns for its requests), mounts it at
  // `mountpoint` (created if missing) and starts the loop. Returns once the
  // kernel's INIT is answered.
  static Result<std::unique_ptr<FuseMount>> Start(const std::string& mountpoint, const fuse_lowlevel_ops& ops,
                                                  void* userdata, const FuseMountOptions& options);
  // Serves the connection `fd` of the mount at `mountpoint`, which another
  // process served and initialised with `init` (see above). The options
  // must be those the mount was started with; a replayed INIT whose reply
  // differs from the recorded one is refused.
  static Result<std::unique_ptr<FuseMount>> Adopt(const std::string& mountpoint, UniqueFd fd, FuseInit init,
                                                  const fuse_lowlevel_ops& ops, void* userdata,
                                                  const FuseMountOptions& options);
  // Unmounts and waits for the loop to end. It never hangs: when something
  // still holds the superblock (an open file under a detached mount, a
  // bind mount elsewhere), the connection is aborted through fusectl after
  // a second, and those users get ENOTCONN from then on.
  ~FuseMount();
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  // The `userdata` of the mount a request or an init callback belongs to.
  static void* Owner(fuse_req* req);
  static void* OwnerOfSession(void* session_userdata);

  const std::string& mountpoint() const { return mountpoint_; }
  // The mount's device (st_dev of its root).
  dev_t device() const { return device_; }
  // The /dev/fuse descriptor (for the supervisor to keep a copy).
  int fd() const;
  const FuseInit& init() const { return init_; }
  // Whether the kernel took FUSE_NOTIFY_RESEND (Adopt only).
  bool resent() const { return resent_; }

 private:
  FuseMount() = default;
  static Result<std::unique_ptr<FuseMount>> Create(const std::string& mountpoint, const fuse_lowlevel_ops& ops,
                                                   void* userdata, const FuseMountOptions& options);
  void StartLoop(const FuseMountOptions& options);
  bool WaitForLoop(std::chrono::milliseconds timeout);
  // libfuse's custom I/O (see above).
  static ssize_t Read(int fd, void* buf, size_t len, void* userdata);
  static ssize_t Writev(int fd, ::iovec* iov, int count, void* userdata);

  std::string mountpoint_;
  void* userdata_ = nullptr;
  dev_t device_ = 0;
  fuse_session* session_ = nullptr;
  std::thread loop_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool loop_done_ = false;
  // INIT: recorded as it passes (Start) or replayed (Adopt); guarded by mu_.
  FuseInit init_;
  uint64_t init_unique_ = 0;
  bool replaying_ = false;   // Adopt: the recorded INIT goes to the session first
  bool replay_read_ = false;  // the session has read it
  // The reply has passed (Start) or been swallowed (Adopt); from then on
  // Read and Writev go straight to the device.
  std::atomic<bool> init_done_{false};
  std::string replay_reply_;
  bool resent_ = false;
};

// Aborts the FUSE connection of the mount with device `device` (writes to
// /sys/fs/fuse/connections/N/abort, mounting fusectl there first if
// needed): its pending and future requests fail with ENOTCONN.
Status AbortFuseConnection(dev_t device);

// The one exception boundary of every FUSE operation of both filesystems:
// runs `body`; whatever it throws is answered here (ENOMEM, or EIO and a
// log line), so nothing thrown crosses into libfuse. A cancelled thread's
// forced unwind is not an error and goes on up.
void ReplyToException(fuse_req* req, std::exception_ptr thrown);
template <typename F>
void Guard(fuse_req* req, F&& body) {
  try {
    body();
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    ReplyToException(req, std::current_exception());
  }
}

}  // namespace strata::lazyfs
