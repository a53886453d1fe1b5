// launcher doctor: FUSE, overlayfs, EROFS (file-backed, idmapped), crun and
// cgroups, seccomp, user namespaces, the uppers filesystem.
#include "launcher/backends/doctor.h"

#include <linux/landlock.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/fs.h"
#include "common/idmap.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launcher/sandbox/upper_store.h"
#include "layerctl/builder.h"
#include "layerctl/dir_reader.h"
#include "vmm/guest_files.h"
#include "vmm/qemu.h"

namespace strata::launcher {
namespace {

bool FilesystemKnown(const std::string& fs) {
  std::ifstream in("/proc/filesystems");
  std::string line;
  while (std::getline(in, line)) {
    if (line.substr(line.find('\t') + 1) == fs) return true;
  }
  return false;
}

bool ModprobeOk(const std::string& module) {
  auto r = RunCommand({.argv = {"modprobe", module}});
  return r.ok() && r->success();
}

std::vector<std::string> Words(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

DoctorCheck CheckFilesystem(const std::string& fs, bool fix) {
  DoctorCheck c{fs, FilesystemKnown(fs), false, ""};
  if (!c.ok && fix && ModprobeOk(fs)) c.ok = c.fixed = FilesystemKnown(fs);
  c.detail = c.ok ? "the kernel knows " + fs : StrCat("the kernel has no ", fs, ": load it with `modprobe ", fs, "`");
  return c;
}

// Builds a two-file layer, mounts it file-backed, idmaps it, and stacks an
// overlay on it: the whole mount path a sandbox uses.
std::vector<DoctorCheck> CheckMounts(const NodeConfig& node) {
  std::vector<DoctorCheck> out;
  auto tmp = TempDir::Create("strata-doctor");
  if (!tmp.ok()) return {{"mounts", false, false, tmp.status().ToString()}};
  Status s = MakeDirs(tmp->Sub("src/dir"));
  if (s.ok()) s = WriteFileAtomic(tmp->Sub("src/dir/file"), "strata\n");
  // From the tree directly (BuildLayer would bring the tar reader, and with
  // it libarchive, into the launcher).
  auto layer = s.ok() ? layerctl::BuildLayerFrom({.source = tmp->Sub("src"), .output_dir = tmp->Sub("layer")},
                                                 [&](erofs::ImageWriter& w) { return layerctl::AddDirectoryTree(tmp->Sub("src"), w); })
                      : Result<layerctl::BuiltLayer>(s);
  if (!layer.ok()) return {{"erofs file-backed mount", false, false, "build a test layer: " + layer.status().ToString()}};
  s = MakeDirs(tmp->Sub("erofs"));
  auto erofs = s.ok() ? MountPoint::Mount(tmp->Sub("layer/meta.img"), tmp->Sub("erofs"), "erofs", MS_RDONLY,
                                          "device=" + tmp->Sub("layer/blob.img"))
                      : Result<MountPoint>(s);
  if (!erofs.ok()) {
    return {{"erofs file-backed mount", false, false,
             erofs.status().ToString() + " (needs Linux 6.12+ with CONFIG_EROFS_FS_BACKED_BY_FILE)"}};
  }
  auto content = ReadFileToString(tmp->Sub("erofs/dir/file"));
  out.push_back({"erofs file-backed mount", content.ok() && *content == "strata\n", false,
                 content.ok() ? "mount(2) with device=<blob> works" : content.status().ToString()});

  auto ns = CreateUserNamespace(node.idmap);
  if (!ns.ok()) {
    out.push_back({"user namespaces", false, false, ns.status().ToString() + " (check /proc/sys/user/max_user_namespaces)"});
    return out;
  }
  out.push_back({"user namespaces", true, false, "a namespace for " + node.idmap.ToString() + " was created"});
  auto idmapped = IdmappedMount(tmp->Sub("erofs"), tmp->Sub("idmapped"), ns->get());
  struct stat st{};
  bool mapped = idmapped.ok() && ::stat(tmp->Sub("idmapped/dir/file").c_str(), &st) == 0 && st.st_uid == node.idmap.host;
  out.push_back({"idmapped erofs mount", mapped, false,
                 mapped ? StrCat("root's files appear as ", node.idmap.host)
                        : (idmapped.ok() ? "the idmapped mount did not map ids" : idmapped.status().ToString())});
  if (!mapped) return out;
  s = MakeDirs(tmp->Sub("upper"));
  if (s.ok()) s = MakeDirs(tmp->Sub("work"));
  if (s.ok()) s = MakeDirs(tmp->Sub("merged"));
  auto overlay = s.ok() ? MountPoint::Mount("overlay", tmp->Sub("merged"), "overlay", 0,
                                            StrCat("lowerdir=", tmp->Sub("idmapped"), ",upperdir=", tmp->Sub("upper"),
                                                   ",workdir=", tmp->Sub("work"), ",redirect_dir=off,metacopy=off,index=off"))
                        : Result<MountPoint>(s);
  bool overlay_ok = overlay.ok() && WriteFileAtomic(tmp->Sub("merged/dir/new"), "x", false).ok();
  out.push_back({"overlayfs over idmapped layers", overlay_ok, false,
                 overlay_ok ? "copy-up works" : (overlay.ok() ? "writing through the overlay failed" : overlay.status().ToString())});
  return out;
}

// The default runtime ("runtime"), then each other one a create may name
// ("runtime runc"): one that does not run fails its creates.
std::vector<DoctorCheck> CheckRuntimes(const NodeConfig& node) {
  std::vector<DoctorCheck> out;
  for (const std::string& name : node.RuntimeNames()) {
    auto path = node.RuntimeFor(name);
    const std::string program = path.ok() ? *path : name;
    const std::string check = out.empty() ? "runtime" : "runtime " + name;
    auto r = RunCommand({.argv = {program, "--version"}});
    if (!r.ok() || !r->success()) {
      out.push_back({check, false, false, StrCat(program, " does not run: install it (apt-get install ", name, ") or ",
                                                 out.empty() ? "set STRATA_RUNTIME" : "leave it out of STRATA_RUNTIMES")});
    } else {
      out.push_back({check, true, false, r->out.substr(0, r->out.find('\n'))});
    }
  }
  return out;
}

// crun refuses hybrid hierarchies while cgroup2 holds any controller ("drop
// all controllers from cgroupv2"); binding each such controller to its own
// v1 hierarchy moves it out of cgroup2.
DoctorCheck CheckCgroups(bool fix) {
  DoctorCheck c{"cgroups", true, false, ""};
  const bool unified_only = ::access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
  if (unified_only) {
    c.detail = "cgroup v2 (unified)";
    return c;
  }
  for (const char* needed : {"memory", "cpu", "pids", "freezer"}) {
    if (::access(StrCat("/sys/fs/cgroup/", needed).c_str(), F_OK) != 0) {
      c.ok = false;
      c.detail = StrCat("cgroup v1 controller ", needed, " is not mounted at /sys/fs/cgroup/", needed);
      return c;
    }
  }
  auto in_v2 = Words("/sys/fs/cgroup/unified/cgroup.controllers");
  if (in_v2.empty()) {
    c.detail = "hybrid: v1 controllers, cgroup2 without controllers";
    return c;
  }
  if (!fix) {
    c.ok = false;
    c.detail = StrCat("hybrid cgroups with [", Join(in_v2, " "), "] in cgroup2: crun refuses this; `launcher doctor --fix` binds ",
                      in_v2.size() == 1 ? "it" : "them", " to v1 (mount -t cgroup -o ", in_v2[0], " cgroup /sys/fs/cgroup/", in_v2[0], ")");
    return c;
  }
  for (const auto& controller : in_v2) {
    std::string dir = "/sys/fs/cgroup/" + controller;
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      c.ok = false;
      c.detail = ErrnoError(errno, "mkdir " + dir).ToString();
      return c;
    }
    if (::mount("cgroup", dir.c_str(), "cgroup", 0, controller.c_str()) != 0) {
      c.ok = false;
      c.detail = ErrnoError(errno, StrCat("mount cgroup v1 ", controller, " at ", dir)).ToString();
      return c;
    }
  }
  c.fixed = true;
  c.detail = StrCat("bound [", Join(in_v2, " "), "] to cgroup v1 so crun accepts the hybrid layout");
  return c;
}

// Every sandbox start moves a process into a cgroup; by default each move
// waits for an RCU grace period (5-20 ms here) to take the cgroup
// threadgroup lock. favordynmods (Linux 6.0+) makes moves cheap at a small
// cost to fork and exit; the lock is global, so one cgroup2 mount holding
// the option is enough.
DoctorCheck CheckCgroupMoves(bool fix) {
  DoctorCheck c{"cgroup moves", true, false, ""};
  std::string cgroup2, options;
  for (const auto& m : ListMounts()) {
    if (m.fstype != "cgroup2") continue;
    if (("," + m.super_options + ",").find(",favordynmods,") != std::string::npos) {
      c.detail = StrCat("fast (favordynmods on ", m.mount_point, ")");
      return c;
    }
    if (cgroup2.empty()) {
      cgroup2 = m.mount_point;
      // A remount sets exactly the options it is given: keep the others.
      for (const auto& o : Split(m.super_options, ',')) {
        if (!o.empty() && o != "rw" && o != "ro") options += o + ",";
      }
    }
  }
  if (cgroup2.empty()) {
    c.detail = "no cgroup2 mount to set favordynmods on; every sandbox start waits for an RCU grace period";
    return c;
  }
  utsname uts{};
  ::uname(&uts);
  if (std::atoi(uts.release) < 6) {  // the option came with Linux 6.0
    c.detail = StrCat("Linux ", uts.release, " has no favordynmods: every sandbox start waits for an RCU grace period");
    return c;
  }
  if (!fix) {
    c.ok = false;
    c.detail = StrCat("every sandbox start waits 5-20 ms to move into its cgroup; `launcher doctor --fix` remounts ", cgroup2,
                      " with favordynmods (mount -o remount,favordynmods ", cgroup2, ")");
    return c;
  }
  // A remount sets the mount's own flags too: keep them as they are.
  struct statvfs vfs{};
  unsigned long flags = MS_REMOUNT;
  if (::statvfs(cgroup2.c_str(), &vfs) == 0) {
    for (auto [st, ms] : {std::pair{ST_RDONLY, MS_RDONLY}, {ST_NOSUID, MS_NOSUID}, {ST_NODEV, MS_NODEV}, {ST_NOEXEC, MS_NOEXEC},
                          {ST_NOATIME, MS_NOATIME}, {ST_NODIRATIME, MS_NODIRATIME}, {ST_RELATIME, MS_RELATIME}}) {
      if (vfs.f_flag & st) flags |= ms;
    }
  }
  options += "favordynmods";
  if (::mount(nullptr, cgroup2.c_str(), nullptr, flags, options.c_str()) != 0) {
    // Kernels before 6.0 do not know the option: slower, but nothing to fix.
    c.detail = ErrnoError(errno, StrCat("remount ", cgroup2, " with favordynmods")).ToString() +
               "; sandbox starts wait for an RCU grace period to move into their cgroup";
    return c;
  }
  c.fixed = true;
  c.detail = StrCat("remounted ", cgroup2, " with favordynmods: moving into a cgroup no longer waits for RCU");
  return c;
}

DoctorCheck CheckSeccomp() {
  auto actions = ReadFileToString("/proc/sys/kernel/seccomp/actions_avail");
  bool ok = actions.ok() && actions->find("errno") != std::string::npos;
  return {"seccomp", ok, false, ok ? "filters available" : "the kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)"};
}

// File rules need Landlock (a domain per command); without it sandboxes
// work, and an exec with rules is refused, saying why.
DoctorCheck CheckLandlock() {
  const long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi >= 1) return {"file rules", true, false, StrCat("Landlock ABI ", abi)};
  return {"file rules", true, false, "no Landlock in this kernel (lsm= without landlock?): execs with file rules are refused"};
}

DoctorCheck CheckUppers(const NodeConfig& node, const DoctorOptions& options) {
  DoctorCheck c{"sandbox uppers", false, false, ""};
  Status s = CheckUpperFilesystem(node.uppers);
  if (s.ok()) {
    c.ok = true;
    struct statfs fs;
    uint64_t free = ::statfs(node.uppers.c_str(), &fs) == 0 ? static_cast<uint64_t>(fs.f_bavail) * fs.f_bsize : 0;
    c.detail = StrCat(node.uppers, " is btrfs with quotas (", FormatBytes(free), " free)");
    return c;
  }
  if (!options.fix) {
    c.detail = s.ToString();
    return c;
  }
  // A loop-file btrfs beside the directory; reused when it exists.
  const std::string image = node.uppers + ".img";
  Status fix = MakeDirs(node.uppers, 0711);
  const bool create = ::access(image.c_str(), F_OK) != 0;
  if (fix.ok() && create) {
    auto created = RunChecked({.argv = {"truncate", "-s", std::to_string(options.uppers_size), image}}, "create " + image);
    if (created.ok()) created = RunChecked({.argv = {"mkfs.btrfs", "-q", image}}, "mkfs.btrfs " + image);
    fix = created.status();
  }
  if (fix.ok() && !IsMountPoint(node.uppers)) {
    fix = RunChecked({.argv = {"mount", "-o", "loop", image, node.uppers}}, "mount " + image).status();
  }
  if (fix.ok() && CheckUpperFilesystem(node.uppers).code() == ENOTCONN) fix = EnableQuotas(node.uppers);
  if (fix.ok()) fix = CheckUpperFilesystem(node.uppers);
  c.ok = c.fixed = fix.ok();
  if (!fix.ok()) c.detail = fix.ToString();
  else if (create) c.detail = StrCat("created a btrfs with quotas at ", node.uppers, " on ", image, " (", FormatBytes(options.uppers_size), ", sparse)");
  else c.detail = StrCat("mounted the existing btrfs ", image, " at ", node.uppers, " (quotas on)");
  return c;
}

// Sandbox networks (modes allow and open) route through the node.
DoctorCheck CheckForwarding(bool fix) {
  DoctorCheck c{"sandbox networks", false, false, ""};
  const char* path = "/proc/sys/net/ipv4/ip_forward";
  auto on = [&] {
    auto v = ReadFileToString(path);
    return v.ok() && !v->empty() && (*v)[0] == '1';
  };
  if (on()) {
    c.ok = true;
    c.detail = "IPv4 forwarding is on";
    return c;
  }
  if (fix) {
    if (FILE* f = std::fopen(path, "w")) {
      std::fputs("1\n", f);
      std::fclose(f);
    }
    c.ok = c.fixed = on();
    c.detail = c.ok ? "turned IPv4 forwarding on (net.ipv4.ip_forward=1; persist it in /etc/sysctl.d)" : "could not turn IPv4 forwarding on";
    return c;
  }
  c.detail = "IPv4 forwarding is off (net.ipv4.ip_forward=0): modes allow and open need it (`launcher doctor --fix`)";
  return c;
}

// Kernel limits that thousands of sandboxes on one node reach (issue:
// density). Each is raised, never lowered.
struct NodeLimit {
  const char* sysctl;
  uint64_t want;
  const char* why;
};
constexpr NodeLimit kNodeLimits[] = {
    // Every sandbox's agent, its threads and what its commands run.
    {"kernel/pid_max", 4194304, "processes of thousands of sandboxes"},
    {"fs/inotify/max_user_instances", 65536, "inotify instances of the programs sandboxes run"},
    {"fs/inotify/max_user_watches", 1048576, "inotify watches of the same"},
    // Each sandbox's overlay, its binds and its commands' rule mounts.
    {"fs/mount-max", 1000000, "mounts: a sandbox's overlay, binds and rule mounts"},
};

DoctorCheck CheckNodeLimits(bool fix) {
  DoctorCheck c{"node limits", true, false, ""};
  std::vector<std::string> low, raised;
  for (const NodeLimit& l : kNodeLimits) {
    const std::string path = StrCat("/proc/sys/", l.sysctl);
    auto read = [&]() -> uint64_t {
      auto v = ReadFileToString(path);
      return v.ok() ? std::strtoull(v->c_str(), nullptr, 10) : 0;
    };
    std::string name = l.sysctl;
    std::replace(name.begin(), name.end(), '/', '.');
    if (read() >= l.want) continue;
    if (fix) {
      if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::fprintf(f, "%llu\n", static_cast<unsigned long long>(l.want));
        std::fclose(f);
      }
      if (read() >= l.want) {
        raised.push_back(StrCat(name, "=", l.want));
        continue;
      }
    }
    low.push_back(StrCat(name, "=", read(), " (want ", l.want, ": ", l.why, ")"));
  }
  c.ok = low.empty();
  c.fixed = !raised.empty() && low.empty();
  if (!low.empty()) c.detail = "too low for thousands of sandboxes: " + Join(low, "; ") + " (`launcher doctor --fix`)";
  else if (!raised.empty()) c.detail = "raised " + Join(raised, ", ") + " (persist them in /etc/sysctl.d)";
  else c.detail = "kernel limits hold thousands of sandboxes";
  return c;
}

// The kernel's FUSE request timeout (Linux 6.14) aborts a whole connection
// when one request is not answered in time: every sandbox on that layer at
// once. lazyfs bounds its own reads (the fetch deadline, 60 s, then EIO)
// and a restart of its serving process takes a second or two, so a timeout
// is only safe above both (docs/operations.md).
constexpr uint64_t kFuseTimeoutFloor = 75;

DoctorCheck CheckFuseTimeout(bool fix) {
  DoctorCheck c{"fuse timeout", true, false, ""};
  std::vector<std::string> low, raised;
  for (const char* name : {"default_request_timeout", "max_request_timeout"}) {
    const std::string path = StrCat("/proc/sys/fs/fuse/", name);
    auto read = [&]() -> uint64_t {
      auto v = ReadFileToString(path);
      return v.ok() ? std::strtoull(v->c_str(), nullptr, 10) : 0;
    };
    if (::access(path.c_str(), F_OK) != 0 || read() == 0 || read() >= kFuseTimeoutFloor) continue;
    if (fix) {
      if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::fprintf(f, "%llu\n", static_cast<unsigned long long>(kFuseTimeoutFloor));
        std::fclose(f);
      }
    }
    if (fix && read() >= kFuseTimeoutFloor) {
      raised.push_back(StrCat("fs.fuse.", name, "=", kFuseTimeoutFloor));
      continue;
    }
    low.push_back(StrCat("fs.fuse.", name, "=", read()));
  }
  c.ok = low.empty();
  c.fixed = !raised.empty() && low.empty();
  if (!low.empty()) {
    c.detail = StrCat(Join(low, ", "), " s aborts a layer's FUSE connection, every sandbox on it, before lazyfs's fetch "
                      "deadline and a restart: 0 or at least ", kFuseTimeoutFloor, " s (`launcher doctor --fix`)");
  } else if (!raised.empty()) {
    c.detail = "raised " + Join(raised, ", ");
  } else {
    c.detail = "no FUSE request timeout shorter than lazyfs's fetch deadline and a restart";
  }
  return c;
}

}  // namespace

// Which accelerator microVMs get: a probe guest (the agent as init, which
// powers off when it finds no disks) booted under KVM, then TCG, each with
// a deadline, so a /dev/kvm that opens but cannot run a stock guest (PVM)
// never hangs a sandbox. The answer is recorded for the launcher.
DoctorCheck CheckMicroVm(const NodeConfig& node) {
  DoctorCheck c{"microvm", true, false, ""};
  if (::access(node.vm_kernel.c_str(), R_OK) != 0) {
    c.detail = "microVMs off: no guest kernel at " + node.vm_kernel + " (scripts/guest-kernel builds it)";
    return c;
  }
  if (::access("/usr/bin/qemu-system-x86_64", X_OK) != 0) {
    c.detail = "microVMs off: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)";
    return c;
  }
  auto initramfs = vmm::EnsureInitramfs(node.agent_binary, {}, node.vm_cache);
  if (!initramfs.ok()) {
    c.ok = false;
    c.detail = initramfs.status().ToString();
    return c;
  }
  std::string why;
  for (const char* accel : {"kvm", "tcg"}) {
    if (std::string(accel) == "kvm" && ::access("/dev/kvm", R_OK | W_OK) != 0) {
      why = "no usable /dev/kvm; ";
      continue;
    }
    Status probe = vmm::ProbeBoot(node.vm_kernel, *initramfs, accel, std::string(accel) == "kvm" ? std::chrono::seconds(10) : std::chrono::seconds(60));
    if (probe.ok()) {
      Status saved = WriteFileAtomic(node.vm_cache + "/accelerator", std::string(accel) + "\n", false);
      // A network (modes allow and open) is a tap bridged in the sandbox's namespace.
      const bool tun = ::access("/dev/net/tun", R_OK | W_OK) == 0;
      c.detail = StrCat(why, "microVMs run under ", accel, " (a probe guest booted)",
                        tun ? "" : "; without /dev/net/tun they get no network (modes allow and open fail)",
                        saved.ok() ? "" : "; " + saved.ToString());
      return c;
    }
    why += probe.ToString() + "; ";
  }
  c.ok = false;
  c.detail = why + "microVMs cannot run here";
  return c;
}

std::vector<DoctorCheck> RunDoctor(const NodeConfig& node, const DoctorOptions& options) {
  std::vector<DoctorCheck> checks;
  checks.push_back({"root", ::geteuid() == 0, false, ::geteuid() == 0 ? "running as root" : "sandboxes need root"});
  bool fuse = ::access("/dev/fuse", R_OK | W_OK) == 0;
  if (!fuse && options.fix) fuse = ModprobeOk("fuse") && ::access("/dev/fuse", R_OK | W_OK) == 0;
  checks.push_back({"fuse", fuse, false, fuse ? "/dev/fuse is there" : "no /dev/fuse: `modprobe fuse`"});
  checks.push_back(CheckFuseTimeout(options.fix));
  checks.push_back(CheckFilesystem("overlay", options.fix));
  checks.push_back(CheckFilesystem("erofs", options.fix));
  for (auto& c : CheckMounts(node)) checks.push_back(std::move(c));
  for (auto& c : CheckRuntimes(node)) checks.push_back(std::move(c));
  checks.push_back(CheckCgroups(options.fix));
  checks.push_back(CheckCgroupMoves(options.fix));
  checks.push_back(CheckSeccomp());
  checks.push_back(CheckLandlock());
  checks.push_back(CheckUppers(node, options));
  checks.push_back(CheckForwarding(options.fix));
  checks.push_back(CheckNodeLimits(options.fix));
  bool agent = !node.agent_binary.empty() && ::access(node.agent_binary.c_str(), X_OK) == 0;
  checks.push_back({"agent", agent, false, agent ? node.agent_binary : "strata-agent not found (set STRATA_AGENT)"});
  bool nsexec = !node.nsexec_binary.empty() && ::access(node.nsexec_binary.c_str(), X_OK) == 0;
  checks.push_back({"nsexec", nsexec, false, nsexec ? node.nsexec_binary : "strata-nsexec not found (set STRATA_NSEXEC)"});
  if (agent) checks.push_back(CheckMicroVm(node));
  return checks;
}

}  // namespace strata::launcher
