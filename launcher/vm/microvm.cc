// The relay keeps one connection to the guest's channel; when it breaks
// (the guest died, or is not up yet) it dials again, and connections to the
// agent socket that arrive meanwhile are closed at once, so a caller gets
// an error rather than a hang.
#include "launcher/vm/microvm.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>

#include "common/fs.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "common/unix_socket.h"
#include "launcher/sandbox/spec.h"
#include "vmm/qemu.h"

namespace strata::launcher {

namespace {

// QEMU's uid and gid: one per sandbox, outside the containers' range, so
// no two VMs' hypervisors share an owner (a hash of the id; the namespaces
// keep them apart even when two collide).
constexpr uint32_t kVmIdBase = 400000;
uid_t VmUid(const std::string& id) {
  return kVmIdBase + static_cast<uint32_t>(std::hash<std::string>{}(id) % 65536);
}

Status WriteValue(const std::string& path, const std::string& value) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY));
  return WriteFull(fd.get(), value).Annotate("write " + path);
}

}  // namespace

static Result<MountPoint> MountVmDiskAt(const std::string& image, const std::string& target);

Result<MountPoint> MountVmDisk(const std::string& image, const std::string& target) {
  // The guest wrote this image as it liked: e2fsck reads all of it in
  // user space first, and the node's kernel mounts only one it finds
  // clean (docs/security.md, "microVMs").
  STRATA_RETURN_IF_ERROR(RunChecked({.argv = {"e2fsck", "-f", "-n", image}, .timeout = std::chrono::minutes(5)},
                                    "check the guest's upper disk")
                             .status());
  STRATA_RETURN_IF_ERROR(MakeDirs(target, 0700));
  auto mounted = MountVmDiskAt(image, target);
  if (!mounted.ok()) ::rmdir(target.c_str());
  return mounted;
}

static Result<MountPoint> MountVmDiskAt(const std::string& image, const std::string& target) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd file, OpenFile(image, O_RDONLY));
  UniqueFd control(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!control) return ErrnoError(errno, "mount " + image + ": open /dev/loop-control");
  for (int attempt = 0; attempt < 16; ++attempt) {
    int n = ::ioctl(control.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return ErrnoError(errno, "mount " + image + ": find a free loop device");
    const std::string device = StrCat("/dev/loop", n);
    UniqueFd loop(::open(device.c_str(), O_RDONLY | O_CLOEXEC));
    if (!loop) return ErrnoError(errno, "mount " + image + ": open " + device);
    loop_config config{};
    config.fd = static_cast<uint32_t>(file.get());
    config.info.lo_flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
    if (::ioctl(loop.get(), LOOP_CONFIGURE, &config) != 0) {
      if (errno == EBUSY) continue;  // another process took it first
      return ErrnoError(errno, "mount " + image + ": configure " + device);
    }
    // noload: the frozen filesystem was clean; a copy never replays a journal.
    auto mount = MountPoint::Mount(device, target, "ext4", MS_RDONLY | MS_NODEV | MS_NOSUID | MS_NOEXEC, "noload");
    // With AUTOCLEAR the device detaches when its last user (the mount, or
    // this descriptor on failure) lets go.
    if (!mount.ok()) return mount.status().Annotate("mount " + image);
    return mount;
  }
  return Error(EBUSY, "mount " + image + ": no free loop device after 16 tries");
}

Result<std::vector<std::string>> MakeVmCgroups(const std::string& relative, uint64_t memory_limit, double cpu_quota) {
  std::vector<std::string> procs;
  if (::access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0) {  // pure cgroup v2
    const std::string dir = "/sys/fs/cgroup/" + relative;
    STRATA_RETURN_IF_ERROR(MakeDirs(dir, 0755).Annotate("microVM cgroup"));
    // The controllers enabled on the way down (a fresh node has none).
    std::string at = "/sys/fs/cgroup";
    for (const auto& part : Split(relative, '/')) {
      if (part.empty()) continue;
      STRATA_RETURN_IF_ERROR(WriteValue(at + "/cgroup.subtree_control", "+memory +cpu +pids").Annotate("microVM cgroup"));
      at += "/" + part;
    }
    STRATA_RETURN_IF_ERROR(WriteValue(dir + "/memory.max", StrCat(memory_limit)));
    if (::access((dir + "/memory.swap.max").c_str(), F_OK) == 0) STRATA_RETURN_IF_ERROR(WriteValue(dir + "/memory.swap.max", "0"));
    if (cpu_quota > 0) STRATA_RETURN_IF_ERROR(WriteValue(dir + "/cpu.max", StrCat(static_cast<int64_t>(cpu_quota * 100000), " 100000")));
    STRATA_RETURN_IF_ERROR(WriteValue(dir + "/pids.max", "1024"));
    procs.push_back(dir + "/cgroup.procs");
    return procs;
  }
  for (const char* c : {"memory", "cpu", "pids"}) {
    const std::string dir = StrCat("/sys/fs/cgroup/", c, "/", relative);
    if (::access(StrCat("/sys/fs/cgroup/", c).c_str(), F_OK) != 0) continue;
    STRATA_RETURN_IF_ERROR(MakeDirs(dir, 0755).Annotate("microVM cgroup"));
    if (std::string(c) == "memory") {
      STRATA_RETURN_IF_ERROR(WriteValue(dir + "/memory.limit_in_bytes", StrCat(memory_limit)));
      if (::access((dir + "/memory.memsw.limit_in_bytes").c_str(), F_OK) == 0) {
        STRATA_RETURN_IF_ERROR(WriteValue(dir + "/memory.memsw.limit_in_bytes", StrCat(memory_limit)));
      }
    } else if (std::string(c) == "cpu" && cpu_quota > 0) {
      STRATA_RETURN_IF_ERROR(WriteValue(dir + "/cpu.cfs_period_us", "100000"));
      STRATA_RETURN_IF_ERROR(WriteValue(dir + "/cpu.cfs_quota_us", StrCat(static_cast<int64_t>(cpu_quota * 100000))));
    } else if (std::string(c) == "pids") {
      STRATA_RETURN_IF_ERROR(WriteValue(dir + "/pids.max", "1024"));
    }
    procs.push_back(dir + "/cgroup.procs");
  }
  return procs;
}

namespace {

// The guest as QEMU gets it, but for the jail. Nothing of the sandbox's
// identity is in it but the QEMU's name (-name) and paths: a saved state
// of one is a state of any other of the same key (MicroVm::TemplateKey).
vmm::GuestSpec GuestSpecOf(const MicroVmSpec& spec) {
  vmm::GuestSpec g;
  g.name = spec.id;
  g.kernel = spec.kernel;
  g.initramfs = spec.initramfs;
  g.cmdline = StrCat("console=ttyS0 reboot=t panic=-1 quiet 8250.nr_uarts=1 strata.layers=", spec.layers.size());
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    g.disks.push_back({spec.layers[i].meta, true, StrCat("l", i, "m")});
    g.disks.push_back({spec.layers[i].blob, true, StrCat("l", i, "b")});
  }
  g.disks.push_back({spec.upper_disk, false, "upper"});
  // One MAC for every guest: each is alone on its link (its tap in its
  // own namespace), and a restored guest keeps the saved one's anyway. The
  // guest takes its address when the launcher tells it (Identify).
  if (spec.tap_fd >= 0) g.nic = vmm::GuestNic{spec.tap_fd, "52:54:00:00:00:02"};
  g.cpus = std::max(spec.cpus, 1);
  g.memory = spec.memory ? spec.memory : kDefaultVmMemory;
  g.state_dir = spec.dir + "/vm";
  g.console_log = spec.console_log;
  g.accel = spec.accel;
  g.restore_state = spec.restore_state;
  return g;
}

// What names a file's version: path, size, change time.
std::string FileVersion(const std::string& path) {
  struct ::stat st{};
  if (::stat(path.c_str(), &st) != 0) return path + ":missing";
  return StrCat(path, ":", st.st_size, ":", st.st_ino, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

}  // namespace

std::string MicroVm::TemplateKey(const MicroVmSpec& spec, uint64_t disk_bytes) {
  vmm::GuestSpec g = GuestSpecOf(spec);
  const vmm::QemuOptions qemu;
  // QEMU's whole command line but for what names this one guest (the
  // accelerator, machine, shape, devices, kernel command line with the
  // TSC rate TCG guests are told), the files behind it (a layer's are
  // named by its digest; the upper is attached as a copy of the saved
  // one, so only its size counts), and the host the state was saved on
  // (its kernel and CPU: a KVM guest runs with the host's CPU features).
  g.name = "template";
  g.state_dir = g.console_log = "";
  g.restore_state.clear();
  std::string text = StrCat("strata microVM template 2\n", Join(vmm::QemuHypervisor(qemu).CommandLine(g), " "), "\n",
                            FileVersion(qemu.binary), "\n", FileVersion(g.kernel), "\n", FileVersion(g.initramfs),
                            "\nupper=", disk_bytes, "\n");
  for (const auto& d : g.disks) {
    if (d.read_only) text += StrCat(d.serial, "=", FileVersion(d.path), "\n");
  }
  if (utsname u{}; ::uname(&u) == 0) text += StrCat(u.release, " ", u.version, " ", u.machine, "\n");
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.starts_with("model name") || line.starts_with("flags") || line.starts_with("microcode")) text += line + "\n";
    if (line.empty()) break;  // (the first CPU's)
  }
  return HashBytes(text).Hex();
}

Status MicroVm::Save(const std::string& path) {
  return guest_->Save(path, std::chrono::seconds(60));
}

Result<std::unique_ptr<MicroVm>> MicroVm::Start(const MicroVmSpec& spec) {
  if (::access(spec.kernel.c_str(), R_OK) != 0) {
    return ErrnoError(errno, StrCat("microVM: guest kernel ", spec.kernel,
                                    " (build it with scripts/guest-kernel, or name one with --kernel / STRATA_VM_KERNEL)"));
  }
  const uint64_t memory = spec.memory ? spec.memory : kDefaultVmMemory;
  vmm::GuestSpec g = GuestSpecOf(spec);
  vmm::QemuOptions qemu;
  STRATA_ASSIGN_OR_RETURN(g.jail.cgroups, MakeVmCgroups(spec.cgroup, memory + vmm::QemuOverhead(spec.accel, qemu), spec.cpu_quota));
  g.jail.uid = VmUid(spec.id);
  g.jail.gid = VmUid(spec.id);
  g.jail.jail_binary = spec.jail_binary;
  if (spec.accel == "kvm") {
    struct ::stat st{};
    if (::stat("/dev/kvm", &st) == 0) g.jail.groups.push_back(st.st_gid);
  }
  std::unique_ptr<MicroVm> vm(new MicroVm());
  // The relay's socket first: AgentClient may connect while the guest boots.
  STRATA_RETURN_IF_ERROR(vm->StartRelay(spec.agent_socket));
  vmm::QemuHypervisor hypervisor(qemu);
  auto guest = hypervisor.Start(g);
  if (!guest.ok()) return guest.status();
  vm->guest_ = std::move(*guest);
  vm->relay_ = std::thread([raw = vm.get()] { raw->Relay(); });
  return vm;
}

Result<std::unique_ptr<MicroVm>> MicroVm::Adopt(const std::string& dir, const std::string& agent_socket) {
  vmm::QemuHypervisor hypervisor;
  STRATA_ASSIGN_OR_RETURN(auto guest, hypervisor.Adopt(dir + "/vm"));
  std::unique_ptr<MicroVm> vm(new MicroVm());
  vm->guest_ = std::move(guest);
  Status s = vm->StartRelay(agent_socket);
  if (!s.ok()) {
    vm->guest_->Release();
    return s;
  }
  vm->relay_ = std::thread([raw = vm.get()] { raw->Relay(); });
  return vm;
}

Status MicroVm::StartRelay(const std::string& agent_socket) {
  ::unlink(agent_socket.c_str());
  STRATA_ASSIGN_OR_RETURN(listener_, ListenUnix(agent_socket, 0600));
  mux_ = std::make_unique<StreamMux>(StreamMux::Options{.host = true});
  return OkStatus();
}

void MicroVm::Relay() {
  while (!stopping_) {
    auto channel = ConnectUnix(guest_->channel_path());
    if (channel.ok()) {
      Status s = mux_->Run(channel->get(), listener_.get());
      if (!s.ok() && !stopping_) STRATA_LOG(kWarn) << "microVM " << guest_->channel_path() << ": channel: " << s.ToString();
    }
    if (stopping_) break;
    // No guest to talk to: refuse callers for a moment, then dial again.
    pollfd p{listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) ::close(fd);
    }
  }
}

Status MicroVm::Stop() {
  stopping_ = true;
  if (mux_) mux_->Stop();
  if (relay_.joinable()) relay_.join();
  return guest_ ? guest_->Stop(std::chrono::seconds(3)) : OkStatus();
}

void MicroVm::Release() {
  stopping_ = true;
  if (mux_) mux_->Stop();
  if (relay_.joinable()) relay_.join();
  if (guest_) guest_->Release();
}

MicroVm::~MicroVm() {
  stopping_ = true;
  if (mux_) mux_->Stop();
  if (relay_.joinable()) relay_.join();
}

std::string MicroVm::Why() const { return guest_ ? guest_->ConsoleTail(600) : ""; }

}  // namespace strata::launcher
