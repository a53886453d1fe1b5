// Network namespaces and veth pairs over rtnetlink.
#include "launcher/net/netns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <libmnl/libmnl.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/if_tun.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "launcher/net/policy.h"

namespace strata::launcher {

namespace {

// One rtnetlink socket and a request at a time (each answered with an ack).
class Rtnl {
 public:
  static Result<Rtnl> Open() {
    mnl_socket* s = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
    if (!s) return ErrnoError(errno, "open rtnetlink socket");
    if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) < 0) {
      int e = errno;
      mnl_socket_close(s);
      return ErrnoError(e, "bind rtnetlink socket");
    }
    return Rtnl(s);
  }
  Rtnl(Rtnl&& o) noexcept : sock_(std::exchange(o.sock_, nullptr)) {}
  ~Rtnl() {
    if (sock_) mnl_socket_close(sock_);
  }

  nlmsghdr* Begin(uint16_t type, uint16_t flags) {
    nlmsghdr* h = mnl_nlmsg_put_header(buf_);
    h->nlmsg_type = type;
    h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    h->nlmsg_seq = ++seq_;
    return h;
  }

  // Sends the message and waits for its ack; the error names `what`.
  Status Send(nlmsghdr* h, std::string_view what) {
    if (mnl_socket_sendto(sock_, h, h->nlmsg_len) < 0) return ErrnoError(errno, StrCat("send ", what));
    char reply[8192];
    const unsigned port = mnl_socket_get_portid(sock_);
    while (true) {
      ssize_t n = mnl_socket_recvfrom(sock_, reply, sizeof reply);
      if (n < 0) return ErrnoError(errno, StrCat("receive the answer to ", what));
      int r = mnl_cb_run(reply, static_cast<size_t>(n), h->nlmsg_seq, port, nullptr, nullptr);
      if (r == MNL_CB_ERROR) return ErrnoError(errno, what);
      if (r == MNL_CB_STOP) return OkStatus();
    }
  }

  char* buffer() { return buf_; }

 private:
  explicit Rtnl(mnl_socket* s) : sock_(s) {}
  mnl_socket* sock_ = nullptr;
  uint32_t seq_ = 0;
  alignas(nlmsghdr) char buf_[8192];
};

// Sets the interface up (and its alias, when given: the kernel takes one
// only on a change, not at creation).
Status SetUp(Rtnl& nl, int ifindex, std::string_view name, const std::string& alias = "") {
  nlmsghdr* h = nl.Begin(RTM_NEWLINK, 0);
  auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = ifindex;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  if (!alias.empty()) mnl_attr_put_strz(h, IFLA_IFALIAS, alias.c_str());
  return nl.Send(h, StrCat("set ", name, " up"));
}

Status AddAddress(Rtnl& nl, int ifindex, uint32_t addr, std::string_view name) {
  nlmsghdr* h = nl.Begin(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE);
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifaddrmsg)));
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = 32;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = static_cast<unsigned>(ifindex);
  const uint32_t be = htonl(addr);
  mnl_attr_put_u32(h, IFA_LOCAL, be);
  mnl_attr_put_u32(h, IFA_ADDRESS, be);
  return nl.Send(h, StrCat("add address ", Ipv4ToString(addr), " to ", name));
}

Status DeleteAddress(Rtnl& nl, int ifindex, uint32_t addr, std::string_view name) {
  nlmsghdr* h = nl.Begin(RTM_DELADDR, 0);
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifaddrmsg)));
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = 32;
  ifa->ifa_index = static_cast<unsigned>(ifindex);
  mnl_attr_put_u32(h, IFA_LOCAL, htonl(addr));
  Status s = nl.Send(h, StrCat("remove address ", Ipv4ToString(addr), " from ", name));
  if (!s.ok() && s.code() == EADDRNOTAVAIL) return OkStatus();  // (gone already)
  return s;
}

// Makes `port` a port of the bridge `master` (and sets it up).
Status SetMaster(Rtnl& nl, int port, int master, std::string_view name) {
  nlmsghdr* h = nl.Begin(RTM_NEWLINK, 0);
  auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = port;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  mnl_attr_put_u32(h, IFLA_MASTER, static_cast<uint32_t>(master));
  return nl.Send(h, StrCat("add ", name, " to the guest's bridge"));
}

// A route to dst/prefix out of ifindex, through `via` when non-zero.
Status AddRoute(Rtnl& nl, uint32_t dst, int prefix, int ifindex, uint32_t via, std::string_view what) {
  nlmsghdr* h = nl.Begin(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE);
  auto* rt = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(h, sizeof(rtmsg)));
  rt->rtm_family = AF_INET;
  rt->rtm_dst_len = static_cast<unsigned char>(prefix);
  rt->rtm_table = RT_TABLE_MAIN;
  rt->rtm_protocol = RTPROT_STATIC;
  rt->rtm_scope = via ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK;
  rt->rtm_type = RTN_UNICAST;
  if (prefix) mnl_attr_put_u32(h, RTA_DST, htonl(dst));
  if (via) mnl_attr_put_u32(h, RTA_GATEWAY, htonl(via));
  mnl_attr_put_u32(h, RTA_OIF, static_cast<uint32_t>(ifindex));
  return nl.Send(h, what);
}

void WriteSysctl(const std::string& path, const char* value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() >= 0) (void)!::write(fd.get(), value, std::strlen(value));
}

// Runs `fn` on a thread that has joined the network namespace `ns_fd`
// (setns changes only the calling thread; the thread then ends).
Status InNetns(int ns_fd, const std::function<Status()>& fn) {
  Status result;
  std::thread t([&] {
    if (::setns(ns_fd, CLONE_NEWNET) != 0) {
      result = ErrnoError(errno, "enter the sandbox's network namespace");
      return;
    }
    result = fn();
  });
  t.join();
  return result;
}

}  // namespace

Result<UniqueFd> CreateNetns() {
  // On a thread of its own, which ends with the namespace it unshared
  // (only the descriptor holds it then).
  Result<UniqueFd> result = Error(EINVAL, "");
  std::thread t([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      result = ErrnoError(errno, "unshare a network namespace");
      return;
    }
    UniqueFd ns(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!ns) result = ErrnoError(errno, "open the new network namespace");
    else result = std::move(ns);
  });
  t.join();
  return result;
}

Status RemoveNetnsFile(const std::string& path) {
  if (::umount2(path.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
    return ErrnoError(errno, "unmount " + path);
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError(errno, "remove " + path);
  return OkStatus();
}

Status CreateSandboxLink(const SandboxLink& link) {
  STRATA_ASSIGN_OR_RETURN(Rtnl nl, Rtnl::Open());
  {
    nlmsghdr* h = nl.Begin(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
    auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
    ifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(h, IFLA_IFNAME, link.host_if.c_str());
    nlattr* info = mnl_attr_nest_start(h, IFLA_LINKINFO);
    mnl_attr_put_strz(h, IFLA_INFO_KIND, "veth");
    nlattr* data = mnl_attr_nest_start(h, IFLA_INFO_DATA);
    nlattr* peer = mnl_attr_nest_start(h, VETH_INFO_PEER);
    auto* pifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
    pifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(h, IFLA_IFNAME, "eth0");
    mnl_attr_put_u32(h, IFLA_NET_NS_FD, static_cast<uint32_t>(link.netns_fd));
    mnl_attr_nest_end(h, peer);
    mnl_attr_nest_end(h, data);
    mnl_attr_nest_end(h, info);
    STRATA_RETURN_IF_ERROR(nl.Send(h, "create veth " + link.host_if));
  }
  const int host_index = static_cast<int>(::if_nametoindex(link.host_if.c_str()));
  if (host_index == 0) return ErrnoError(errno, "find " + link.host_if);
  WriteSysctl(StrCat("/proc/sys/net/ipv6/conf/", link.host_if, "/disable_ipv6"), "1");
  STRATA_RETURN_IF_ERROR(SetUp(nl, host_index, link.host_if, link.owner));
  STRATA_RETURN_IF_ERROR(AddRoute(nl, link.address, 32, host_index, 0,
                                  StrCat("route ", Ipv4ToString(link.address), " to ", link.host_if)));
  return InNetns(link.netns_fd, [&]() -> Status {
    WriteSysctl("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1");
    WriteSysctl("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
    // ICMP echo sockets for everyone in the sandbox (ping without raw
    // sockets, as container engines allow); the node's rules decide.
    WriteSysctl("/proc/sys/net/ipv4/ping_group_range", "0 2147483647");
    STRATA_ASSIGN_OR_RETURN(Rtnl inner, Rtnl::Open());
    STRATA_RETURN_IF_ERROR(SetUp(inner, 1, "lo"));
    const int eth0 = static_cast<int>(::if_nametoindex("eth0"));
    if (eth0 == 0) return ErrnoError(errno, "find eth0 in the sandbox's namespace");
    STRATA_RETURN_IF_ERROR(AddAddress(inner, eth0, link.address, "the sandbox's eth0"));
    STRATA_RETURN_IF_ERROR(SetUp(inner, eth0, "the sandbox's eth0"));
    STRATA_RETURN_IF_ERROR(AddRoute(inner, link.gateway, 32, eth0, 0, "route to the gateway in the sandbox"));
    return AddRoute(inner, 0, 0, eth0, link.gateway, "default route in the sandbox");
  });
}

Result<UniqueFd> OpenGuestTap(int netns_fd, uint32_t address) {
  UniqueFd tap;
  Status s = InNetns(netns_fd, [&]() -> Status {
    STRATA_ASSIGN_OR_RETURN(Rtnl nl, Rtnl::Open());
    const int eth0 = static_cast<int>(::if_nametoindex("eth0"));
    if (eth0 == 0) return ErrnoError(errno, "find eth0 in the sandbox's namespace");
    // The address is the guest's now: the namespace must not answer ARP
    // for it (its routes go with it).
    STRATA_RETURN_IF_ERROR(DeleteAddress(nl, eth0, address, "the sandbox's eth0"));
    {
      nlmsghdr* h = nl.Begin(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
      auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
      ifi->ifi_family = AF_UNSPEC;
      mnl_attr_put_strz(h, IFLA_IFNAME, "br0");
      nlattr* info = mnl_attr_nest_start(h, IFLA_LINKINFO);
      mnl_attr_put_strz(h, IFLA_INFO_KIND, "bridge");
      mnl_attr_nest_end(h, info);
      Status made = nl.Send(h, "create the guest's bridge br0");
      if (!made.ok() && made.code() != EEXIST) return made;
    }
    // Frames crossing the bridge are not the namespace's to filter (the
    // node's rules judge them on the veth).
    for (const char* knob : {"bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables"}) {
      WriteSysctl(StrCat("/proc/sys/net/bridge/", knob), "0");
    }
    const int bridge = static_cast<int>(::if_nametoindex("br0"));
    if (bridge == 0) return ErrnoError(errno, "find br0 in the sandbox's namespace");
    STRATA_RETURN_IF_ERROR(SetUp(nl, bridge, "br0"));
    STRATA_RETURN_IF_ERROR(SetMaster(nl, eth0, bridge, "eth0"));
    // The tap, not persistent: it lives as long as a descriptor of it.
    tap = UniqueFd(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
    if (!tap) return ErrnoError(errno, "open /dev/net/tun");
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "tap0", IFNAMSIZ - 1);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    if (::ioctl(tap.get(), TUNSETIFF, &ifr) != 0) return ErrnoError(errno, "create the guest's tap0");
    const int tap_index = static_cast<int>(::if_nametoindex("tap0"));
    if (tap_index == 0) return ErrnoError(errno, "find tap0 in the sandbox's namespace");
    return SetMaster(nl, tap_index, bridge, "tap0");
  });
  if (!s.ok()) return s.Annotate("give the sandbox's network to its guest");
  return tap;
}

Status DeleteLink(const std::string& name) {
  const int index = static_cast<int>(::if_nametoindex(name.c_str()));
  if (index == 0) return OkStatus();
  STRATA_ASSIGN_OR_RETURN(Rtnl nl, Rtnl::Open());
  nlmsghdr* h = nl.Begin(RTM_DELLINK, 0);
  auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = index;
  Status s = nl.Send(h, "delete " + name);
  if (!s.ok() && s.code() == ENODEV) return OkStatus();
  return s;
}

bool LinkExists(const std::string& name) { return ::if_nametoindex(name.c_str()) != 0; }

std::string LinkAlias(const std::string& name) {
  auto alias = ReadFileToString("/sys/class/net/" + name + "/ifalias");
  if (!alias.ok()) return "";
  std::string a = *alias;
  while (!a.empty() && (a.back() == '\n' || a.back() == ' ')) a.pop_back();
  return a;
}

Status EnsureGatewayAddress(uint32_t gateway) {
  STRATA_ASSIGN_OR_RETURN(Rtnl nl, Rtnl::Open());
  return AddAddress(nl, 1, gateway, "lo");
}

}  // namespace strata::launcher
