// nftables rules for sandbox networks.
#include "launcher/net/firewall.h"

#include <algorithm>
#include <cerrno>

#include "common/dynlib.h"
#include "common/strings.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

constexpr unsigned kNftOutputJson = 1 << 4;  // NFT_CTX_OUTPUT_JSON

// Always refused, whatever a policy says (besides the pool itself).
const char* const kNeverRanges[] = {"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3"};
const char* const kPrivateRanges[] = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"};
// Well-known DNS-over-HTTPS resolvers: port 443 there is refused unless
// their name is allowed (then the proxy admits what it resolved).
const char* const kDohResolvers[] = {"8.8.8.8",       "8.8.4.4",       "1.1.1.1",        "1.0.0.1",       "9.9.9.9",
                                     "149.112.112.112", "208.67.222.222", "208.67.220.220", "94.140.14.14",  "94.140.15.15",
                                     "76.76.2.0",     "76.76.10.0",    "185.228.168.9",  "185.228.169.9", "45.90.28.0",
                                     "45.90.30.0",    "194.242.2.2",   "86.54.11.1",     "86.54.11.100"};

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Merges overlapping and adjacent networks (interval sets refuse overlaps).
std::vector<std::pair<uint32_t, uint32_t>> MergeRanges(std::vector<Cidr4> nets) {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  for (const auto& n : nets) ranges.emplace_back(n.addr, n.Last());
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const auto& r : ranges) {
    if (!out.empty() && (out.back().second == 0xffffffffu || r.first <= out.back().second + 1)) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::string RangeText(const std::pair<uint32_t, uint32_t>& r) {
  return r.first == r.second ? Ipv4ToString(r.first) : StrCat(Ipv4ToString(r.first), "-", Ipv4ToString(r.second));
}

}  // namespace

struct Firewall::Lib {
  void* (*ctx_new)(uint32_t) = nullptr;
  void (*ctx_free)(void*) = nullptr;
  void (*set_flags)(void*, unsigned) = nullptr;
  int (*buffer_output)(void*) = nullptr;
  int (*buffer_error)(void*) = nullptr;
  const char* (*get_output)(void*) = nullptr;
  const char* (*get_error)(void*) = nullptr;
  int (*run)(void*, const char*) = nullptr;
  void* ctx = nullptr;
  void* json_ctx = nullptr;
};

Firewall::~Firewall() {
  if (lib_) {
    if (lib_->ctx) lib_->ctx_free(lib_->ctx);
    if (lib_->json_ctx) lib_->ctx_free(lib_->json_ctx);
  }
}

Result<std::unique_ptr<Firewall>> Firewall::Open(const FirewallConfig& config) {
  std::unique_ptr<Firewall> fw(new Firewall());
  fw->config_ = config;
  for (const char* r : kNeverRanges) fw->never_.push_back(*Cidr4::Parse(r));
  fw->never_.push_back(config.pool);
  for (const char* r : kPrivateRanges) fw->private_.push_back(*Cidr4::Parse(r));
  STRATA_ASSIGN_OR_RETURN(DynamicLibrary lib, DynamicLibrary::Open(STRATA_NFTABLES_SONAME, "libnftables1"));
  auto l = std::make_unique<Lib>();
  STRATA_RETURN_IF_ERROR(lib.Resolve(l->ctx_new, "nft_ctx_new"));
  STRATA_RETURN_IF_ERROR(lib.Resolve(l->ctx_free, "nft_ctx_free"));
  STRATA_RETURN_IF_ERROR(lib.Resolve(l->set_flags, "nft_ctx_output_set_flags"));
  STRATA_RETURN_IF_ERROR(lib.Resolve(l->buffer_output, "nft_ctx_buffer_output"));
  STRATA_RETURN_IF_ERROR(lib.Resolve(l->buffer_error, "nft_ctx_buffer_error"));
  STRATA_RETURN_IF_ERROR(lib.Resolve(l->get_output, "nft_ctx_get_output_buffer"));
  STRATA_RETURN_IF_ERROR(lib.Resolve(l->get_error, "nft_ctx_get_error_buffer"));
  STRATA_RETURN_IF_ERROR(lib.Resolve(l->run, "nft_run_cmd_from_buffer"));
  for (void** ctx : {&l->ctx, &l->json_ctx}) {
    *ctx = l->ctx_new(0);
    if (!*ctx) return Error(ENOMEM, "nftables: create a context");
    l->buffer_output(*ctx);
    l->buffer_error(*ctx);
  }
  l->set_flags(l->json_ctx, kNftOutputJson);
  fw->lib_ = std::move(l);

  const std::string& t = config.table;
  const std::string pre = config.if_prefix + "*";
  const std::string gw = Ipv4ToString(config.gateway);
  std::string never_text, private_text, ok_text, doh_text;
  for (const auto& r : MergeRanges(fw->never_)) never_text += (never_text.empty() ? "" : ", ") + RangeText(r);
  for (const char* r : kPrivateRanges) private_text += (private_text.empty() ? "" : ", ") + std::string(r);
  for (const auto& r : MergeRanges(config.private_ok)) ok_text += (ok_text.empty() ? "" : ", ") + RangeText(r);
  for (const char* r : kDohResolvers) doh_text += (doh_text.empty() ? "" : ", ") + std::string(r);

  // The base: `add` makes what is missing and keeps what is there; the
  // node-wide parts are rewritten every time (a daemon restart or upgrade
  // keeps every sandbox's chains and sets as they are).
  std::string s;
  {
    s += StrCat("add table inet ", t, "\n");
    s += StrCat("add set inet ", t, " never4 { type ipv4_addr; flags interval; }\n");
    s += StrCat("add set inet ", t, " private4 { type ipv4_addr; flags interval; }\n");
    s += StrCat("add set inet ", t, " private_ok4 { type ipv4_addr; flags interval; }\n");
    s += StrCat("add set inet ", t, " doh4 { type ipv4_addr; }\n");
    s += StrCat("add set inet ", t, " ifs4 { type ifname; }\n");
    s += StrCat("add set inet ", t, " src4 { type ifname . ipv4_addr; }\n");
    s += StrCat("add map inet ", t, " from4 { type ifname . ipv4_addr : verdict; }\n");
    s += StrCat("add map inet ", t, " to4 { type ifname . ipv4_addr : verdict; }\n");
    s += StrCat("add map inet ", t, " refused4 { type ipv4_addr : counter; }\n");
    s += StrCat("add chain inet ", t, " refuse\n");
    s += StrCat("add chain inet ", t, " refuse_answer\n");
    s += StrCat("add chain inet ", t, " node_from_sandbox\n");
    s += StrCat("add chain inet ", t, " forward { type filter hook forward priority filter; policy accept; }\n");
    s += StrCat("add chain inet ", t, " input { type filter hook input priority filter; policy accept; }\n");
    s += StrCat("add table ip ", t, "_nat\n");
    s += StrCat("add chain ip ", t, "_nat postrouting { type nat hook postrouting priority srcnat; policy accept; }\n");
  }
  for (const char* set : {"never4", "private4", "private_ok4", "doh4"}) s += StrCat("flush set inet ", t, " ", set, "\n");
  s += StrCat("add element inet ", t, " never4 { ", never_text, " }\n");
  s += StrCat("add element inet ", t, " private4 { ", private_text, " }\n");
  if (!ok_text.empty()) s += StrCat("add element inet ", t, " private_ok4 { ", ok_text, " }\n");
  s += StrCat("add element inet ", t, " doh4 { ", doh_text, " }\n");
  for (const char* chain : {"refuse", "refuse_answer", "node_from_sandbox", "forward", "input"}) {
    s += StrCat("flush chain inet ", t, " ", chain, "\n");
  }
  s += StrCat("flush chain ip ", t, "_nat postrouting\n");
  // Refusals fail fast: a TCP reset (ECONNREFUSED), else ICMP port unreachable.
  s += StrCat("add rule inet ", t, " refuse meta l4proto tcp reject with tcp reset\n");
  s += StrCat("add rule inet ", t, " refuse reject with icmpx port-unreachable\n");
  // An answer on a connection the policy no longer admits: a TCP segment
  // becomes a reset for the sandbox (its sequence number is the one the
  // sandbox expects, so the sandbox's socket fails with ECONNRESET even
  // while it only receives); the peer's next segment finds no connection
  // and is refused.
  s += StrCat("add rule inet ", t, " refuse_answer meta l4proto tcp tcp flags set rst | ack accept\n");
  s += StrCat("add rule inet ", t, " refuse_answer drop\n");
  // Every forwarded packet of the node passes here, so a sandbox's packet
  // finds its chain in one lookup: from a sandbox by its interface and its
  // own address (a spoofed source matches no element), to a sandbox by its
  // interface and address (its chain lets answers in, nothing else). Only
  // this node's interfaces are keys (another node's daemon on the host has
  // its own table and pool). What matches no element fails closed: IPv6
  // (sandboxes have none) or a wrong source on a sandbox's interface, and
  // a pool address on any interface without rules (a warm namespace, a
  // veth whose rules are gone) or arriving from elsewhere (a spoof).
  const std::string pool = config.pool.ToString();
  s += StrCat("add rule inet ", t, " forward iifname . ip saddr vmap @from4\n");
  s += StrCat("add rule inet ", t, " forward oifname . ip daddr vmap @to4\n");
  s += StrCat("add rule inet ", t, " forward iifname @ifs4 drop\n");
  s += StrCat("add rule inet ", t, " forward oifname @ifs4 drop\n");
  s += StrCat("add rule inet ", t, " forward ip saddr ", pool, " drop\n");
  s += StrCat("add rule inet ", t, " forward ip daddr ", pool, " drop\n");
  s += StrCat("add rule inet ", t, " input iifname @ifs4 jump node_from_sandbox\n");
  s += StrCat("add rule inet ", t, " input iifname != \"lo\" ip saddr ", pool, " drop\n");
  // To the node itself: the DNS proxy's port, nothing else.
  s += StrCat("add rule inet ", t, " node_from_sandbox iifname . ip saddr != @src4 drop\n");
  s += StrCat("add rule inet ", t, " node_from_sandbox ip daddr ", gw, " udp dport ", config.dns_port, " accept\n");
  s += StrCat("add rule inet ", t, " node_from_sandbox ip daddr ", gw, " tcp dport ", config.dns_port, " accept\n");
  // (Two rules: a sandbox without a counter element must be refused too.)
  s += StrCat("add rule inet ", t, " node_from_sandbox counter name ip saddr map @refused4\n");
  s += StrCat("add rule inet ", t, " node_from_sandbox goto refuse\n");
  s += StrCat("add rule ip ", t, "_nat postrouting ip saddr ", config.pool.ToString(), " oifname != \"", pre,
              "\" masquerade\n");
  // A table of a daemon before 2026-12-03 found its sandboxes' chains
  // through two more chains and maps keyed by address alone: its elements
  // move to the maps above, in the same transaction.
  if (fw->Exists(StrCat("map inet ", t, " out4"))) {
    STRATA_ASSIGN_OR_RETURN(auto old, fw->ListMap("out4"));
    for (const auto& [key, address] : old) {
      s += fw->DispatchElements("add", {key, config.if_prefix + key, address});
      // Its answers chain had these in to_sandbox, before it (adoption
      // writes its rules again anyway).
      s += StrCat("insert rule inet ", t, " r_", key, " ct direction original goto refuse\n");
      s += StrCat("insert rule inet ", t, " r_", key, " ct state invalid drop\n");
    }
    for (const char* chain : {"from_sandbox", "to_sandbox"}) s += StrCat("flush chain inet ", t, " ", chain, "\n");
    for (const char* chain : {"from_sandbox", "to_sandbox"}) s += StrCat("delete chain inet ", t, " ", chain, "\n");
    for (const char* map : {"out4", "in4"}) s += StrCat("delete map inet ", t, " ", map, "\n");
  }
  Status st = fw->Run(s);
  if (!st.ok()) return st.Annotate("nftables: set up table " + t);
  return fw;
}

bool Firewall::Exists(const std::string& what) {
  std::lock_guard lock(mu_);
  return lib_->run(lib_->ctx, ("list " + what).c_str()) == 0;
}

Status Firewall::Run(const std::string& script, std::string* output) {
  std::lock_guard lock(mu_);
  void* ctx = output ? lib_->json_ctx : lib_->ctx;
  if (lib_->run(ctx, script.c_str()) != 0) {
    std::string err = lib_->get_error(ctx);
    while (!err.empty() && err.back() == '\n') err.pop_back();
    if (err.size() > 2000) err = err.substr(0, 2000) + "...";
    return Error(EIO, "nftables: " + err);
  }
  if (output) *output = lib_->get_output(ctx);
  else lib_->get_output(ctx);  // (drains the buffer)
  return OkStatus();
}

std::string Firewall::SandboxObjects(const SandboxRules& r) const {
  const std::string& t = config_.table;
  const std::string& k = r.key;
  std::string s;
  s += StrCat("add set inet ", t, " n_", k, " { type ipv4_addr; flags timeout; }\n");
  s += StrCat("add set inet ", t, " np_", k, " { type ipv4_addr . inet_service; flags timeout; }\n");
  s += StrCat("add set inet ", t, " c_", k, " { type ipv4_addr; flags interval; }\n");
  s += StrCat("add set inet ", t, " cp_", k, " { type ipv4_addr . inet_service; flags interval; }\n");
  s += StrCat("add counter inet ", t, " ok_", k, "\n");
  s += StrCat("add counter inet ", t, " no_", k, "\n");
  s += StrCat("add chain inet ", t, " o_", k, "\n");
  s += StrCat("add chain inet ", t, " r_", k, "\n");
  return s;
}

std::string Firewall::PolicyRules(const SandboxRules& r) const {
  const std::string& t = config_.table;
  const std::string& k = r.key;
  const std::string mark = Hex32(r.generation);
  std::string s;
  // o_KEY judges packets from the sandbox (by destination), r_KEY answers
  // to it (by their source): the same rules, so a connection a new policy
  // refuses is reset from whichever side speaks next.
  for (int dir = 0; dir < 2; ++dir) {
    const std::string chain = (dir == 0 ? "o_" : "r_") + k;
    const std::string addr = dir == 0 ? "ip daddr" : "ip saddr";
    const std::string port = dir == 0 ? "th dport" : "th sport";
    const std::string refuse = dir == 0 ? StrCat("counter name no_", k, " goto refuse") : "goto refuse_answer";
    const std::string admit = dir == 0 ? StrCat("ct mark set ", mark, " counter name ok_", k, " accept")
                                       : StrCat("ct mark set ", mark, " accept");
    auto rule = [&](const std::string& body) { s += StrCat("add rule inet ", t, " ", chain, " ", body, "\n"); };
    rule(StrCat("ct mark ", mark, " accept"));
    // Into a sandbox: answers only (nothing opens a connection into one).
    if (dir == 1) {
      rule("ct state invalid drop");
      rule("ct direction original goto refuse");
    }
    if (r.policy.mode != NetMode::kAllow && r.policy.mode != NetMode::kOpen) {
      rule(refuse);
      continue;
    }
    rule(StrCat("meta l4proto != { tcp, udp } ", refuse));
    rule(StrCat(port, " { 53, 853 } ", refuse));
    // What names resolved to first (the common case; the proxy never
    // admits an always-refused address), then what is always refused.
    rule(StrCat(addr, " @n_", k, " ", admit));
    rule(StrCat(addr, " . ", port, " @np_", k, " ", admit));
    rule(StrCat(addr, " @never4 ", refuse));
    rule(StrCat(addr, " @private4 ", addr, " != @private_ok4 ", refuse));
    rule(StrCat(addr, " @doh4 ", port, " 443 ", refuse));
    if (r.policy.mode == NetMode::kOpen) {
      rule(admit);
      continue;
    }
    rule(StrCat(addr, " @c_", k, " ", admit));
    rule(StrCat(addr, " . ", port, " @cp_", k, " ", admit));
    rule(refuse);
  }
  // The policy's networks, merged (interval sets take no overlaps).
  std::vector<Cidr4> any;
  std::map<uint16_t, std::vector<Cidr4>> by_port;
  if (r.policy.mode == NetMode::kAllow) {
    for (const auto& e : r.policy.allow) {
      if (!e.network) continue;
      if (e.port == 0) any.push_back(*e.network);
      else by_port[e.port].push_back(*e.network);
    }
  }
  std::string elements;
  for (const auto& range : MergeRanges(any)) elements += (elements.empty() ? "" : ", ") + RangeText(range);
  if (!elements.empty()) s += StrCat("add element inet ", t, " c_", k, " { ", elements, " }\n");
  elements.clear();
  for (const auto& [p, nets] : by_port) {
    for (const auto& range : MergeRanges(nets)) elements += (elements.empty() ? "" : ", ") + RangeText(range) + " . " + std::to_string(p);
  }
  if (!elements.empty()) s += StrCat("add element inet ", t, " cp_", k, " { ", elements, " }\n");
  return s;
}

std::string Firewall::DispatchElements(const char* verb, const SandboxRules& r) const {
  const std::string& t = config_.table;
  const std::string a = Ipv4ToString(r.address);
  const std::string at = StrCat("\"", r.ifname, "\" . ", a);
  const bool add = std::string_view(verb) == "add";
  std::string s;
  s += StrCat(verb, " element inet ", t, " from4 { ", at, add ? " : goto o_" + r.key : "", " }\n");
  s += StrCat(verb, " element inet ", t, " to4 { ", at, add ? " : goto r_" + r.key : "", " }\n");
  s += StrCat(verb, " element inet ", t, " ifs4 { \"", r.ifname, "\" }\n");
  s += StrCat(verb, " element inet ", t, " src4 { ", at, " }\n");
  s += StrCat(verb, " element inet ", t, " refused4 { ", a, add ? " : \"no_" + r.key + "\"" : "", " }\n");
  return s;
}

Status Firewall::AddSandbox(const SandboxRules& r) {
  std::string s = SandboxObjects(r) + PolicyRules(r) + DispatchElements("add", r);
  return Run(s).Annotate("nftables: add the rules of sandbox " + r.key);
}

Status Firewall::ReplacePolicy(const SandboxRules& next, const std::vector<Admission>& keep) {
  const std::string& t = config_.table;
  std::string s;
  for (const char* chain : {"o_", "r_"}) s += StrCat("flush chain inet ", t, " ", chain, next.key, "\n");
  for (const char* set : {"n_", "np_", "c_", "cp_"}) s += StrCat("flush set inet ", t, " ", set, next.key, "\n");
  s += PolicyRules(next);
  // (Already there but after an upgrade from a table of older maps.)
  s += DispatchElements("add", next);
  for (const auto& a : keep) s += AdmitElements(next.key, a);
  return Run(s).Annotate("nftables: change the policy of sandbox " + next.key);
}

std::string Firewall::AdmitElements(const std::string& key, const Admission& a) const {
  const std::string& t = config_.table;
  std::string s;
  // add + delete + add: an element already there gets the new timeout
  // (nftables 1.0.6 cannot update one in place).
  for (uint32_t addr : a.addresses) {
    for (uint16_t p : a.ports) {
      const std::string set = p == 0 ? "n_" + key : "np_" + key;
      const std::string elem = p == 0 ? Ipv4ToString(addr) : StrCat(Ipv4ToString(addr), " . ", p);
      s += StrCat("add element inet ", t, " ", set, " { ", elem, " }\n");
      s += StrCat("delete element inet ", t, " ", set, " { ", elem, " }\n");
      s += StrCat("add element inet ", t, " ", set, " { ", elem, " timeout ", std::max<uint32_t>(a.seconds, 1), "s }\n");
    }
  }
  return s;
}

Status Firewall::Admit(const std::string& key, const std::vector<uint32_t>& addresses, const std::vector<uint16_t>& ports,
                       uint32_t seconds) {
  if (addresses.empty() || ports.empty()) return OkStatus();
  return Run(AdmitElements(key, {addresses, ports, seconds})).Annotate("nftables: admit resolved addresses for sandbox " + key);
}

Status Firewall::RemoveSandbox(const std::string& key, const std::string& ifname, uint32_t address, bool check) {
  const std::string& t = config_.table;
  // AddSandbox made everything in one transaction: all of it is there or
  // none is, and it goes in one transaction too.
  if (check && !Exists(StrCat("chain inet ", t, " o_", key))) return OkStatus();
  std::string s;
  if (address != 0) s += DispatchElements("delete", {key, ifname, address});
  for (const char* chain : {"o_", "r_"}) s += StrCat("delete chain inet ", t, " ", chain, key, "\n");
  for (const char* set : {"n_", "np_", "c_", "cp_"}) s += StrCat("delete set inet ", t, " ", set, key, "\n");
  for (const char* counter : {"ok_", "no_"}) s += StrCat("delete counter inet ", t, " ", counter, key, "\n");
  return Run(s).Annotate("nftables: remove the rules of sandbox " + key);
}

Result<FirewallCounters> Firewall::Counters(const std::string& key) {
  FirewallCounters c;
  for (auto [name, field] : {std::pair{"ok_", &c.allowed}, std::pair{"no_", &c.refused}}) {
    std::string out;
    STRATA_RETURN_IF_ERROR(Run(StrCat("list counter inet ", config_.table, " ", name, key), &out));
    json j = json::parse(out, nullptr, false);
    if (!j.is_object()) continue;
    for (const auto& item : j.value("nftables", json::array())) {
      if (item.contains("counter")) *field = item["counter"].value("packets", uint64_t{0});
    }
  }
  return c;
}

bool Firewall::AlwaysRefused(uint32_t address) const {
  for (const auto& r : never_) {
    if (r.Contains(address)) return true;
  }
  for (const auto& r : private_) {
    if (!r.Contains(address)) continue;
    for (const auto& ok : config_.private_ok) {
      if (ok.Contains(address)) return false;
    }
    return true;
  }
  return false;
}

Result<std::map<std::string, uint32_t>> Firewall::List() { return ListMap("from4"); }

Result<std::map<std::string, uint32_t>> Firewall::ListMap(const std::string& map) {
  std::string out;
  STRATA_RETURN_IF_ERROR(Run(StrCat("list map inet ", config_.table, " ", map), &out));
  std::map<std::string, uint32_t> result;
  json j = json::parse(out, nullptr, false);
  if (!j.is_object()) return result;
  for (const auto& item : j.value("nftables", json::array())) {
    if (!item.contains("map")) continue;
    for (const auto& e : item["map"].value("elem", json::array())) {
      if (!e.is_array() || e.size() != 2) continue;
      // The key is the address (out4, older tables) or interface . address.
      const json* key = &e[0];
      if (key->is_object() && key->contains("concat") && (*key)["concat"].is_array() && (*key)["concat"].size() == 2) {
        key = &(*key)["concat"][1];
      }
      if (!key->is_string()) continue;
      std::string target = e[1].contains("goto") ? e[1]["goto"].value("target", "") : "";
      auto addr = ParseIpv4(key->get<std::string>());
      if (target.starts_with("o_") && addr) result[target.substr(2)] = *addr;
    }
  }
  return result;
}

}  // namespace strata::launcher
