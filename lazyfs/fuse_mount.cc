// FuseMount: mounting, serving and — above all — always unmounting.
#define FUSE_USE_VERSION 312
#include "lazyfs/fuse_mount.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <sys/uio.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <new>

#include "common/fs.h"
#include "common/log.h"
#include "common/mount.h"
#include "common/strings.h"

namespace strata::lazyfs {

namespace {
constexpr const char* kFuseConnections = "/sys/fs/fuse/connections";
// Not in this system's <linux/fuse.h> yet (Linux 6.9).
constexpr int32_t kFuseNotifyResend = 7;
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

Result<std::unique_ptr<FuseMount>> FuseMount::Create(const std::string& mountpoint, const fuse_lowlevel_ops& ops,
                                                     void* userdata, const FuseMountOptions& options) {
  std::unique_ptr<FuseMount> m(new FuseMount());
  m->mountpoint_ = mountpoint;
  m->userdata_ = userdata;
  std::vector<std::string> argv_storage = {"lazyfs"};
  for (const auto& o : options.options) {
    argv_storage.push_back("-o");
    argv_storage.push_back(o);
  }
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  // The session's userdata is the FuseMount: the custom I/O hooks get it;
  // the filesystem's operations reach theirs through Owner().
  m->session_ = fuse_session_new(&args, &ops, sizeof ops, m.get());
  fuse_opt_free_args(&args);
  if (!m->session_) return Error(EIO, StrCat("start FUSE session for ", mountpoint, " (options ", Join(options.options, ","), ")"));
  return m;
}

namespace {
const fuse_custom_io* CustomIo(ssize_t (*read)(int, void*, size_t, void*), ssize_t (*writev)(int, iovec*, int, void*)) {
  static const fuse_custom_io hooks = [&] {
    fuse_custom_io io{};
    io.read = read;
    io.writev = writev;
    return io;
  }();
  return &hooks;
}
}  // namespace

void FuseMount::StartLoop(const FuseMountOptions& options) {
  fuse_session* se = session_;
  const int max_threads = options.max_threads, max_idle = options.max_idle_threads;
  loop_ = std::thread([se, this, max_threads, max_idle] {
    fuse_loop_config* config = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(config, static_cast<unsigned>(max_threads));
    fuse_loop_cfg_set_idle_threads(config, static_cast<unsigned>(max_idle));
    fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
    std::lock_guard lock(mu_);
    loop_done_ = true;
    cv_.notify_all();
  });
}

Result<std::unique_ptr<FuseMount>> FuseMount::Start(const std::string& mountpoint, const fuse_lowlevel_ops& ops,
                                                    void* userdata, const FuseMountOptions& options) {
  STRATA_RETURN_IF_ERROR(MakeDirs(mountpoint));
  STRATA_ASSIGN_OR_RETURN(auto m, Create(mountpoint, ops, userdata, options));
  if (fuse_session_mount(m->session_, mountpoint.c_str()) != 0) {
    fuse_session_destroy(m->session_);
    m->session_ = nullptr;
    return Error(EIO, StrCat("mount FUSE at ", mountpoint, " (is /dev/fuse there and the fuse module loaded?)"));
  }
  if (fuse_session_custom_io(m->session_, CustomIo(&FuseMount::Read, &FuseMount::Writev), fuse_session_fd(m->session_)) != 0) {
    ::umount2(mountpoint.c_str(), MNT_DETACH);
    fuse_session_destroy(m->session_);
    m->session_ = nullptr;
    return Error(EIO, StrCat("FUSE at ", mountpoint, ": libfuse refused its custom I/O"));
  }
  m->StartLoop(options);
  {
    // The kernel sent INIT at mount; the loop answers it (and Read and
    // Writev record both) before anything else.
    std::unique_lock lock(m->mu_);
    if (!m->cv_.wait_for(lock, std::chrono::seconds(10), [&] { return m->init_done_.load() || m->loop_done_; }) || !m->init_done_.load()) {
      lock.unlock();
      return Error(EIO, StrCat("FUSE at ", mountpoint, ": the kernel's INIT was not answered"));  // ~FuseMount cleans up
    }
  }
  // The device names the connection should it ever need aborting.
  struct stat st;
  if (::stat(mountpoint.c_str(), &st) == 0) m->device_ = st.st_dev;
  return m;
}

Result<std::unique_ptr<FuseMount>> FuseMount::Adopt(const std::string& mountpoint, UniqueFd fd, FuseInit init,
                                                    const fuse_lowlevel_ops& ops, void* userdata,
                                                    const FuseMountOptions& options) {
  const std::string what = StrCat("take over FUSE mount ", mountpoint);
  if (init.request.size() < sizeof(fuse_in_header) || init.reply.size() < sizeof(fuse_out_header)) {
    return Error(EINVAL, StrCat(what, ": no recorded INIT"));
  }
  fuse_in_header in;
  std::memcpy(&in, init.request.data(), sizeof in);
  if (in.opcode != FUSE_INIT || in.len != init.request.size()) return Error(EINVAL, StrCat(what, ": the recorded INIT is malformed"));
  // Nothing here may touch the mount (not even a stat of its root) before
  // the loop serves it: nobody else answers for it.
  STRATA_ASSIGN_OR_RETURN(auto m, Create(mountpoint, ops, userdata, options));
  m->init_ = std::move(init);
  m->init_unique_ = in.unique;
  m->replaying_ = true;
  const int raw = fd.get();
  if (fuse_session_custom_io(m->session_, CustomIo(&FuseMount::Read, &FuseMount::Writev), raw) != 0) {
    fuse_session_destroy(m->session_);  // closes nothing of ours: se->fd was not set
    m->session_ = nullptr;
    return Error(EIO, StrCat(what, ": libfuse refused its custom I/O"));
  }
  fd.release();  // the session closes it
  // Every request the previous process read and never answered goes back
  // to the queue, marked as resent; the loop below reads them first.
  fuse_out_header resend{};
  resend.len = sizeof resend;
  resend.error = kFuseNotifyResend;
  resend.unique = 0;
  if (::write(raw, &resend, sizeof resend) == static_cast<ssize_t>(sizeof resend)) {
    m->resent_ = true;
  } else {
    STRATA_LOG(kWarn) << "lazyfs: " << mountpoint << ": the kernel refused FUSE_NOTIFY_RESEND (" << std::strerror(errno)
                      << ", Linux 6.9 has it): requests the previous process had read are not answered";
  }
  m->StartLoop(options);
  {
    std::unique_lock lock(m->mu_);
    if (!m->cv_.wait_for(lock, std::chrono::seconds(10), [&] { return m->init_done_.load() || m->loop_done_; }) || !m->init_done_.load()) {
      lock.unlock();
      return Error(EIO, StrCat(what, ": libfuse did not take the replayed INIT"));
    }
  }
  {
    std::lock_guard lock(m->mu_);
    if (m->loop_done_) return Error(EIO, StrCat(what, ": libfuse ended the session at the replayed INIT"));
  }
  // The loop serves now: the root's device, so a failure below can cut the
  // connection (~FuseMount) rather than leave its readers waiting.
  struct stat st;
  if (::stat(mountpoint.c_str(), &st) == 0) m->device_ = st.st_dev;
  if (m->replay_reply_ != m->init_.reply) {
    // The new session would not speak as the kernel was told (other
    // options, another libfuse): serving on would corrupt replies.
    return Error(EPROTO, StrCat(what, ": this libfuse session answers INIT differently than the one that mounted it"));
  }
  return m;
}

void ReplyToException(fuse_req* req, std::exception_ptr thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (const std::exception& e) {
    STRATA_LOG(kError) << "lazyfs: FUSE operation failed: " << e.what();
    fuse_reply_err(req, EIO);
  } catch (...) {
    STRATA_LOG(kError) << "lazyfs: FUSE operation failed: something not an exception was thrown";
    fuse_reply_err(req, EIO);
  }
}

void* FuseMount::Owner(fuse_req* req) { return static_cast<FuseMount*>(fuse_req_userdata(req))->userdata_; }
void* FuseMount::OwnerOfSession(void* session_userdata) { return static_cast<FuseMount*>(session_userdata)->userdata_; }

int FuseMount::fd() const { return session_ ? fuse_session_fd(session_) : -1; }

ssize_t FuseMount::Read(int fd, void* buf, size_t len, void* userdata) {
  auto* m = static_cast<FuseMount*>(userdata);
  if (m->init_done_.load(std::memory_order_acquire)) return ::read(fd, buf, len);
  {
    std::unique_lock lock(m->mu_);
    if (m->replaying_ && !m->replay_read_) {
      m->replay_read_ = true;
      const std::string& init = m->init_.request;
      if (len < init.size()) {
        errno = EINVAL;
        return -1;
      }
      std::memcpy(buf, init.data(), init.size());
      return static_cast<ssize_t>(init.size());
    }
    // Until the session has taken INIT it answers anything else with EIO.
    if (m->replaying_) m->cv_.wait(lock, [&] { return m->init_done_.load(); });
  }
  ssize_t n = ::read(fd, buf, len);
  if (n >= static_cast<ssize_t>(sizeof(fuse_in_header))) {
    fuse_in_header in;
    std::memcpy(&in, buf, sizeof in);
    if (in.opcode == FUSE_INIT) {
      std::lock_guard lock(m->mu_);
      if (m->init_.request.empty()) {
        m->init_.request.assign(static_cast<const char*>(buf), static_cast<size_t>(n));
        m->init_unique_ = in.unique;
      }
    }
  }
  return n;
}

ssize_t FuseMount::Writev(int fd, ::iovec* iov, int count, void* userdata) {
  auto* m = static_cast<FuseMount*>(userdata);
  if (m->init_done_.load(std::memory_order_acquire)) return ::writev(fd, iov, count);
  if (count > 0 && iov[0].iov_len >= sizeof(fuse_out_header)) {
    fuse_out_header out;
    std::memcpy(&out, iov[0].iov_base, sizeof out);
    std::unique_lock lock(m->mu_);
    if (!m->init_done_ && m->init_unique_ != 0 && out.unique == m->init_unique_) {
      std::string bytes;
      for (int i = 0; i < count; ++i) bytes.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
      if (m->replaying_) {
        // The kernel negotiated once; this reply only rebuilt our session.
        m->replay_reply_ = std::move(bytes);
        m->init_done_ = true;
        m->cv_.notify_all();
        return static_cast<ssize_t>(m->replay_reply_.size());
      }
      m->init_.reply = bytes;
      lock.unlock();
      ssize_t n = ::writev(fd, iov, count);
      lock.lock();
      m->init_done_ = true;
      m->cv_.notify_all();
      return n;
    }
  }
  return ::writev(fd, iov, count);
}

bool FuseMount::WaitForLoop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return loop_done_; });
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
