// FuseMount: mounting, serving and — above all — always unmounting.
#define FUSE_USE_VERSION 312
#include "lazyfs/fuse_mount.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>

#include "common/fs.h"
#include "common/log.h"
#include "common/mount.h"
#include "common/strings.h"

namespace strata::lazyfs {

namespace {
constexpr const char* kFuseConnections = "/sys/fs/fuse/connections";
}

Status AbortFuseConnection(dev_t device) {
  // fusectl names a connection by the kernel's dev_t (major << 20 | minor),
  // not by glibc's encoding of st_dev.
  const std::string dir = StrCat(kFuseConnections, "/", (uint64_t{major(device)} << 20) | minor(device));
  if (::access(dir.c_str(), F_OK) != 0 && !IsMountPoint(kFuseConnections)) {
    if (::mount("fusectl", kFuseConnections, "fusectl", 0, nullptr) != 0) {
      return ErrnoError(errno, StrCat("mount fusectl at ", kFuseConnections));
    }
  }
  if (::access(dir.c_str(), F_OK) != 0) return OkStatus();  // the connection is gone already
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(dir + "/abort", O_WRONLY));
  return WriteFull(fd.get(), std::string_view("1")).Annotate(StrCat("abort FUSE connection ", dir));
}

Result<std::unique_ptr<FuseMount>> FuseMount::Start(const std::string& mountpoint, const fuse_lowlevel_ops& ops,
                                                    void* userdata, const FuseMountOptions& options) {
  STRATA_RETURN_IF_ERROR(MakeDirs(mountpoint));
  std::unique_ptr<FuseMount> m(new FuseMount());
  m->mountpoint_ = mountpoint;
  std::vector<std::string> argv_storage = {"lazyfs"};
  for (const auto& o : options.options) {
    argv_storage.push_back("-o");
    argv_storage.push_back(o);
  }
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  m->session_ = fuse_session_new(&args, &ops, sizeof ops, userdata);
  fuse_opt_free_args(&args);
  if (!m->session_) return Error(EIO, StrCat("start FUSE session for ", mountpoint, " (options ", Join(options.options, ","), ")"));
  if (fuse_session_mount(m->session_, mountpoint.c_str()) != 0) {
    fuse_session_destroy(m->session_);
    m->session_ = nullptr;
    return Error(EIO, StrCat("mount FUSE at ", mountpoint, " (is /dev/fuse there and the fuse module loaded?)"));
  }
  fuse_session* se = m->session_;
  FuseMount* self = m.get();
  const int max_threads = options.max_threads, max_idle = options.max_idle_threads;
  m->loop_ = std::thread([se, self, max_threads, max_idle] {
    fuse_loop_config* config = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(config, static_cast<unsigned>(max_threads));
    fuse_loop_cfg_set_idle_threads(config, static_cast<unsigned>(max_idle));
    fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
    std::lock_guard lock(self->mu_);
    self->loop_done_ = true;
    self->loop_done_cv_.notify_all();
  });
  // The device names the connection should it ever need aborting. The
  // kernel answers this stat itself until INIT is through, then asks us;
  // the loop is running by now.
  struct stat st;
  if (::stat(mountpoint.c_str(), &st) == 0) m->device_ = st.st_dev;
  return m;
}

bool FuseMount::WaitForLoop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return loop_done_cv_.wait_for(lock, timeout, [&] { return loop_done_; });
}

FuseMount::~FuseMount() {
  if (!session_) return;
  fuse_session_exit(session_);
  // A plain unmount ends the connection and with it the loop's reads of
  // /dev/fuse. When the mount is busy, detach it: whoever holds it keeps
  // being served until the abort below.
  if (::umount2(mountpoint_.c_str(), 0) != 0 && errno != EINVAL) {
    if (errno == EBUSY) {
      STRATA_LOG(kWarn) << "lazyfs: " << mountpoint_ << " is busy; detaching it";
    } else {
      STRATA_LOG(kWarn) << "lazyfs: unmount " << mountpoint_ << ": " << std::strerror(errno);
    }
    ::umount2(mountpoint_.c_str(), MNT_DETACH);
  }
  if (!WaitForLoop(std::chrono::seconds(1))) {
    // Still served: a detached mount is in use or the superblock is
    // mounted elsewhere too. Cut the connection so the loop can end.
    if (device_ != 0) {
      Status s = AbortFuseConnection(device_);
      if (!s.ok()) STRATA_LOG(kWarn) << "lazyfs: " << s.ToString();
    }
    if (!WaitForLoop(std::chrono::seconds(10))) {
      // Leak the session rather than free memory its threads still use.
      STRATA_LOG(kError) << "lazyfs: the FUSE loop of " << mountpoint_ << " does not end; leaving it behind";
      loop_.detach();
      return;
    }
  }
  loop_.join();
  fuse_session_unmount(session_);  // closes /dev/fuse; the mount is gone already
  fuse_session_destroy(session_);
}

}  // namespace strata::lazyfs
