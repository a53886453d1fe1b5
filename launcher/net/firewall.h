// The node's packet filter for sandbox networks, in nftables (libnftables,
// loaded on first use). One table holds every sandbox's rules; each sandbox
// has its own chains, sets and counters, named by its key, so adding,
// changing and removing a sandbox is one atomic transaction that touches
// nothing else. docs/security.md ("Sandbox networks") explains the rules.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "launcher/net/policy.h"

namespace strata::launcher {

struct FirewallConfig {
  std::string table = "strata";   // inet TABLE (filter) and ip TABLE_nat
  Cidr4 pool;                     // sandbox addresses
  uint32_t gateway = 0;           // the node's address sandboxes see (DNS proxy)
  uint16_t dns_port = 53;
  std::vector<Cidr4> private_ok;  // private ranges the operator allows
  std::string if_prefix = "sx";   // the node's ends of sandbox veths
};

// What the filter knows of one sandbox.
struct SandboxRules {
  std::string key;      // [a-z0-9_]+, unique on the node
  std::string ifname;   // its veth on the node
  uint32_t address = 0;
  uint32_t generation = 1;  // bumped by every policy change: the conntrack mark of admitted connections
  NetPolicy policy;
};

struct FirewallCounters {
  uint64_t allowed = 0;  // connections admitted (once per policy generation)
  uint64_t refused = 0;  // packets refused
};

class Firewall {
 public:
  // Loads libnftables and makes (or keeps) the node's tables; the node-wide
  // sets are set from `config` every time.
  static Result<std::unique_ptr<Firewall>> Open(const FirewallConfig& config);
  ~Firewall();

  Status AddSandbox(const SandboxRules& rules);
  // Addresses a name resolved to, admitted on ports ({0}: every port).
  struct Admission {
    std::vector<uint32_t> addresses;
    std::vector<uint16_t> ports;
    uint32_t seconds = 0;
  };
  // Replaces a sandbox's policy at once: `next` has a new generation, so
  // every open connection is judged again by the new rules on its next
  // packet (in either direction) and reset when they refuse it. What names
  // resolved to is dropped but for `keep` (names the new policy admits).
  Status ReplacePolicy(const SandboxRules& next, const std::vector<Admission>& keep);
  // Admits addresses the DNS proxy resolved for a sandbox, on `ports`
  // ({0}: every port), for `seconds`.
  Status Admit(const std::string& key, const std::vector<uint32_t>& addresses, const std::vector<uint16_t>& ports,
               uint32_t seconds);
  // Removes everything of the sandbox; with `check`, none of it being there
  // is fine (without, it saves a query).
  Status RemoveSandbox(const std::string& key, const std::string& ifname, uint32_t address, bool check = true);
  Result<FirewallCounters> Counters(const std::string& key);
  // Whether the rules refuse `address` whatever a policy says (the node's
  // pool, loopback, link-local and metadata, multicast, private ranges
  // the operator did not allow).
  bool AlwaysRefused(uint32_t address) const;
  // The sandboxes the kernel has rules for: key -> address.
  Result<std::map<std::string, uint32_t>> List();

  const FirewallConfig& config() const { return config_; }

 private:
  Firewall() = default;
  Status Run(const std::string& script, std::string* output = nullptr);
  std::string SandboxObjects(const SandboxRules& r) const;   // add sets, counters, chains
  std::string PolicyRules(const SandboxRules& r) const;      // the chains' rules and static elements
  std::string AdmitElements(const std::string& key, const Admission& a) const;
  // "add" or "delete" the sandbox's elements of the node-wide sets and maps.
  std::string DispatchElements(const char* verb, const SandboxRules& r) const;
  // key -> address of a map whose elements goto o_KEY.
  Result<std::map<std::string, uint32_t>> ListMap(const std::string& map);
  bool Exists(const std::string& what);

  FirewallConfig config_;
  std::vector<Cidr4> never_, private_;  // always refused; refused unless allowed
  struct Lib;
  std::unique_ptr<Lib> lib_;
  std::mutex mu_;
};

}  // namespace strata::launcher
