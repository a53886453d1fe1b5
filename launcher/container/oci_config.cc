// OCI config.json for container sandboxes.
#include "launcher/container/oci_config.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <system_error>
#include <thread>
#include <vector>

#include <linux/magic.h>

#include "common/fs.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "launcher/sandbox/seccomp.h"

namespace strata::launcher {

using nlohmann::json;

json OciConfig(const ContainerConfig& c) {
  // Capabilities of the usual container default: enough for package
  // managers and servers, none that reach the host.
  json caps = {"CAP_CHOWN",   "CAP_DAC_OVERRIDE", "CAP_FSETID",     "CAP_FOWNER",     "CAP_MKNOD",
                     "CAP_NET_RAW", "CAP_SETGID",       "CAP_SETUID",     "CAP_SETFCAP",    "CAP_SETPCAP",
                     "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"};
  // The agent also holds CAP_SYS_ADMIN (in the container's user namespace)
  // to give a command the mount namespace its file rules need, and a
  // function-call agent CAP_NET_ADMIN for each call's network; every
  // command runs without them, under the default seccomp profile.
  caps.push_back("CAP_SYS_ADMIN");
  if (c.fncall) caps.push_back("CAP_NET_ADMIN");
  // Masked files are bound to /dev/null by the runtime; masked directories
  // get, from crun, the node's empty directory, bound read-only (the
  // runtime would mount a tmpfs, a superblock, on each: what others do,
  // which refuse a bind inside /proc). Only those the node has: the
  // sandbox's /proc and /sys show the same entries.
  json masked = json::array(), readonly = json::array(), mask_mounts = json::array();
  if (!c.fncall) {  // a function call's agent applies them to each call's own /proc
    for (const char* p : kMaskedPaths) {
      struct stat st;
      if (c.crun && ::stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
        mask_mounts.push_back({{"destination", p}, {"type", "bind"}, {"source", c.mask_dir},
                               {"options", {"bind", "ro", "nosuid", "nodev", "noexec"}}});
      } else {
        masked.push_back(p);
      }
    }
    for (const char* p : kReadonlyPaths) readonly.push_back(p);
  }
  json namespaces = json::array({{{"type", "pid"}}, {{"type", "ipc"}}, {{"type", "uts"}}, {{"type", "mount"}},
                                 {{"type", "cgroup"}}, {{"type", "user"}}});
  if (!c.netns_path.empty()) namespaces.push_back({{"type", "network"}, {"path", c.netns_path}});
  else if (!c.host_network) namespaces.push_back({{"type", "network"}});

  // /dev is the sandbox's directory in the node's tmpfs for them (see
  // kSandboxDevs), /dev/shm a directory in it: no superblock of their own.
  json mounts = json::array({
      {{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}, {"options", {"nosuid", "noexec", "nodev"}}},
      {{"destination", "/dev"}, {"type", "bind"}, {"source", c.dev_dir}, {"options", {"bind", "nosuid", "nodev", "noexec"}}},
      {{"destination", "/dev/pts"}, {"type", "devpts"}, {"source", "devpts"},
       {"options", {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}}},
      {{"destination", "/dev/mqueue"}, {"type", "mqueue"}, {"source", "mqueue"}, {"options", {"nosuid", "noexec", "nodev"}}},
      {{"destination", kAgentPath}, {"type", "bind"}, {"source", c.agent_binary}, {"options", {"bind", "ro", "nosuid", "nodev"}}},
      {{"destination", kAgentSocketDir}, {"type", "bind"}, {"source", c.agent_socket_dir}, {"options", {"bind", "nosuid", "nodev", "noexec"}}},
  });
  // The host's devices, onto the empty files MakeSandboxDev made for them.
  for (const char* device : kSandboxDevices) {
    const std::string path = StrCat("/dev/", device);
    mounts.push_back({{"destination", path}, {"type", "bind"}, {"source", path}, {"options", {"bind", "nosuid", "noexec"}}});
  }
  if (!c.resolv_conf.empty()) {
    mounts.push_back({{"destination", "/etc/resolv.conf"}, {"type", "bind"}, {"source", c.resolv_conf},
                      {"options", {"bind", "ro", "nosuid", "nodev", "noexec"}}});
  }
  // /sys: with the host's network the host's, read-only; else the node's
  // sysfs of an empty network namespace (no sandbox's interfaces are in
  // it, and none of the node's), shared read-only by every sandbox.
  if (c.host_network) {
    mounts.push_back({{"destination", "/sys"}, {"type", "bind"}, {"source", "/sys"}, {"options", {"rbind", "rro", "nosuid", "noexec", "nodev"}}});
  } else {
    mounts.push_back({{"destination", "/sys"}, {"type", "bind"}, {"source", c.sysfs}, {"options", {"bind", "ro", "nosuid", "noexec", "nodev"}}});
  }
  for (auto& m : mask_mounts) mounts.push_back(std::move(m));

  json resources = json::object();
  if (c.limits.memory) {
    resources["memory"] = {{"limit", c.limits.memory}, {"swap", c.limits.memory}};
  }
  if (c.limits.cpus > 0) {
    const int64_t period = 100000;
    resources["cpu"] = {{"quota", static_cast<int64_t>(std::llround(c.limits.cpus * period))},
                        {"period", period},
                        {"shares", static_cast<uint64_t>(std::max(2.0, std::round(c.limits.cpus * 1024)))}};
  }
  if (c.limits.pids > 0) resources["pids"] = {{"limit", c.limits.pids}};

  const json id_map = json::array({{{"containerID", c.idmap.container}, {"hostID", c.idmap.host}, {"size", c.idmap.size}}});
  json annotations = json::object();
  if (c.crun && !c.seccomp_bpf_base64.empty()) annotations["run.oci.seccomp_bpf_data"] = c.seccomp_bpf_base64;
  return {
      {"annotations", annotations},
      {"ociVersion", "1.0.2"},
      {"process",
       {
           {"terminal", false},
           {"user", {{"uid", 0}, {"gid", 0}}},
           {"args", {kAgentPath}},  // its listening socket comes as descriptor 3
           {"env", c.env},
           {"cwd", "/"},
           {"capabilities", {{"bounding", caps}, {"effective", caps}, {"permitted", caps}}},
           {"noNewPrivileges", true},
           {"oomScoreAdj", 0},  // (the daemon that starts it keeps the OOM killer away from itself, not from sandboxes)
       }},
      {"root", {{"path", c.rootfs}, {"readonly", c.fncall}}},
      {"hostname", c.hostname},
      {"mounts", mounts},
      {"linux",
       {
           {"uidMappings", id_map},
           {"gidMappings", id_map},
           {"namespaces", namespaces},
           {"cgroupsPath", c.cgroup_path},
           {"resources", resources},
           {"seccomp", AgentSeccompProfile()},
           {"maskedPaths", masked},
           {"readonlyPaths", readonly},
       }},
  };
}

namespace {

bool MountedAs(const char* path, int64_t magic, bool read_only) {
  struct statfs fs;
  return ::statfs(path, &fs) == 0 && static_cast<int64_t>(fs.f_type) == magic && (!read_only || (fs.f_flags & ST_RDONLY));
}

// The sandboxes' sysfs: mounted from a thread in a network namespace of its
// own (sysfs takes the mounting thread's). The namespace goes when the
// thread does — sysfs keeps only a passive reference — and its loopback
// with it, a moment later: wait for that, so no sandbox sees an interface.
Status MountSandboxSysfs() {
  STRATA_RETURN_IF_ERROR(MakeDirs(kSandboxSysfs, 0555).Annotate("sandboxes' /sys"));
  Status result;
  try {
    std::thread([&] {
      if (::unshare(CLONE_NEWNET) != 0) {
        result = ErrnoError(errno, "sandboxes' /sys: new network namespace");
      } else if (::mount("sysfs", kSandboxSysfs, "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
        result = ErrnoError(errno, StrCat("sandboxes' /sys: mount sysfs at ", kSandboxSysfs));
      }
    }).join();
  } catch (const std::system_error& e) {
    return Error(e.code().value(), StrCat("sandboxes' /sys: start a thread: ", e.what()));
  }
  STRATA_RETURN_IF_ERROR(result);
  const std::string net = StrCat(kSandboxSysfs, "/class/net");
  for (int i = 0; i < 500; ++i) {
    DIR* d = ::opendir(net.c_str());
    if (!d) return ErrnoError(errno, StrCat("sandboxes' /sys: open ", net));
    bool empty = true;
    while (dirent* e = ::readdir(d)) empty = empty && (e->d_name[0] == '.');
    ::closedir(d);
    if (empty) return OkStatus();
    ::usleep(10000);
  }
  return Error(ETIMEDOUT, StrCat("sandboxes' /sys: ", net, " still shows interfaces after 5 s (the namespace did not go)"));
}

}  // namespace

Status EnsureSharedMounts() {
  if (MountedAs(kMaskDir, TMPFS_MAGIC, true) && MountedAs(kSandboxSysfs, SYSFS_MAGIC, true) &&
      IsMountPoint(kSandboxDevs)) {
    return OkStatus();
  }
  // Launchers and daemons on one node may get here at once: one mounts.
  STRATA_RETURN_IF_ERROR(MakeDirs(Dirname(kMaskDir)).Annotate("shared sandbox mounts"));
  const std::string lock_path = StrCat(Dirname(kMaskDir), "/.shared-mounts.lock");
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock) return ErrnoError(errno, "shared sandbox mounts: open " + lock_path);
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoError(errno, "shared sandbox mounts: lock " + lock_path);
  }
  // Masks: an empty read-only tmpfs (nothing, not even the host's root,
  // puts a file in it without a remount).
  if (!MountedAs(kMaskDir, TMPFS_MAGIC, true)) {
    STRATA_RETURN_IF_ERROR(MakeDirs(kMaskDir, 0555).Annotate("masking directory"));
    if (::mount("tmpfs", kMaskDir, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555,size=4k,nr_inodes=1") != 0) {
      return ErrnoError(errno, StrCat("masking directory: mount an empty read-only tmpfs at ", kMaskDir));
    }
  }
  if (!MountedAs(kSandboxSysfs, SYSFS_MAGIC, true)) STRATA_RETURN_IF_ERROR(MountSandboxSysfs());
  // /dev of every container: writable, the tmpfs default size (half the
  // node's memory) for all of them, each sandbox's part charged to its
  // memory cgroup; no cap on inodes (they are charged too, and a shared
  // cap would be one sandbox's to exhaust for all); mode 0711 so no
  // sandbox's mapped root can list the others (none sees this directory
  // anyway: each binds its own). No device nodes in it: the devices are
  // the host's, bound.
  if (!IsMountPoint(kSandboxDevs)) {
    STRATA_RETURN_IF_ERROR(MakeDirs(kSandboxDevs, 0711).Annotate("containers' /dev"));
    if (::mount("tmpfs", kSandboxDevs, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0711,nr_inodes=0") != 0) {
      return ErrnoError(errno, StrCat("containers' /dev: mount a tmpfs at ", kSandboxDevs));
    }
  }
  return OkStatus();
}

Result<std::string> MakeSandboxDev(const std::string& id, uid_t uid) {
  // Nothing an earlier sandbox of this name left is trusted.
  STRATA_RETURN_IF_ERROR(RemoveSandboxDev(id));
  // <id> is the sandbox root's alone (0700: no other user of the node
  // reaches its /dev/shm); <id>/dev is bound at /dev. The devices are the
  // host's, bound by the runtime onto empty files of the host's root here:
  // a mount point cannot be removed or replaced from inside, and the
  // sandbox's root cannot change a file of an owner it does not map.
  const std::string top = StrCat(kSandboxDevs, "/", id);
  for (const auto& [name, mode] : {std::pair{"", 0700}, std::pair{"/dev", 0755}, std::pair{"/dev/shm", 01777},
                                   std::pair{"/dev/pts", 0755}, std::pair{"/dev/mqueue", 0755}}) {
    const std::string path = top + name;
    if (::mkdir(path.c_str(), mode) != 0) return ErrnoError(errno, "sandbox /dev: make " + path);
    if (::chmod(path.c_str(), mode) != 0) return ErrnoError(errno, "sandbox /dev: chmod " + path);  // (past the umask)
    if (::lchown(path.c_str(), uid, uid) != 0) return ErrnoError(errno, "sandbox /dev: chown " + path);
  }
  for (const char* device : kSandboxDevices) {  // (the host root's)
    const std::string path = StrCat(top, "/dev/", device);
    UniqueFd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!f) return ErrnoError(errno, "sandbox /dev: make " + path);
  }
  for (const auto& [name, target] : {std::pair{"fd", "/proc/self/fd"}, std::pair{"stdin", "/proc/self/fd/0"},
                                     std::pair{"stdout", "/proc/self/fd/1"}, std::pair{"stderr", "/proc/self/fd/2"},
                                     std::pair{"ptmx", "pts/ptmx"}, std::pair{"core", "/proc/kcore"}}) {
    const std::string path = StrCat(top, "/dev/", name);
    if (::symlink(target, path.c_str()) != 0) return ErrnoError(errno, "sandbox /dev: link " + path);
    if (::lchown(path.c_str(), uid, uid) != 0) return ErrnoError(errno, "sandbox /dev: chown " + path);
  }
  return top + "/dev";
}

Status RemoveSandboxDev(const std::string& id) {
  return RemoveTree(StrCat(kSandboxDevs, "/", id)).Annotate("remove sandbox " + id + "'s /dev");
}

}  // namespace strata::launcher
