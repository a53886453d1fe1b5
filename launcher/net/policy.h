// A sandbox's network policy: its mode and, for `allow`, the list of what it
// may reach (domains, wildcards, addresses and CIDRs, each with an optional
// port). Parsed from the CLI's --net/--allow and the API's "network".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::launcher {

enum class NetMode {
  kNone,   // loopback only (the default)
  kAllow,  // outbound only to the allowlist
  kOpen,   // outbound anywhere public
  kHost,   // the node's own network (trusted tools)
};

std::string_view NetModeName(NetMode mode);
Result<NetMode> ParseNetMode(std::string_view name);

// An IPv4 network: address and prefix length (32 for one address).
struct Cidr4 {
  uint32_t addr = 0;  // host byte order, masked to the prefix
  int prefix = 32;
  bool Contains(uint32_t a) const { return prefix == 0 || (a >> (32 - prefix)) == (addr >> (32 - prefix)); }
  uint32_t Last() const { return prefix >= 32 ? addr : addr | (0xffffffffu >> prefix); }
  std::string ToString() const;
  static Result<Cidr4> Parse(std::string_view text);
};
std::string Ipv4ToString(uint32_t addr);
std::optional<uint32_t> ParseIpv4(std::string_view text);

struct AllowEntry {
  // Exactly one of: a domain ("pypi.org"), a wildcard ("*.pythonhosted.org":
  // every name below it, not the name itself), or a network.
  std::string domain;
  bool wildcard = false;
  std::optional<Cidr4> network;
  uint16_t port = 0;  // 0: every port (TCP and UDP)

  std::string ToString() const;
  // "pypi.org", "*.pythonhosted.org", "198.51.100.0/24", "github.com:443",
  // "203.0.113.7:8080". Names are case-insensitive and kept lower-case.
  static Result<AllowEntry> Parse(std::string_view text);
  bool MatchesName(std::string_view name) const;
};

struct NetPolicy {
  NetMode mode = NetMode::kNone;
  std::vector<AllowEntry> allow;

  // Whether the sandbox gets its own interface towards the node.
  bool routed() const { return mode == NetMode::kAllow || mode == NetMode::kOpen; }
  // The ports a name may be reached on: empty when the name is refused;
  // {0} when every port.
  std::vector<uint16_t> PortsForName(std::string_view name) const;

  // {"mode": "allow", "allow": ["pypi.org", ...]}
  nlohmann::json ToJson() const;
  // A mode string ("none", "host", "allow", "open") or such an object.
  static Result<NetPolicy> FromJson(const nlohmann::json& j);
  // From the CLI: --net MODE and --allow ENTRY...; entries imply `allow`
  // when no mode is given.
  static Result<NetPolicy> FromFlags(const std::string& mode, const std::vector<std::string>& allow);
};

}  // namespace strata::launcher
