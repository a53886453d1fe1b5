// The node's packet filter for sandbox networks, in nftables (libnftables,
// loaded on first use). One table holds the rules of every sandbox: chains
// shared by all of them, per mode, and node-wide sets and maps whose
// elements are keyed by a sandbox's address (its mode, its generation,
// its networks, what names resolved to, its counters). Adding, changing
// and removing a sandbox is one atomic transaction of elements alone, so
// its cost does not grow with the number of sandboxes (libnftables reads
// the table's chains, sets and objects before every transaction).
// docs/network.md ("Rules") explains the rules.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <chrono>
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
  // sets and chains are set from `config` every time, each sandbox's
  // elements are kept (and read back, so they can be changed and removed).
  // A table an older daemon left with chains of each sandbox is made anew:
  // its sandboxes refuse everything until adoption writes their policy.
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
  // ENOENT when the filter has nothing of the sandbox.
  Status ReplacePolicy(const SandboxRules& next, const std::vector<Admission>& keep);
  // Admits addresses the DNS proxy resolved for a sandbox, on `ports`
  // ({0}: every port), for `seconds`.
  Status Admit(const std::string& key, const std::vector<uint32_t>& addresses, const std::vector<uint16_t>& ports,
               uint32_t seconds);
  // Removes everything of the sandbox (nothing of it there is fine).
  Status RemoveSandbox(const std::string& key);
  Result<FirewallCounters> Counters(const std::string& key);
  // Whether the rules refuse `address` whatever a policy says (the node's
  // pool, loopback, link-local and metadata, multicast, private ranges
  // the operator did not allow).
  bool AlwaysRefused(uint32_t address) const;
  // The sandboxes the filter has elements of: key -> address.
  std::map<std::string, uint32_t> List();

  const FirewallConfig& config() const { return config_; }

 private:
  // What the kernel holds of one sandbox, to change or remove it exactly.
  struct Entry {
    std::string ifname;
    uint32_t address = 0;
    uint32_t generation = 0;          // 0: none yet (a sandbox of an older table)
    std::string out, in;              // the chains its packets go to ("hold": until adopted)
    std::vector<std::string> nets;    // its elements of net4
    // What names resolved to: (address, port; 0 = every port) -> expiry.
    std::map<std::pair<uint32_t, uint16_t>, std::chrono::steady_clock::time_point> admitted;
  };

  Firewall() = default;
  Status Run(const std::string& script, std::string* output = nullptr);  // with mu_ held
  Entry EntryFor(const SandboxRules& r) const;
  // "add" or "delete" all but admissions; without the interface's and the
  // counters' (what a policy change keeps).
  std::string Elements(const char* verb, const Entry& e, bool with_interface = true) const;
  std::string Forget(const Entry& e) const;                      // delete its admissions
  std::string AdmitElements(const Entry& e, const Admission& a) const;
  // entries_ from the kernel's table; returns the commands that remove
  // elements of no whole sandbox.
  std::string ReadBack(const nlohmann::json& table);

  FirewallConfig config_;
  std::vector<Cidr4> never_, private_;  // always refused; refused unless allowed
  struct Lib;
  std::unique_ptr<Lib> lib_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;  // by key
};

}  // namespace strata::launcher
