// nftables rules for sandbox networks.
#include "launcher/net/firewall.h"

#include <algorithm>
#include <cerrno>
#include <set>

#include "common/dynlib.h"
#include "common/log.h"
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

// `ranges` without what `minus` covers (both merged: sorted, disjoint).
std::vector<std::pair<uint32_t, uint32_t>> Subtract(const std::vector<std::pair<uint32_t, uint32_t>>& ranges,
                                                    const std::vector<std::pair<uint32_t, uint32_t>>& minus) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto [lo, hi] : ranges) {
    bool left = true;
    for (const auto& [mlo, mhi] : minus) {
      if (mhi < lo || mlo > hi) continue;
      if (mlo > lo) out.emplace_back(lo, mlo - 1);
      if (mhi >= hi) {
        left = false;
        break;
      }
      lo = mhi + 1;
    }
    if (left) out.emplace_back(lo, hi);
  }
  return out;
}

std::string RangeText(const std::pair<uint32_t, uint32_t>& r) {
  return r.first == r.second ? Ipv4ToString(r.first) : StrCat(Ipv4ToString(r.first), "-", Ipv4ToString(r.second));
}

// An element as nft's JSON lists it, written as nft reads it.
std::string ElementText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_object() && v.contains("prefix")) {
    return StrCat(v["prefix"].value("addr", ""), "/", v["prefix"].value("len", 0));
  }
  if (v.is_object() && v.contains("range") && v["range"].is_array() && v["range"].size() == 2) {
    return ElementText(v["range"][0]) + "-" + ElementText(v["range"][1]);
  }
  if (v.is_object() && v.contains("concat") && v["concat"].is_array()) {
    std::string out;
    for (const auto& part : v["concat"]) out += (out.empty() ? "" : " . ") + ElementText(part);
    return out;
  }
  if (v.is_object() && v.contains("elem")) return ElementText(v["elem"].value("val", json()));
  return "";
}

// The parts of a concatenation, as text.
std::vector<std::string> Parts(const json& v) {
  std::vector<std::string> out;
  const json& val = v.is_object() && v.contains("elem") ? v["elem"]["val"] : v;
  if (val.is_object() && val.contains("concat")) {
    for (const auto& part : val["concat"]) out.push_back(ElementText(part));
  } else {
    out.push_back(ElementText(val));
  }
  return out;
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
  std::lock_guard lock(fw->mu_);
  // What is there: a restarted daemon's sandboxes keep their elements.
  std::string s, cleanup;
  std::string listed;
  if (fw->Run(StrCat("list table inet ", t), &listed).ok()) {
    json table = json::parse(listed, nullptr, false);
    bool older = false;  // chains of each sandbox (daemons before 2026-12-03)
    std::map<std::string, uint32_t> sandboxes;
    for (const auto& item : table.is_object() ? table.value("nftables", json::array()) : json::array()) {
      const std::string chain = item.contains("chain") ? item["chain"].value("name", "") : "";
      if (chain.starts_with("o_") || chain == "from_sandbox") older = true;
      const std::string map = item.contains("map") ? item["map"].value("name", "") : "";
      if (map != "out4" && map != "from4") continue;
      for (const auto& e : item["map"].value("elem", json::array())) {
        if (!e.is_array() || e.size() != 2 || !e[1].contains("goto")) continue;
        std::string target = e[1]["goto"].value("target", "");
        auto parts = Parts(e[0]);
        auto address = ParseIpv4(parts.back());
        if (target.starts_with("o_") && address) sandboxes[target.substr(2)] = *address;
      }
    }
    if (older) {
      // Made anew in the transaction below; each sandbox's packets are
      // dropped (not refused: TCP retransmits, and its open connections
      // carry on) until adoption writes its policy (recovery removes the
      // rest).
      s += StrCat("delete table inet ", t, "\n");
      for (const auto& [key, address] : sandboxes) {
        Entry& e = fw->entries_[key];
        e.ifname = config.if_prefix + key;
        e.address = address;
        e.out = e.in = "hold";
      }
    } else {
      cleanup = fw->ReadBack(table);
    }
  }

  const std::string pre = config.if_prefix + "*";
  const std::string gw = Ipv4ToString(config.gateway);
  const std::string pool = config.pool.ToString();
  std::string never_text, private_text, ok_text, doh_text;
  for (const auto& r : MergeRanges(fw->never_)) never_text += (never_text.empty() ? "" : ", ") + RangeText(r);
  for (const char* r : kPrivateRanges) private_text += (private_text.empty() ? "" : ", ") + std::string(r);
  for (const auto& r : MergeRanges(config.private_ok)) ok_text += (ok_text.empty() ? "" : ", ") + RangeText(r);
  for (const char* r : kDohResolvers) doh_text += (doh_text.empty() ? "" : ", ") + std::string(r);

  // The base: `add` makes what is missing and keeps what is there; the
  // node-wide sets and the chains are rewritten every time (a daemon
  // restart or upgrade keeps every sandbox's elements as they are).
  const char* const sets[] = {
      "never4 { type ipv4_addr; flags interval; }",
      "private4 { type ipv4_addr; flags interval; }",
      "private_ok4 { type ipv4_addr; flags interval; }",
      "doh4 { type ipv4_addr; }",
      // Per sandbox: its interface, and its interface with its address.
      "ifs4 { type ifname; }",
      "src4 { type ifname . ipv4_addr; }",
      // Its generation (the conntrack mark of what its policy admitted),
      // as a set to match and a map to set it from.
      "cur4 { type ipv4_addr . mark; }",
      // Connections admitted (once per generation) and packets refused.
      "okc4 { type ipv4_addr; counter; }",
      "noc4 { type ipv4_addr; counter; }",
      // What names resolved to, until their TTL (plus grace): sandbox .
      // address, on every port or on one.
      "adm4 { type ipv4_addr . ipv4_addr; flags timeout; }",
      "admp4 { type ipv4_addr . ipv4_addr . inet_service; flags timeout; }",
      // Its policy's networks: sandbox . address range . port range.
      "net4 { type ipv4_addr . ipv4_addr . inet_service; flags interval; }",
  };
  const char* const maps[] = {
      // The chains of its mode: from it (by interface and source, so a
      // spoofed source matches nothing) and to it.
      "from4 { type ifname . ipv4_addr : verdict; }",
      "to4 { type ifname . ipv4_addr : verdict; }",
      "gen4 { type ipv4_addr : mark; }",
  };
  const char* const chains[] = {"refuse",     "refuse_answer", "node_from_sandbox", "out_allow", "out_open", "out_admit",
                                "out_refuse", "in_allow",      "in_open",           "in_none",   "in_admit", "hold"};
  s += StrCat("add table inet ", t, "\n");
  for (const char* set : sets) s += StrCat("add set inet ", t, " ", set, "\n");
  for (const char* map : maps) s += StrCat("add map inet ", t, " ", map, "\n");
  for (const char* chain : chains) s += StrCat("add chain inet ", t, " ", chain, "\n");
  s += StrCat("add chain inet ", t, " forward { type filter hook forward priority filter; policy accept; }\n");
  s += StrCat("add chain inet ", t, " input { type filter hook input priority filter; policy accept; }\n");
  s += StrCat("add table ip ", t, "_nat\n");
  s += StrCat("add chain ip ", t, "_nat postrouting { type nat hook postrouting priority srcnat; policy accept; }\n");
  for (const char* set : {"never4", "private4", "private_ok4", "doh4"}) s += StrCat("flush set inet ", t, " ", set, "\n");
  s += StrCat("add element inet ", t, " never4 { ", never_text, " }\n");
  s += StrCat("add element inet ", t, " private4 { ", private_text, " }\n");
  if (!ok_text.empty()) s += StrCat("add element inet ", t, " private_ok4 { ", ok_text, " }\n");
  s += StrCat("add element inet ", t, " doh4 { ", doh_text, " }\n");
  for (const char* chain : chains) s += StrCat("flush chain inet ", t, " ", chain, "\n");
  for (const char* chain : {"forward", "input"}) s += StrCat("flush chain inet ", t, " ", chain, "\n");
  s += StrCat("flush chain ip ", t, "_nat postrouting\n");
  auto rule = [&](const char* chain, const std::string& body) { s += StrCat("add rule inet ", t, " ", chain, " ", body, "\n"); };
  // Refusals fail fast: a TCP reset (ECONNREFUSED), else ICMP port unreachable.
  rule("refuse", "meta l4proto tcp reject with tcp reset");
  rule("refuse", "reject with icmpx port-unreachable");
  // An answer on a connection the policy no longer admits: a TCP segment
  // becomes a reset for the sandbox (its sequence number is the one the
  // sandbox expects, so the sandbox's socket fails with ECONNRESET even
  // while it only receives); the peer's next segment finds no connection
  // and is refused.
  rule("refuse_answer", "meta l4proto tcp tcp flags set rst | ack accept");
  rule("refuse_answer", "drop");
  // Every forwarded packet of the node passes here, so a sandbox's packet
  // finds the chain of its mode in one lookup: from a sandbox by its
  // interface and its own address (a spoofed source matches no element),
  // to a sandbox by its interface and address. Only this node's interfaces
  // are keys (another node's daemon on the host has its own table and
  // pool). What matches no element fails closed: IPv6 (sandboxes have
  // none) or a wrong source on a sandbox's interface, and a pool address
  // on any interface without rules (a warm namespace, a veth whose rules
  // are gone) or arriving from elsewhere (a spoof).
  rule("forward", "iifname . ip saddr vmap @from4");
  rule("forward", "oifname . ip daddr vmap @to4");
  rule("forward", "iifname @ifs4 drop");
  rule("forward", "oifname @ifs4 drop");
  rule("forward", StrCat("ip saddr ", pool, " drop"));
  rule("forward", StrCat("ip daddr ", pool, " drop"));
  rule("input", "iifname @ifs4 jump node_from_sandbox");
  rule("input", StrCat("iifname != \"lo\" ip saddr ", pool, " drop"));
  // From a sandbox (out_*, by destination) and answers to it (in_*, by
  // source): the same rules, so a connection a new policy refuses is reset
  // from whichever side speaks next. A connection carries the generation
  // that admitted it: while that is its sandbox's, no rule beyond the
  // first looks at it. What names resolved to comes first (the proxy never
  // admits an always-refused address), then what is always refused.
  for (int dir = 0; dir < 2; ++dir) {
    const bool out = dir == 0;
    const std::string self = out ? "ip saddr" : "ip daddr";
    const std::string peer = out ? "ip daddr" : "ip saddr";
    const std::string port = out ? "th dport" : "th sport";
    const std::string refuse = out ? "goto out_refuse" : "goto refuse_answer";
    const std::string admit = out ? "goto out_admit" : "goto in_admit";
    for (const bool allow : {true, false}) {
      const std::string chain = StrCat(out ? "out_" : "in_", allow ? "allow" : "open");
      auto add = [&](const std::string& body) { rule(chain.c_str(), body); };
      // (Into a sandbox, answers only: a connection the kernel expected
      // for a helper, such as FTP data, carries its master's mark.)
      add(StrCat(self, " . ct mark @cur4 ", out ? "" : "ct direction reply ", "accept"));
      if (!out) {
        // Into a sandbox: answers only (nothing opens a connection into one).
        add("ct state invalid drop");
        add("ct direction original goto refuse");
      }
      add(StrCat("meta l4proto != { tcp, udp } ", refuse));
      add(StrCat(port, " { 53, 853 } ", refuse));
      add(StrCat(self, " . ", peer, " @adm4 ", admit));
      add(StrCat(self, " . ", peer, " . ", port, " @admp4 ", admit));
      add(StrCat(peer, " @never4 ", refuse));
      add(StrCat(peer, " @private4 ", peer, " != @private_ok4 ", refuse));
      add(StrCat(peer, " @doh4 ", port, " 443 ", refuse));
      if (allow) {
        add(StrCat(self, " . ", peer, " . ", port, " @net4 ", admit));
        add(refuse);
      } else {
        add(admit);
      }
    }
  }
  rule("out_admit", "ct mark set ip saddr map @gen4");
  rule("out_admit", "ip saddr @okc4 accept");
  rule("out_admit", "accept");
  rule("out_refuse", "ip saddr @noc4");
  rule("out_refuse", "goto refuse");
  rule("in_none", "ct state invalid drop");
  rule("in_none", "ct direction original goto refuse");
  rule("in_none", "goto refuse_answer");
  rule("in_admit", "ct mark set ip daddr map @gen4 accept");
  rule("hold", "drop");
  // To the node itself: the DNS proxy's port, nothing else.
  rule("node_from_sandbox", "iifname . ip saddr != @src4 drop");
  rule("node_from_sandbox", StrCat("ip daddr ", gw, " udp dport ", config.dns_port, " accept"));
  rule("node_from_sandbox", StrCat("ip daddr ", gw, " tcp dport ", config.dns_port, " accept"));
  rule("node_from_sandbox", "ip saddr @noc4");
  rule("node_from_sandbox", "goto refuse");
  s += StrCat("add rule ip ", t, "_nat postrouting ip saddr ", pool, " oifname != \"", pre, "\" masquerade\n");
  // An older table's sandboxes, held until adopted; and what belongs to no
  // sandbox, removed.
  for (const auto& [key, e] : fw->entries_) {
    if (e.out == "hold") s += fw->Elements("add", e);
  }
  s += cleanup;
  Status st = fw->Run(s);
  if (!st.ok()) return st.Annotate("nftables: set up table " + t);
  return fw;
}

std::string Firewall::ReadBack(const json& table) {
  const std::string& prefix = config_.if_prefix;
  std::map<uint32_t, std::string> key_of;
  auto items = table.is_object() ? table.value("nftables", json::array()) : json::array();
  // Sandboxes first (from4), then what each has.
  for (const auto& item : items) {
    if (!item.contains("map") || item["map"].value("name", "") != "from4") continue;
    for (const auto& e : item["map"].value("elem", json::array())) {
      if (!e.is_array() || e.size() != 2 || !e[1].contains("goto")) continue;
      auto parts = Parts(e[0]);
      auto address = parts.size() == 2 ? ParseIpv4(parts[1]) : std::nullopt;
      if (!address || !parts[0].starts_with(prefix)) continue;
      const std::string key = parts[0].substr(prefix.size());
      Entry& entry = entries_[key];
      entry.ifname = parts[0];
      entry.address = *address;
      entry.out = e[1]["goto"].value("target", "");
      key_of[*address] = key;
    }
  }
  // Every element of a sandbox's, by its address (interfaces by name), to
  // remove those of no whole sandbox: a later sandbox on the address must
  // not inherit them.
  struct Seen {
    std::string set, text;
    bool timed = false;
  };
  std::map<uint32_t, std::vector<Seen>> seen;
  std::map<std::string, std::vector<Seen>> seen_if;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& item : items) {
    for (const char* kind : {"map", "set"}) {
      if (!item.contains(kind)) continue;
      const std::string name = item[kind].value("name", "");
      const bool by_interface = name == "from4" || name == "to4" || name == "src4";
      const bool timed = name == "adm4" || name == "admp4";
      if (!by_interface && !timed && name != "ifs4" && name != "cur4" && name != "gen4" && name != "okc4" && name != "noc4" &&
          name != "net4") {
        continue;
      }
      for (const auto& e : item[kind].value("elem", json::array())) {
        auto parts = Parts(e.is_array() && !e.empty() ? e[0] : e);
        if (parts.empty()) continue;
        if (name == "ifs4") {
          seen_if[parts[0]].push_back({name, StrCat("\"", parts[0], "\"")});
          continue;
        }
        auto address = ParseIpv4(by_interface ? (parts.size() == 2 ? parts[1] : "") : parts[0]);
        if (!address) continue;
        std::string text = by_interface ? StrCat("\"", parts[0], "\" . ", parts[1]) : ElementText(e.is_array() ? e[0] : e);
        seen[*address].push_back({name, text, timed});
        auto it = key_of.find(*address);
        if (it == key_of.end()) continue;
        Entry& entry = entries_[it->second];
        if (name == "to4" && e.is_array() && e.size() == 2 && e[1].contains("goto")) {
          entry.in = e[1]["goto"].value("target", "");
        } else if (name == "gen4" && e.is_array() && e.size() == 2 && e[1].is_number_unsigned()) {
          entry.generation = e[1].get<uint32_t>();
        } else if (name == "net4") {
          entry.nets.push_back(text);
        } else if ((name == "adm4" && parts.size() == 2) || (name == "admp4" && parts.size() == 3)) {
          auto peer = ParseIpv4(parts[1]);
          if (!peer) continue;
          const uint16_t p = name == "adm4" ? 0 : static_cast<uint16_t>(std::stoul(parts[2]));
          const int64_t left = e.is_object() && e.contains("elem") ? e["elem"].value("expires", int64_t{0}) : 0;
          entry.admitted[{*peer, p}] = now + std::chrono::seconds(left + 1);
        }
      }
    }
  }
  // A sandbox with half of its elements (no transaction leaves one; a hand
  // may) is removed like a leftover.
  std::set<std::string> interfaces;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.in.empty() || it->second.out.empty()) {
      STRATA_LOG(kWarn) << "nftables: sandbox " << it->first << " has half of its elements; removing them";
      key_of.erase(it->second.address);
      it = entries_.erase(it);
    } else {
      interfaces.insert(it->second.ifname);
      ++it;
    }
  }
  std::string cleanup;
  auto remove = [&](const Seen& e) {
    if (e.timed) cleanup += StrCat("add element inet ", config_.table, " ", e.set, " { ", e.text, " timeout 1s }\n");
    cleanup += StrCat("delete element inet ", config_.table, " ", e.set, " { ", e.text, " }\n");
  };
  for (const auto& [address, elements] : seen) {
    if (key_of.count(address)) continue;
    STRATA_LOG(kWarn) << "nftables: removing " << elements.size() << " elements of no sandbox at " << Ipv4ToString(address);
    for (const auto& e : elements) remove(e);
  }
  for (const auto& [name, elements] : seen_if) {
    if (interfaces.count(name)) continue;
    for (const auto& e : elements) remove(e);
  }
  return cleanup;
}

Status Firewall::Run(const std::string& script, std::string* output) {
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

Firewall::Entry Firewall::EntryFor(const SandboxRules& r) const {
  Entry e;
  e.ifname = r.ifname;
  e.address = r.address;
  e.generation = r.generation;
  switch (r.policy.mode) {
    case NetMode::kAllow: e.out = "out_allow", e.in = "in_allow"; break;
    case NetMode::kOpen: e.out = "out_open", e.in = "in_open"; break;
    default: e.out = "out_refuse", e.in = "in_none"; break;
  }
  if (r.policy.mode != NetMode::kAllow) return e;
  // The policy's networks, merged (a set of ranges takes no overlaps): a
  // network on every port is on 0-65535 (only TCP and UDP get this far),
  // and a network on one port is kept around those.
  std::vector<Cidr4> any;
  std::map<uint16_t, std::vector<Cidr4>> by_port;
  for (const auto& a : r.policy.allow) {
    if (!a.network) continue;
    if (a.port == 0) any.push_back(*a.network);
    else by_port[a.port].push_back(*a.network);
  }
  const std::string self = Ipv4ToString(r.address);
  const auto every_port = MergeRanges(any);
  for (const auto& range : every_port) e.nets.push_back(StrCat(self, " . ", RangeText(range), " . 0-65535"));
  for (const auto& [p, nets] : by_port) {
    for (const auto& range : Subtract(MergeRanges(nets), every_port)) e.nets.push_back(StrCat(self, " . ", RangeText(range), " . ", p));
  }
  return e;
}

std::string Firewall::Elements(const char* verb, const Entry& e, bool with_interface) const {
  const std::string& t = config_.table;
  const bool add = std::string_view(verb) == "add";
  const std::string a = Ipv4ToString(e.address);
  const std::string at = StrCat("\"", e.ifname, "\" . ", a);
  std::string s;
  auto element = [&](const char* set, const std::string& elem) { s += StrCat(verb, " element inet ", t, " ", set, " { ", elem, " }\n"); };
  element("from4", at + (add ? " : goto " + e.out : ""));
  element("to4", at + (add ? " : goto " + e.in : ""));
  if (with_interface) {
    element("ifs4", StrCat("\"", e.ifname, "\""));
    element("src4", at);
    element("okc4", a);
    element("noc4", a);
  }
  if (e.generation != 0) {
    element("cur4", StrCat(a, " . ", Hex32(e.generation)));
    element("gen4", a + (add ? " : " + Hex32(e.generation) : ""));
  }
  for (const auto& net : e.nets) element("net4", net);
  return s;
}

std::string Firewall::Forget(const Entry& e) const {
  const std::string& t = config_.table;
  const std::string a = Ipv4ToString(e.address);
  std::string s;
  // Added first: one whose time ran out is not there to delete (and one
  // that is keeps its time: nftables 1.0.6 cannot update one in place).
  for (const auto& [to, until] : e.admitted) {
    const auto [peer, p] = to;
    const std::string set = p == 0 ? "adm4" : "admp4";
    const std::string elem = p == 0 ? StrCat(a, " . ", Ipv4ToString(peer)) : StrCat(a, " . ", Ipv4ToString(peer), " . ", p);
    s += StrCat("add element inet ", t, " ", set, " { ", elem, " timeout 1s }\n");
    s += StrCat("delete element inet ", t, " ", set, " { ", elem, " }\n");
  }
  return s;
}

std::string Firewall::AdmitElements(const Entry& e, const Admission& adm) const {
  const std::string& t = config_.table;
  const std::string a = Ipv4ToString(e.address);
  std::string s;
  // add + delete + add: an element already there gets the new timeout
  // (nftables 1.0.6 cannot update one in place).
  for (uint32_t peer : adm.addresses) {
    for (uint16_t p : adm.ports) {
      const std::string set = p == 0 ? "adm4" : "admp4";
      const std::string elem = p == 0 ? StrCat(a, " . ", Ipv4ToString(peer)) : StrCat(a, " . ", Ipv4ToString(peer), " . ", p);
      s += StrCat("add element inet ", t, " ", set, " { ", elem, " }\n");
      s += StrCat("delete element inet ", t, " ", set, " { ", elem, " }\n");
      s += StrCat("add element inet ", t, " ", set, " { ", elem, " timeout ", std::max<uint32_t>(adm.seconds, 1), "s }\n");
    }
  }
  return s;
}

Status Firewall::AddSandbox(const SandboxRules& r) {
  std::lock_guard lock(mu_);
  if (entries_.count(r.key)) return Error(EEXIST, "nftables: the rules of sandbox " + r.key + " exist");
  Entry e = EntryFor(r);
  STRATA_RETURN_IF_ERROR(Run(Elements("add", e)).Annotate("nftables: add the rules of sandbox " + r.key));
  entries_[r.key] = std::move(e);
  return OkStatus();
}

Status Firewall::ReplacePolicy(const SandboxRules& next, const std::vector<Admission>& keep) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(next.key);
  if (it == entries_.end()) return Error(ENOENT, "nftables: no rules of sandbox " + next.key);
  const Entry& old = it->second;
  Entry e = EntryFor(next);
  // Its interface's elements and its counters stay.
  std::string s = Elements("delete", old, false) + Forget(old) + Elements("add", e, false);
  for (const auto& adm : keep) s += AdmitElements(e, adm);
  STRATA_RETURN_IF_ERROR(Run(s).Annotate("nftables: change the policy of sandbox " + next.key));
  // (After the transaction: the record must not run out before the kernel's.)
  const auto now = std::chrono::steady_clock::now();
  for (const auto& adm : keep) {
    for (uint32_t peer : adm.addresses) {
      for (uint16_t p : adm.ports) e.admitted[{peer, p}] = now + std::chrono::seconds(std::max<uint32_t>(adm.seconds, 1) + 1);
    }
  }
  it->second = std::move(e);
  return OkStatus();
}

Status Firewall::Admit(const std::string& key, const std::vector<uint32_t>& addresses, const std::vector<uint16_t>& ports,
                       uint32_t seconds) {
  if (addresses.empty() || ports.empty()) return OkStatus();
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return Error(ENOENT, "nftables: no rules of sandbox " + key);
  Entry& e = it->second;
  STRATA_RETURN_IF_ERROR(Run(AdmitElements(e, {addresses, ports, seconds})).Annotate("nftables: admit resolved addresses for sandbox " + key));
  // What ran out is gone from the kernel's view (and from its set soon).
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(e.admitted, [&](const auto& kv) { return kv.second < now; });
  for (uint32_t peer : addresses) {
    for (uint16_t p : ports) e.admitted[{peer, p}] = now + std::chrono::seconds(std::max<uint32_t>(seconds, 1) + 1);
  }
  return OkStatus();
}

Status Firewall::RemoveSandbox(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return OkStatus();
  // All of it in one transaction, as it came.
  STRATA_RETURN_IF_ERROR(Run(Elements("delete", it->second) + Forget(it->second)).Annotate("nftables: remove the rules of sandbox " + key));
  entries_.erase(it);
  return OkStatus();
}

Result<FirewallCounters> Firewall::Counters(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return Error(ENOENT, "nftables: no rules of sandbox " + key);
  const std::string a = Ipv4ToString(it->second.address);
  FirewallCounters c;
  for (auto [set, field] : {std::pair{"okc4", &c.allowed}, std::pair{"noc4", &c.refused}}) {
    std::string out;
    STRATA_RETURN_IF_ERROR(Run(StrCat("list set inet ", config_.table, " ", set), &out));
    json j = json::parse(out, nullptr, false);
    if (!j.is_object()) continue;
    for (const auto& item : j.value("nftables", json::array())) {
      if (!item.contains("set")) continue;
      for (const auto& e : item["set"].value("elem", json::array())) {
        if (e.is_object() && e.contains("elem") && e["elem"].value("val", "") == a && e["elem"].contains("counter")) {
          *field = e["elem"]["counter"].value("packets", uint64_t{0});
        }
      }
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

std::map<std::string, uint32_t> Firewall::List() {
  std::lock_guard lock(mu_);
  std::map<std::string, uint32_t> result;
  for (const auto& [key, e] : entries_) result[key] = e.address;
  return result;
}

}  // namespace strata::launcher
