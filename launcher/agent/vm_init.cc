// A microVM boots the kernel straight into the initramfs, whose /init is
// this agent. Disks are found by their serial numbers, not by probe order.
#include "launcher/agent/vm_init.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/random.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <net/route.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "launcher/protocol/layout.h"

namespace strata::launcher {

namespace {

constexpr const char* kNewRoot = "/mnt/root";
constexpr const char* kUpperMount = "/mnt/upper";
// Where the agent sets up the commands' cgroup, outside the new root (the
// commands see cgroupfs read-only).
constexpr const char* kCgroupSetup = "/mnt/cgroup";

Status Mount(const char* source, const std::string& target, const char* type, unsigned long flags, const std::string& data,
             const std::string& step) {
  STRATA_RETURN_IF_ERROR(MakeDirs(target, 0755).Annotate(step));
  if (::mount(source, target.c_str(), type, flags, data.empty() ? nullptr : data.c_str()) != 0) {
    return ErrnoError(errno, StrCat(step, ": mount ", type ? type : "", " ", source ? source : "", " on ", target,
                                    data.empty() ? "" : " (" + data + ")"));
  }
  return OkStatus();
}

std::map<std::string, std::string> KernelParameters() {
  std::map<std::string, std::string> params;
  auto text = ReadFileToString("/proc/cmdline");
  if (!text.ok()) return params;
  for (const auto& word : Split(*text, ' ')) {
    std::string w = word;
    while (!w.empty() && (w.back() == '\n' || w.back() == '\r')) w.pop_back();
    size_t eq = w.find('=');
    if (w.rfind("strata.", 0) == 0 && eq != std::string::npos) params[w.substr(7, eq - 7)] = w.substr(eq + 1);
  }
  return params;
}

// serial -> /dev/vdX
std::map<std::string, std::string> DisksBySerial() {
  std::map<std::string, std::string> disks;
  DIR* dir = ::opendir("/sys/block");
  if (!dir) return disks;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name.rfind("vd", 0) != 0) continue;
    auto serial = ReadFileToString("/sys/block/" + name + "/serial");
    if (!serial.ok()) continue;
    std::string s = *serial;
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
    disks[s] = "/dev/" + name;
  }
  ::closedir(dir);
  return disks;
}

// The /dev a container gets: a tmpfs with the usual nodes, devpts, shm.
Status MakeDev(const std::string& dev) {
  STRATA_RETURN_IF_ERROR(Mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=65536k", "make /dev"));
  struct Node {
    const char* name;
    unsigned major, minor;
  };
  for (const Node& n : {Node{"null", 1, 3}, Node{"zero", 1, 5}, Node{"full", 1, 7}, Node{"random", 1, 8},
                        Node{"urandom", 1, 9}, Node{"tty", 5, 0}}) {
    const std::string path = dev + "/" + n.name;
    if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(n.major, n.minor)) != 0) return ErrnoError(errno, "make /dev: mknod " + path);
    ::chmod(path.c_str(), 0666);
  }
  STRATA_RETURN_IF_ERROR(Mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620",
                               "make /dev"));
  STRATA_RETURN_IF_ERROR(Mount("shm", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=65536k", "make /dev"));
  for (const auto& [link, target] : {std::pair{"ptmx", "pts/ptmx"}, std::pair{"fd", "/proc/self/fd"},
                                     std::pair{"stdin", "/proc/self/fd/0"}, std::pair{"stdout", "/proc/self/fd/1"},
                                     std::pair{"stderr", "/proc/self/fd/2"}}) {
    if (::symlink(target, (dev + "/" + link).c_str()) != 0) return ErrnoError(errno, StrCat("make /dev: symlink ", link));
  }
  return OkStatus();
}

void LoopbackUp() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    ::ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  ::close(s);
}

// The network the launcher bridged to the guest's card (identity "net"):
// ADDR/32 on eth0, a route to the gateway on the link and the default
// route through it, as a container's namespace has them
// (launcher/net/netns.cc); names go to the node's DNS proxy on the gateway,
// as NodeNetwork::ResolvConf says for containers. Plain ioctls: the agent
// links no netlink library.
struct NetParams {
  in_addr address{}, gateway{};
  std::string gateway_text;
};

Result<NetParams> ParseNet(const std::string& value) {
  const auto parts = Split(value, ',');
  NetParams n;
  if (parts.size() != 2 || ::inet_pton(AF_INET, parts[0].c_str(), &n.address) != 1 ||
      ::inet_pton(AF_INET, parts[1].c_str(), &n.gateway) != 1) {
    return Error(EINVAL, "network: " + value + " is not ADDRESS,GATEWAY");
  }
  n.gateway_text = parts[1];
  return n;
}

// The resolv.conf guests get, in the initramfs (`initramfs`: its root,
// outside the sandbox's); returns an O_PATH descriptor of it.
Result<UniqueFd> WriteResolvConf(int initramfs, const NetParams& n) {
  const char* path = "resolv.conf";
  {
    UniqueFd f(::openat(initramfs, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!f) return ErrnoError(errno, "network: create the guest's resolv.conf");
    STRATA_RETURN_IF_ERROR(WriteFull(f.get(), StrCat("# strata: the node's DNS proxy answers the names this sandbox may reach\n",
                                                     "nameserver ", n.gateway_text, "\noptions timeout:2 attempts:2\n"))
                               .Annotate("network: write the guest's resolv.conf"));
  }
  UniqueFd fd(::openat(initramfs, path, O_PATH | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return ErrnoError(errno, "network: open the guest's resolv.conf");
  return fd;
}

Status ConfigureNetwork(const NetParams& n, int resolv_conf) {
  const in_addr address = n.address, gateway = n.gateway;
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return ErrnoError(errno, "network: socket");
  auto inet = [](sockaddr* out, in_addr a) {
    auto* sin = reinterpret_cast<sockaddr_in*>(out);
    sin->sin_family = AF_INET;
    sin->sin_addr = a;
  };
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  // The card is probed before init runs; a slow probe gets a second.
  for (int i = 0; i < 100 && ::if_nametoindex("eth0") == 0; ++i) ::usleep(10000);
  // IPv4 only, as a container's namespace (launcher/net/netns.cc): off before the link is up.
  for (const char* knob : {"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6",
                           "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"}) {
    if (UniqueFd f(::open(knob, O_WRONLY | O_CLOEXEC)); f) (void)WriteFull(f.get(), "1");
  }
  inet(&ifr.ifr_addr, address);
  if (::ioctl(s.get(), SIOCSIFADDR, &ifr) != 0) return ErrnoError(errno, "network: set the address of eth0");
  inet(&ifr.ifr_netmask, in_addr{INADDR_BROADCAST});
  if (::ioctl(s.get(), SIOCSIFNETMASK, &ifr) != 0) return ErrnoError(errno, "network: set the netmask of eth0");
  if (::ioctl(s.get(), SIOCGIFFLAGS, &ifr) != 0) return ErrnoError(errno, "network: read the flags of eth0");
  ifr.ifr_flags |= IFF_UP;
  if (::ioctl(s.get(), SIOCSIFFLAGS, &ifr) != 0) return ErrnoError(errno, "network: set eth0 up");
  char dev[] = "eth0";
  rtentry link{};
  inet(&link.rt_dst, gateway);
  inet(&link.rt_genmask, in_addr{INADDR_BROADCAST});
  link.rt_flags = RTF_UP | RTF_HOST;
  link.rt_dev = dev;
  if (::ioctl(s.get(), SIOCADDRT, &link) != 0) return ErrnoError(errno, "network: route to the gateway");
  rtentry route{};
  inet(&route.rt_dst, in_addr{INADDR_ANY});
  inet(&route.rt_genmask, in_addr{INADDR_ANY});
  inet(&route.rt_gateway, gateway);
  route.rt_flags = RTF_UP | RTF_GATEWAY;
  route.rt_dev = dev;
  if (::ioctl(s.get(), SIOCADDRT, &route) != 0) return ErrnoError(errno, "network: default route");
  // ICMP echo sockets for everyone, as in a container's namespace.
  if (UniqueFd f(::open("/proc/sys/net/ipv4/ping_group_range", O_WRONLY | O_CLOEXEC)); f) {
    (void)WriteFull(f.get(), "0 2147483647");
  }
  // /etc/resolv.conf: a read-only bind of the agent's own copy, as the
  // launcher binds the node's for a container. The copy lives in the
  // initramfs, which no path of the sandbox's root reaches: it is bound
  // through a descriptor opened before the switch.
  struct ::stat st{};
  if (::lstat("/etc/resolv.conf", &st) != 0 || !S_ISREG(st.st_mode)) {
    ::unlink("/etc/resolv.conf");
    STRATA_RETURN_IF_ERROR(MakeDirs("/etc", 0755).Annotate("network: resolv.conf"));
    UniqueFd f(::open("/etc/resolv.conf", O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!f) return ErrnoError(errno, "network: create /etc/resolv.conf");
  }
  const std::string ours = StrCat("/proc/self/fd/", resolv_conf);
  if (::mount(ours.c_str(), "/etc/resolv.conf", nullptr, MS_BIND, nullptr) != 0 ||
      ::mount(nullptr, "/etc/resolv.conf", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    return ErrnoError(errno, "network: bind /etc/resolv.conf");
  }
  return OkStatus();
}

}  // namespace

bool InMicroVm() {
  if (::getpid() != 1) return false;
  int accepting = 0;
  socklen_t len = sizeof accepting;
  return ::getsockopt(3, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0;
}

Result<UniqueFd> OpenAgentPort();

Result<MicroVmRoot> BootMicroVm() {
  // The kernel mounts nothing for an initramfs.
  STRATA_RETURN_IF_ERROR(Mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "", "boot"));
  STRATA_RETURN_IF_ERROR(Mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "", "boot"));
  STRATA_RETURN_IF_ERROR(Mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "", "boot"));
  auto params = KernelParameters();
  const int layers = std::atoi(params["layers"].c_str());
  if (layers <= 0) return Error(EINVAL, "boot: no strata.layers=N on the kernel command line");
  auto disks = DisksBySerial();
  std::vector<std::string> lowers;  // top first
  for (int i = 0; i < layers; ++i) {
    const std::string meta = disks[StrCat("l", i, "m")], blob = disks[StrCat("l", i, "b")];
    if (meta.empty() || blob.empty()) return Error(ENODEV, StrCat("boot: layer ", i, ": its disks (l", i, "m, l", i, "b) are missing"));
    const std::string at = StrCat("/mnt/layers/", i);
    STRATA_RETURN_IF_ERROR(Mount(meta.c_str(), at, "erofs", MS_RDONLY | MS_NODEV, "device=" + blob, StrCat("boot: layer ", i)));
    lowers.insert(lowers.begin(), at);
  }
  if (disks["upper"].empty()) return Error(ENODEV, "boot: the upper disk is missing");
  STRATA_RETURN_IF_ERROR(Mount(disks["upper"].c_str(), kUpperMount, "ext4", MS_NOATIME, "", "boot: upper disk"));
  STRATA_RETURN_IF_ERROR(MakeDirs(StrCat(kUpperMount, "/upper"), 0755).Annotate("boot: upper disk"));
  STRATA_RETURN_IF_ERROR(MakeDirs(StrCat(kUpperMount, "/work"), 0755).Annotate("boot: upper disk"));
  // As the container's overlay (launcher/container/sandbox.cc): whole
  // directories copied up, so the upper packs on its own.
  STRATA_RETURN_IF_ERROR(Mount("overlay", kNewRoot, "overlay", 0,
                               StrCat("lowerdir=", Join(lowers, ":"), ",upperdir=", kUpperMount, "/upper,workdir=", kUpperMount,
                                      "/work,redirect_dir=off,metacopy=off,index=off,volatile"),
                               "boot: overlay"));
  const std::string root = kNewRoot;
  STRATA_RETURN_IF_ERROR(Mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "", "root"));
  STRATA_RETURN_IF_ERROR(Mount("sysfs", root + "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "", "root"));
  STRATA_RETURN_IF_ERROR(MakeDev(root + "/dev"));
  STRATA_RETURN_IF_ERROR(Mount("tmpfs", root + kAgentSocketDir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=1m", "root"));
  {
    // The commands' seccomp program: the launcher put it in the initramfs
    // (a container's agent finds it in the same place, bound there).
    auto bpf = ReadFileToString(std::string("/") + kCommandSeccompName);
    if (!bpf.ok()) return bpf.status().Annotate("boot: the commands' seccomp program in the initramfs");
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(StrCat(root, kAgentSocketDir, "/", kCommandSeccompName), *bpf, false, 0644)
                               .Annotate("boot: the commands' seccomp program"));
  }
  // The commands' memory: all RAM but the reserve.
  // cgroupfs twice: writable outside the new root, where the agent makes
  // the commands' cgroup and keeps its cgroup.procs open, and read-only in
  // it, so no command leaves that cgroup or raises its limit (a mount with
  // a file open for writing could not be made read-only later).
  STRATA_RETURN_IF_ERROR(Mount("cgroup2", kCgroupSetup, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, "", "root"));
  STRATA_RETURN_IF_ERROR(
      Mount("cgroup2", root + "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "", "root"));
  MicroVmRoot out;
  // The upper disk's filesystem, for FIFREEZE: a descriptor only, so no
  // path in the new root shows the upper directory past the file rules.
  out.upper = UniqueFd(::open(kUpperMount, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!out.upper) return ErrnoError(errno, StrCat("root: open ", kUpperMount));
  {
    const std::string cg = kCgroupSetup;
    UniqueFd control(::open((cg + "/cgroup.subtree_control").c_str(), O_WRONLY | O_CLOEXEC));
    if (!control || ::write(control.get(), "+memory +pids", 13) < 0) return ErrnoError(errno, "commands' cgroup: enable memory");
    if (::mkdir((cg + "/commands").c_str(), 0755) != 0 && errno != EEXIST) return ErrnoError(errno, "commands' cgroup: mkdir");
    uint64_t total_kb = 0;
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    while (meminfo >> key) {
      if (key == "MemTotal:") {
        meminfo >> total_kb;
        break;
      }
    }
    const uint64_t total = total_kb * 1024;
    const uint64_t limit = total > 2 * kVmAgentReserve ? total - kVmAgentReserve : total / 2;
    UniqueFd max(::open((cg + "/commands/memory.max").c_str(), O_WRONLY | O_CLOEXEC));
    const std::string value = StrCat(limit);
    if (!max || ::write(max.get(), value.data(), value.size()) < 0) return ErrnoError(errno, "commands' cgroup: memory.max");
    out.command_cgroup = UniqueFd(::open((cg + "/commands/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!out.command_cgroup) return ErrnoError(errno, "commands' cgroup: open cgroup.procs");
  }
  STRATA_ASSIGN_OR_RETURN(out.port, OpenAgentPort());
  // The initramfs, which the switch hides: the guest's resolv.conf is made
  // there when the launcher gives the guest its network.
  out.initramfs = UniqueFd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!out.initramfs) return ErrnoError(errno, "root: open the initramfs");
  // The switch: the new root moved over the initramfs (which stays, hidden).
  if (::chdir(kNewRoot) != 0) return ErrnoError(errno, "switch root: chdir");
  if (::mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) return ErrnoError(errno, "switch root: move the root");
  if (::chroot(".") != 0) return ErrnoError(errno, "switch root: chroot");
  if (::chdir("/") != 0) return ErrnoError(errno, "switch root: chdir /");
  ::chmod("/.strata", 0700);
  ::sethostname("sandbox", 7);  // until the launcher names it (ApplyIdentity)
  LoopbackUp();
  return out;
}

Status ApplyIdentity(int initramfs, const nlohmann::json& identity) {
  static std::mutex mu;
  static std::string net_set;  // "ADDRESS,GATEWAY" once the network is set
  std::lock_guard lock(mu);
  if (!identity.is_object()) return Error(EINVAL, "identity: not an object");
  if (auto h = identity.find("hostname"); h != identity.end() && h->is_string()) {
    const std::string name = h->get<std::string>();
    if (::sethostname(name.data(), name.size()) != 0) return ErrnoError(errno, "identity: set the hostname " + name);
  }
  if (auto t = identity.find("time_ns"); t != identity.end() && t->is_number_integer()) {
    // A restored guest's clock is where the saved one stopped.
    const int64_t ns = t->get<int64_t>();
    const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    if (::clock_settime(CLOCK_REALTIME, &ts) != 0) return ErrnoError(errno, "identity: set the clock");
  }
  if (auto e = identity.find("entropy"); e != identity.end() && e->is_string()) {
    // Every guest restored from one state starts with the same random
    // state: the node's entropy is mixed in and the kernel's generator
    // reseeded from it before anything else runs.
    const std::string hex = e->get<std::string>();
    if (hex.size() % 8 != 0 || hex.size() > 1024) return Error(EINVAL, "identity: entropy is not whole 32-bit words of hex");
    std::vector<uint32_t> words(sizeof(rand_pool_info) / 4 + hex.size() / 8);
    auto* pool = reinterpret_cast<rand_pool_info*>(words.data());
    pool->entropy_count = static_cast<int>(hex.size() / 2 * 8);
    pool->buf_size = static_cast<int>(hex.size() / 2);
    auto* bytes = reinterpret_cast<unsigned char*>(pool->buf);
    for (size_t i = 0; i < hex.size(); i += 2) {
      const std::string byte = hex.substr(i, 2);
      char* end = nullptr;
      const unsigned long v = std::strtoul(byte.c_str(), &end, 16);
      if (end != byte.c_str() + 2) return Error(EINVAL, "identity: entropy is not hex");
      bytes[i / 2] = static_cast<unsigned char>(v);
    }
    UniqueFd random(::open("/dev/urandom", O_RDWR | O_CLOEXEC));
    if (!random) return ErrnoError(errno, "identity: open /dev/urandom");
    if (::ioctl(random.get(), RNDADDENTROPY, pool) != 0) return ErrnoError(errno, "identity: add entropy");
    if (::ioctl(random.get(), RNDRESEEDCRNG) != 0) return ErrnoError(errno, "identity: reseed the random generator");
  }
  if (auto n = identity.find("net"); n != identity.end() && n->is_object()) {
    const std::string value = StrCat(n->value("address", ""), ",", n->value("gateway", ""));
    if (net_set.empty()) {
      STRATA_ASSIGN_OR_RETURN(NetParams net, ParseNet(value));
      STRATA_ASSIGN_OR_RETURN(UniqueFd resolv_conf, WriteResolvConf(initramfs, net));
      STRATA_RETURN_IF_ERROR(ConfigureNetwork(net, resolv_conf.get()));
      net_set = value;
    } else if (net_set != value) {
      return Error(EALREADY, "identity: the network is set already (" + net_set + ")");
    }
  }
  return OkStatus();
}

Result<UniqueFd> OpenAgentPort() {
  // The port's device node appears when the driver probes it.
  for (int attempt = 0; attempt < 500; ++attempt) {
    DIR* dir = ::opendir("/sys/class/virtio-ports");
    if (dir) {
      std::string found;
      while (dirent* e = ::readdir(dir)) {
        auto name = ReadFileToString(StrCat("/sys/class/virtio-ports/", e->d_name, "/name"));
        if (name.ok() && name->rfind("strata.agent", 0) == 0) found = e->d_name;
      }
      ::closedir(dir);
      if (!found.empty()) {
        UniqueFd fd(::open(("/dev/" + found).c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK));
        if (fd) return fd;
      }
    }
    ::usleep(10000);
  }
  return Error(ENODEV, "the agent channel (virtio-serial port strata.agent) did not appear");
}

Status FreezeUpper(int upper, bool freeze) {
  if (::ioctl(upper, freeze ? FIFREEZE : FITHAW, 0) != 0) {
    return ErrnoError(errno, freeze ? "freeze the upper disk" : "thaw the upper disk");
  }
  return OkStatus();
}

void PowerOff() {
  ::sync();
  ::reboot(RB_POWER_OFF);
  // (With reboot=t and -no-reboot a restart also ends QEMU.)
  ::reboot(RB_AUTOBOOT);
  std::_Exit(1);
}

}  // namespace strata::launcher
