// NodeNetwork: the node's side of sandbox networks. It owns the address
// pool, the firewall (launcher/net/firewall.h), the DNS proxy
// (launcher/net/dns_proxy.h) and every routed sandbox's namespace and veth.
// The launcher daemon has one; a sandbox in mode `allow` or `open` gets its
// plumbing here, and its state (SandboxNet) is kept in the sandbox's
// state.json so a restarted daemon takes it over as it is.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <condition_variable>
#include <thread>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/unique_fd.h"
#include "launcher/net/dns_proxy.h"
#include "launcher/net/firewall.h"
#include "launcher/net/policy.h"

namespace strata::launcher {

struct NetworkConfig {
  Cidr4 pool{0x0ad50000, 16};             // 10.213.0.0/16: .1 is the gateway
  std::string table;                      // empty: "strata_" and the pool (one per node)
  // Where daemons before 2026-12 bound namespace files (netns_dir/TABLE):
  // recovery removes what is left there.
  std::string netns_dir = "/run/strata/netns";
  std::string if_prefix = "sx";
  std::optional<sockaddr_in> dns_upstream;  // empty: the node's /etc/resolv.conf
  uint16_t dns_port = 53;
  uint32_t dns_grace_seconds = 5;
  std::vector<Cidr4> private_ok;          // --allow-private
  size_t warm = 4;                        // namespaces kept ready (--net-warm)

  uint32_t gateway() const { return pool.addr + 1; }
};

// Parses "ADDR" or "ADDR:PORT" (port 53 by default).
Result<sockaddr_in> ParseDnsServer(const std::string& text);
// The first nameserver of a resolv.conf.
Result<sockaddr_in> SystemDnsServer(const std::string& resolv_conf = "/etc/resolv.conf");

// One routed sandbox's plumbing.
struct SandboxNet {
  std::string key;         // 12 hex digits: names its veth and rules
  // Its namespace, held from Attach until the back end's processes hold
  // it (Sandbox::Start drops it then); not recorded.
  std::shared_ptr<const UniqueFd> ns;
  std::string netns;       // a namespace file an older daemon bound (recorded; removed at adoption)
  std::string ifname;      // the node's end of its veth
  uint32_t address = 0;
  uint32_t generation = 1;
  NetPolicy policy;

  // A path to the held namespace that another process (the runtime) can
  // open while this one holds it.
  std::string NamespacePath() const;

  nlohmann::json ToJson() const;
  static Result<SandboxNet> FromJson(const nlohmann::json& j);
};

class NodeNetwork {
 public:
  // Sets up what every sandbox shares: the gateway interface, the tables,
  // the proxy. Needs IP forwarding on (`launcher doctor --fix`).
  static Result<std::shared_ptr<NodeNetwork>> Open(const NetworkConfig& config);
  ~NodeNetwork();

  // A namespace, veth, address and rules for sandbox `id`.
  Result<SandboxNet> Attach(const std::string& id, const NetPolicy& policy);
  // Takes over a sandbox after a daemon restart (its rules stay in the
  // kernel; they are made again if missing).
  Status Adopt(const std::string& id, const SandboxNet& net);
  // A new policy for a live sandbox; returns its new state. `persist`
  // records the new state before the rules change (and the old one again
  // when they cannot).
  Result<SandboxNet> SetPolicy(const std::string& id, const NetPolicy& policy,
                               const std::function<Status(const SandboxNet&)>& persist = nullptr);
  // Removes everything of the sandbox; idempotent.
  Status Detach(const std::string& id, const SandboxNet& net);
  // Policy, address and counters.
  nlohmann::json Describe(const std::string& id);
  // Removes namespaces, veths and rules that belong to no sandbox adopted
  // so far (after a crash: ones made for sandboxes whose state was never
  // saved, and the dead daemon's warm namespaces); then starts keeping
  // `warm` namespaces ready.
  Status Reconcile();

  // The resolv.conf every routed sandbox gets.
  std::string ResolvConf() const;
  const NetworkConfig& config() const { return config_; }

 private:
  NodeNetwork() = default;
  Result<uint32_t> Allocate();
  // A namespace with its veth, address and routes, not yet anyone's.
  struct Slot {
    std::string key;
    uint32_t address = 0;
    std::shared_ptr<const UniqueFd> ns;
  };
  Result<Slot> Prepare();
  void DiscardSlot(const Slot& slot);
  void Refill();
  std::optional<NetPolicy> PolicyOf(uint32_t address) const;
  Status AdmitFor(uint32_t address, const std::string& name, const std::vector<uint32_t>& addrs,
                  const std::vector<uint16_t>& ports, uint32_t seconds);

  NetworkConfig config_;
  std::unique_ptr<Firewall> firewall_;
  std::unique_ptr<DnsProxy> proxy_;
  // change_mu_ serializes what changes a sandbox's rules from the proxy's
  // side and the API's (admissions, policy changes, adoption), across the
  // nftables transaction; mu_ guards the maps below and is never held
  // across I/O. Order: change_mu_, then mu_.
  std::mutex change_mu_;
  mutable std::mutex mu_;
  // What a sandbox's names resolved to and until when (steady clock), so
  // a policy change keeps what the new policy still admits.
  struct Resolved {
    std::string name;
    std::vector<uint32_t> addresses;
    std::vector<uint16_t> ports;
    std::chrono::steady_clock::time_point until;
  };
  struct Live {
    std::string id;
    SandboxNet net;
    std::vector<Resolved> resolved;  // (bounded; expired ones pruned)
  };
  std::map<uint32_t, Live> by_address_;   // address -> sandbox
  std::map<std::string, uint32_t> by_id_;
  std::set<uint32_t> reserved_;           // addresses of slots (warm or being made)
  std::vector<Slot> warm_;
  std::condition_variable refill_cv_;
  std::thread refill_;
  bool stopping_ = false;
};

}  // namespace strata::launcher
