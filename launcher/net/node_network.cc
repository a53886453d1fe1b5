// NodeNetwork: pool, plumbing, rules and the proxy, per sandbox.
#include "launcher/net/node_network.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/fs.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "launcher/net/netns.h"

namespace strata::launcher {

using nlohmann::json;

Result<sockaddr_in> ParseDnsServer(const std::string& text) {
  std::string host = text;
  uint16_t port = 53;
  if (size_t colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    char* end = nullptr;
    long p = std::strtol(text.c_str() + colon + 1, &end, 10);
    if (*end != '\0' || p < 1 || p > 65535) return Error(EINVAL, "DNS server " + Quote(text) + ": bad port");
    port = static_cast<uint16_t>(p);
  }
  auto a = ParseIpv4(host);
  if (!a) return Error(EINVAL, "DNS server " + Quote(text) + ": not an IPv4 address (with an optional :PORT)");
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_port = htons(port);
  s.sin_addr.s_addr = htonl(*a);
  return s;
}

Result<sockaddr_in> SystemDnsServer(const std::string& resolv_conf) {
  std::ifstream in(resolv_conf);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, value;
    if (words >> key >> value && key == "nameserver" && ParseIpv4(value)) return ParseDnsServer(value);
  }
  return Error(ENOENT, "find an IPv4 nameserver in " + resolv_conf + " for the sandboxes' DNS proxy (give --dns-upstream)");
}

std::string SandboxNet::NamespacePath() const {
  if (ns && *ns) return StrCat("/proc/", ::getpid(), "/fd/", ns->get());
  return "";
}

json SandboxNet::ToJson() const {
  json j = {{"key", key}, {"ifname", ifname}, {"address", Ipv4ToString(address)},
            {"generation", generation}, {"policy", policy.ToJson()}};
  if (!netns.empty()) j["netns"] = netns;
  return j;
}

Result<SandboxNet> SandboxNet::FromJson(const json& j) {
  if (!j.is_object()) return Error(EINVAL, "sandbox network state: not an object");
  SandboxNet n;
  n.key = j.value("key", "");
  n.netns = j.value("netns", "");
  n.ifname = j.value("ifname", "");
  auto a = ParseIpv4(j.value("address", ""));
  if (!a || n.key.empty() || n.ifname.empty()) return Error(EINVAL, "sandbox network state: incomplete");
  n.address = *a;
  n.generation = j.value("generation", uint32_t{1});
  STRATA_ASSIGN_OR_RETURN(n.policy, NetPolicy::FromJson(j.value("policy", json())));
  return n;
}

namespace {
std::string RandomKey() {
  uint8_t b[6];
  if (::getrandom(b, sizeof b, 0) != sizeof b) std::abort();
  return HexEncode(b);
}
// A sandbox's first generation (its conntrack mark): random, so a new
// sandbox on a reused address never matches connections of an old one.
uint32_t RandomGeneration() {
  uint32_t g = 0;
  while (g == 0) {
    if (::getrandom(&g, sizeof g, 0) != sizeof g) std::abort();
  }
  return g;
}
}  // namespace

Result<std::shared_ptr<NodeNetwork>> NodeNetwork::Open(const NetworkConfig& config) {
  if (config.pool.prefix > 24 || config.pool.prefix < 8) {
    return Error(EINVAL, "sandbox address pool " + config.pool.ToString() + ": give a /8 to /24");
  }
  auto forward = ReadFileToString("/proc/sys/net/ipv4/ip_forward");
  if (!forward.ok() || forward->empty() || (*forward)[0] != '1') {
    return Error(ENOTSUP, "sandbox networks need IP forwarding (net.ipv4.ip_forward=1): run `launcher doctor --fix`");
  }
  std::shared_ptr<NodeNetwork> n(new NodeNetwork());
  n->config_ = config;
  if (n->config_.table.empty()) {
    std::string t = "strata_" + config.pool.ToString() + (config.pool.prefix == 32 ? "_32" : "");
    for (char& ch : t) ch = (ch == '.' || ch == '/') ? '_' : ch;
    n->config_.table = t;
  }
  n->config_.netns_dir = JoinPath(config.netns_dir, n->config_.table);
  STRATA_RETURN_IF_ERROR(EnsureGatewayAddress(config.gateway()).Annotate("sandbox networks: gateway"));
  DnsProxyConfig pc;
  pc.listen = config.gateway();
  pc.port = config.dns_port;
  pc.grace_seconds = config.dns_grace_seconds;
  if (config.dns_upstream) {
    pc.upstream = *config.dns_upstream;
  } else {
    STRATA_ASSIGN_OR_RETURN(pc.upstream, SystemDnsServer());
  }
  NodeNetwork* raw = n.get();
  DnsProxyHooks hooks;
  hooks.policy = [raw](uint32_t source) { return raw->PolicyOf(source); };
  hooks.admit = [raw](uint32_t source, const std::string& name, const std::vector<uint32_t>& addrs,
                      const std::vector<uint16_t>& ports, uint32_t seconds) {
    return raw->AdmitFor(source, name, addrs, ports, seconds);
  };
  // The proxy first: its port on the pool's gateway is the node's hold on
  // the pool (a second daemon given the same pool fails here, before it
  // touches the first one's rules).
  auto proxy = DnsProxy::Start(pc, std::move(hooks));
  if (!proxy.ok()) {
    return proxy.status().Annotate(StrCat("sandbox networks: pool ", config.pool.ToString(), " (another daemon's?)"));
  }
  n->proxy_ = std::move(*proxy);
  FirewallConfig fc;
  fc.table = n->config_.table;
  fc.pool = config.pool;
  fc.gateway = config.gateway();
  fc.dns_port = config.dns_port;
  fc.private_ok = config.private_ok;
  fc.if_prefix = config.if_prefix;
  STRATA_ASSIGN_OR_RETURN(n->firewall_, Firewall::Open(fc));
  return n;
}

NodeNetwork::~NodeNetwork() {
  proxy_.reset();  // first: its threads call into this object
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  refill_cv_.notify_all();
  if (refill_.joinable()) refill_.join();
  // Warm namespaces are only a cache: they go (their veths with them).
  for (const auto& slot : warm_) DiscardSlot(slot);
}

std::string NodeNetwork::ResolvConf() const {
  return StrCat("# strata: the node's DNS proxy answers the names this sandbox may reach\nnameserver ",
                Ipv4ToString(config_.gateway()), "\noptions timeout:2 attempts:2\n");
}

Result<uint32_t> NodeNetwork::Allocate() {
  // The lowest free address (so addresses are reused), after the gateway.
  const uint32_t first = config_.pool.addr + 2, last = config_.pool.Last() - 1;
  uint32_t candidate = first;
  while (candidate <= last && (by_address_.count(candidate) || reserved_.count(candidate))) ++candidate;
  if (candidate > last) return Error(EUSERS, "sandbox address pool " + config_.pool.ToString() + " is full");
  return candidate;
}

std::optional<NetPolicy> NodeNetwork::PolicyOf(uint32_t address) const {
  std::lock_guard lock(mu_);
  auto it = by_address_.find(address);
  if (it == by_address_.end()) return std::nullopt;
  return it->second.net.policy;
}

Status NodeNetwork::AdmitFor(uint32_t address, const std::string& name, const std::vector<uint32_t>& all,
                             const std::vector<uint16_t>& ports, uint32_t seconds) {
  // Never what is always refused (a name that resolves to the node's
  // private ranges or the metadata address): the rules look at admitted
  // names first.
  std::vector<uint32_t> addrs;
  for (uint32_t a : all) {
    if (!firewall_->AlwaysRefused(a)) addrs.push_back(a);
  }
  if (addrs.empty()) return OkStatus();
  // No policy change slips between the check and the rule (change_mu_);
  // lookups of other sandboxes' policies (mu_) do not wait for the rule.
  std::lock_guard change(change_mu_);
  std::string key;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    auto it = by_address_.find(address);
    if (it == by_address_.end()) return Error(ENOENT, "no sandbox at " + Ipv4ToString(address));
    // `open` admits every public address anyway; admitting its names would
    // only open the DNS-over-HTTPS resolvers' port 443 (checked after names).
    if (it->second.net.policy.mode != NetMode::kAllow) return OkStatus();
    // The policy may have changed since the proxy asked: only what it admits now.
    if (it->second.net.policy.PortsForName(name) != ports) return Error(EAGAIN, "the policy changed during the lookup of " + name);
    // The same answer again while its admission has (nearly) the time it
    // asks for left: nothing to change (a burst of lookups of one name
    // costs no rule update each).
    const auto wanted = now + std::chrono::seconds(seconds) - std::chrono::milliseconds(config_.dns_grace_seconds * 500);
    for (const auto& r : it->second.resolved) {
      if (r.name == name && r.addresses == addrs && r.ports == ports && r.until >= wanted) return OkStatus();
    }
    key = it->second.net.key;
  }
  STRATA_RETURN_IF_ERROR(firewall_->Admit(key, addrs, ports, seconds));
  std::lock_guard lock(mu_);
  auto it = by_address_.find(address);
  if (it == by_address_.end() || it->second.net.key != key) return OkStatus();  // (destroyed meanwhile)
  auto& resolved = it->second.resolved;
  std::erase_if(resolved, [&](const Resolved& r) { return r.until <= now || (r.name == name && r.addresses == addrs); });
  if (resolved.size() >= 4096) resolved.erase(resolved.begin());
  resolved.push_back({name, addrs, ports, now + std::chrono::seconds(seconds)});
  return OkStatus();
}

Result<NodeNetwork::Slot> NodeNetwork::Prepare() {
  Slot slot;
  slot.key = RandomKey();
  {
    std::lock_guard lock(mu_);
    STRATA_ASSIGN_OR_RETURN(slot.address, Allocate());
    reserved_.insert(slot.address);
  }
  auto ns = CreateNetns();
  Status s = ns.status();
  if (ns.ok()) {
    slot.ns = std::make_shared<const UniqueFd>(std::move(*ns));
    s = CreateSandboxLink({slot.ns->get(), config_.if_prefix + slot.key, config_.table, slot.address, config_.gateway()});
  }
  if (!s.ok()) {
    DiscardSlot(slot);
    return s.Annotate("prepare a sandbox network");
  }
  return slot;
}

void NodeNetwork::DiscardSlot(const Slot& slot) {
  // The namespace goes with its last descriptor (the slot's, closed by its
  // owner): the kernel then removes it and its veth pair in the background
  // (deleting the veth here would wait out an RCU grace period, 10-20 ms).
  std::lock_guard lock(mu_);
  reserved_.erase(slot.address);
}

void NodeNetwork::Refill() {
  // Below the daemon's other work: on a busy node the create that took a
  // namespace goes first, the next one is made in the gaps.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (warm_.size() >= config_.warm) {
      refill_cv_.wait(lock);
      continue;
    }
    lock.unlock();
    auto slot = Prepare();
    lock.lock();
    if (!slot.ok()) {
      STRATA_LOG(kWarn) << "warm sandbox networks: " << slot.status().ToString();
      refill_cv_.wait_for(lock, std::chrono::seconds(5));
      continue;
    }
    warm_.push_back(*slot);
  }
}

Result<SandboxNet> NodeNetwork::Attach(const std::string& id, const NetPolicy& policy) {
  if (!policy.routed()) return Error(EINVAL, "network: only modes allow and open get an interface");
  std::optional<Slot> slot;
  {
    std::lock_guard lock(mu_);
    if (by_id_.count(id)) return Error(EEXIST, "network of sandbox " + id + ": exists");
    if (!warm_.empty()) {
      slot = warm_.back();
      warm_.pop_back();
    }
  }
  refill_cv_.notify_all();
  if (!slot) {
    auto made = Prepare();
    if (!made.ok()) return made.status().Annotate("network of sandbox " + id);
    slot = *made;
  }
  SandboxNet net;
  net.key = slot->key;
  net.policy = policy;
  net.ifname = config_.if_prefix + slot->key;
  net.ns = slot->ns;
  net.address = slot->address;
  net.generation = RandomGeneration();
  if (Status s = firewall_->AddSandbox({net.key, net.ifname, net.address, net.generation, policy}); !s.ok()) {
    DiscardSlot(*slot);
    return s.Annotate("network of sandbox " + id);
  }
  std::lock_guard lock(mu_);
  reserved_.erase(net.address);
  SandboxNet kept = net;
  kept.ns.reset();  // (the sandbox's to drop once its processes hold it)
  by_address_[net.address] = {id, std::move(kept), {}};
  by_id_[id] = net.address;
  return net;
}

Status NodeNetwork::Adopt(const std::string& id, const SandboxNet& net) {
  std::lock_guard change(change_mu_);
  {
    std::lock_guard lock(mu_);
    if (auto it = by_address_.find(net.address); it != by_address_.end() && it->second.id != id) {
      return Error(EEXIST, StrCat("network of sandbox ", id, ": its address ", Ipv4ToString(net.address), " is ", it->second.id, "'s"));
    }
    by_address_[net.address] = {id, net};
    by_id_[id] = net.address;
  }
  if (!LinkExists(net.ifname)) return Error(ENOENT, "network of sandbox " + id + ": its interface " + net.ifname + " is gone");
  // An older daemon's namespace file: the sandbox's processes hold the
  // namespace; the file only held a mount in every container create's copy
  // of the node's mount table.
  if (!net.netns.empty()) {
    if (Status s = RemoveNetnsFile(net.netns); !s.ok()) STRATA_LOG(kWarn) << "sandbox " << id << ": " << s.ToString();
  }
  // The recorded policy is the truth (a crash may have come between
  // recording a change and making it): its rules are made again as
  // recorded, with the same generation, so open connections it admitted
  // carry on. What names resolved to goes (the next lookup admits again).
  SandboxRules rules{net.key, net.ifname, net.address, net.generation, net.policy};
  Status replaced = firewall_->ReplacePolicy(rules, {});
  if (replaced.code() != ENOENT) return replaced;
  STRATA_LOG(kWarn) << "sandbox " << id << ": its network rules were gone; made again";
  return firewall_->AddSandbox(rules);
}

Result<SandboxNet> NodeNetwork::SetPolicy(const std::string& id, const NetPolicy& policy,
                                          const std::function<Status(const SandboxNet&)>& persist) {
  // No answer of the proxy lands between (change_mu_): the rules and the
  // proxy's view change together. What names resolved to stays for the
  // names the new policy admits (on its ports, for the time left).
  std::lock_guard change(change_mu_);
  SandboxNet old;
  std::vector<Firewall::Admission> keep;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
      return Error(EBADSLT, "network of sandbox " + id + ": it was created without an interface (mode none or host); "
                            "create it with mode allow or open (an empty allow list reaches nothing) to change it later");
    }
    auto live = by_address_.find(it->second);
    if (live == by_address_.end()) return Error(ENOENT, "network of sandbox " + id + ": gone");
    old = live->second.net;
    const auto now = std::chrono::steady_clock::now();
    auto& resolved = live->second.resolved;
    std::erase_if(resolved, [&](const Resolved& r) { return r.until <= now || policy.PortsForName(r.name).empty(); });
    for (const auto& r : resolved) {
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(r.until - now).count();
      keep.push_back({r.addresses, policy.PortsForName(r.name), static_cast<uint32_t>(std::max<int64_t>(left, 1))});
    }
  }
  SandboxNet next = old;
  next.policy = policy;
  next.generation = old.generation + 1 == 0 ? 1 : old.generation + 1;
  // Recorded first: after a crash the recorded policy is made again.
  if (persist) STRATA_RETURN_IF_ERROR(persist(next).Annotate("record the new network policy"));
  if (Status s = firewall_->ReplacePolicy({next.key, next.ifname, next.address, next.generation, next.policy}, keep); !s.ok()) {
    if (persist) persist(old).IgnoreError();
    return s;
  }
  std::lock_guard lock(mu_);
  if (auto live = by_address_.find(next.address); live != by_address_.end() && live->second.id == id) live->second.net = next;
  return next;
}

Status NodeNetwork::Detach(const std::string& id, const SandboxNet& net) {
  Status first;
  auto keep = [&](Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  Status removed = firewall_->RemoveSandbox(net.key);
  const bool rules_gone = removed.ok();
  keep(std::move(removed));
  // The veth goes with the namespace, in the background (see DiscardSlot),
  // once the back end's processes are gone and the sandbox drops `ns`.
  if (!net.netns.empty()) keep(RemoveNetnsFile(net.netns));  // (an older daemon's)
  proxy_->Forget(net.address);
  std::lock_guard lock(mu_);
  if (auto it = by_address_.find(net.address); it != by_address_.end() && it->second.id == id) by_address_.erase(it);
  by_id_.erase(id);
  // Rules that would not go keep their address out of use (a new sandbox
  // on it would clash with them) until recovery removes them.
  if (!rules_gone) reserved_.insert(net.address);
  return first.Annotate("remove the network of sandbox " + id);
}

json NodeNetwork::Describe(const std::string& id) {
  SandboxNet net;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return json();
    auto live = by_address_.find(it->second);
    if (live == by_address_.end()) return json();
    net = live->second.net;
  }
  json j = net.policy.ToJson();
  j["address"] = Ipv4ToString(net.address);
  j["gateway"] = Ipv4ToString(config_.gateway());
  auto counters = firewall_->Counters(net.key);
  DnsCounts dns = proxy_->Counts(net.address);
  j["counters"] = {{"connections_allowed", counters.ok() ? counters->allowed : 0},
                   {"connections_refused", counters.ok() ? counters->refused : 0},
                   {"names_answered", dns.answered},
                   {"names_refused", dns.refused}};
  return j;
}

Status NodeNetwork::Reconcile() {
  std::set<std::string> keys;
  {
    std::lock_guard lock(mu_);
    for (const auto& [address, live] : by_address_) keys.insert(live.net.key);
  }
  // Namespace files older daemons bound (adoption removed the adopted
  // sandboxes' ones; their processes hold those namespaces).
  if (DIR* dir = ::opendir(config_.netns_dir.c_str())) {
    std::vector<std::string> gone;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") gone.push_back(name);
    }
    ::closedir(dir);
    for (const auto& name : gone) {
      STRATA_LOG(kInfo) << "removing network namespace file " << name << " (an older daemon's)";
      RemoveNetnsFile(JoinPath(config_.netns_dir, name)).IgnoreError();
    }
    ::rmdir(config_.netns_dir.c_str());
  }
  // Interfaces this node made (their alias names its table).
  if (DIR* dir = ::opendir("/sys/class/net")) {
    std::vector<std::string> gone;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name.starts_with(config_.if_prefix) && !keys.count(name.substr(config_.if_prefix.size())) &&
          LinkAlias(name) == config_.table) {
        gone.push_back(name);
      }
    }
    ::closedir(dir);
    for (const auto& name : gone) {
      STRATA_LOG(kInfo) << "removing interface " << name << " (no sandbox has it)";
      DeleteLink(name).IgnoreError();
    }
  }
  // Rules.
  Status first;
  for (const auto& [key, address] : firewall_->List()) {
    if (keys.count(key)) continue;
    STRATA_LOG(kWarn) << "removing the network rules of a sandbox that is gone (" << key << ")";
    Status s = firewall_->RemoveSandbox(key);
    if (!s.ok() && first.ok()) first = s;
  }
  std::lock_guard lock(mu_);
  if (config_.warm > 0 && !refill_.joinable()) refill_ = std::thread([this] { Refill(); });
  return first;
}

}  // namespace strata::launcher
