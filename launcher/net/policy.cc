// Network policies: parsing and matching.
#include "launcher/net/policy.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cerrno>

#include "common/strings.h"

namespace strata::launcher {

using nlohmann::json;

std::string_view NetModeName(NetMode mode) {
  switch (mode) {
    case NetMode::kNone: return "none";
    case NetMode::kAllow: return "allow";
    case NetMode::kOpen: return "open";
    case NetMode::kHost: return "host";
  }
  return "none";
}

Result<NetMode> ParseNetMode(std::string_view name) {
  if (name == "none") return NetMode::kNone;
  if (name == "allow") return NetMode::kAllow;
  if (name == "open") return NetMode::kOpen;
  if (name == "host") return NetMode::kHost;
  return Error(EINVAL, StrCat("network mode ", Quote(name), ": not one of none, allow, open, host"));
}

std::string Ipv4ToString(uint32_t addr) {
  return StrCat(addr >> 24, ".", (addr >> 16) & 255, ".", (addr >> 8) & 255, ".", addr & 255);
}

std::optional<uint32_t> ParseIpv4(std::string_view text) {
  in_addr a;
  std::string s(text);
  if (::inet_pton(AF_INET, s.c_str(), &a) != 1) return std::nullopt;
  return ntohl(a.s_addr);
}

std::string Cidr4::ToString() const {
  return prefix == 32 ? Ipv4ToString(addr) : StrCat(Ipv4ToString(addr), "/", prefix);
}

Result<Cidr4> Cidr4::Parse(std::string_view text) {
  Cidr4 c;
  std::string_view address = text;
  if (size_t slash = text.find('/'); slash != std::string_view::npos) {
    address = text.substr(0, slash);
    std::string_view bits = text.substr(slash + 1);
    char* end = nullptr;
    std::string b(bits);
    long n = std::strtol(b.c_str(), &end, 10);
    if (b.empty() || *end != '\0' || n < 0 || n > 32) return Error(EINVAL, StrCat("network ", Quote(text), ": bad prefix length"));
    c.prefix = static_cast<int>(n);
  }
  auto a = ParseIpv4(address);
  if (!a) return Error(EINVAL, StrCat("network ", Quote(text), ": not an IPv4 address"));
  c.addr = c.prefix == 0 ? 0 : (c.prefix == 32 ? *a : *a & ~(0xffffffffu >> c.prefix));
  return c;
}

namespace {

bool ValidDomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  for (const auto& label : Split(name, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (char ch : label) {
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') return false;
    }
  }
  return true;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

}  // namespace

std::string AllowEntry::ToString() const {
  std::string base = network ? network->ToString() : (wildcard ? "*." + domain : domain);
  return port ? StrCat(base, ":", port) : base;
}

Result<AllowEntry> AllowEntry::Parse(std::string_view text) {
  AllowEntry e;
  std::string_view host = text;
  if (text.find("::") != std::string_view::npos || std::count(text.begin(), text.end(), ':') > 1) {
    return Error(EINVAL, StrCat("allow entry ", Quote(text), ": IPv6 is not supported (sandboxes have IPv4 only)"));
  }
  if (size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    std::string p(text.substr(colon + 1));
    char* end = nullptr;
    long n = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || n < 1 || n > 65535) {
      return Error(EINVAL, StrCat("allow entry ", Quote(text), ": the port must be a number from 1 to 65535"));
    }
    e.port = static_cast<uint16_t>(n);
  }
  if (host.empty()) return Error(EINVAL, StrCat("allow entry ", Quote(text), ": empty"));
  if (std::isdigit(static_cast<unsigned char>(host.back())) && host.find_first_not_of("0123456789./") == std::string_view::npos) {
    auto net = Cidr4::Parse(host);
    if (!net.ok()) return net.status().Annotate(StrCat("allow entry ", Quote(text)));
    e.network = *net;
    return e;
  }
  std::string name = Lower(host);
  if (name.starts_with("*.")) {
    e.wildcard = true;
    name = name.substr(2);
  }
  if (name.ends_with('.')) name.pop_back();
  if (!ValidDomain(name) || name.find('*') != std::string::npos) {
    return Error(EINVAL, StrCat("allow entry ", Quote(text), ": not a domain, *.domain, address or CIDR"));
  }
  e.domain = std::move(name);
  return e;
}

bool AllowEntry::MatchesName(std::string_view name) const {
  if (network || domain.empty()) return false;
  if (!wildcard) return name == domain;
  return name.size() > domain.size() + 1 && name.ends_with(domain) && name[name.size() - domain.size() - 1] == '.';
}

std::vector<uint16_t> NetPolicy::PortsForName(std::string_view raw) const {
  if (mode == NetMode::kOpen || mode == NetMode::kHost) return {0};
  if (mode != NetMode::kAllow) return {};
  std::string name = Lower(raw);
  if (name.ends_with('.')) name.pop_back();
  std::vector<uint16_t> ports;
  for (const auto& e : allow) {
    if (!e.MatchesName(name)) continue;
    if (e.port == 0) return {0};
    if (std::find(ports.begin(), ports.end(), e.port) == ports.end()) ports.push_back(e.port);
  }
  return ports;
}

json NetPolicy::ToJson() const {
  json j = {{"mode", NetModeName(mode)}};
  if (mode == NetMode::kAllow) {
    json list = json::array();
    for (const auto& e : allow) list.push_back(e.ToString());
    j["allow"] = list;
  }
  return j;
}

Result<NetPolicy> NetPolicy::FromJson(const json& j) {
  NetPolicy p;
  if (j.is_null()) return p;
  if (j.is_string()) {
    STRATA_ASSIGN_OR_RETURN(p.mode, ParseNetMode(j.get<std::string>()));
    return p;
  }
  if (!j.is_object()) return Error(EINVAL, "network: a mode string or an object {\"mode\": ..., \"allow\": [...]}");
  for (const auto& [key, value] : j.items()) {
    if (key != "mode" && key != "allow") return Error(EINVAL, StrCat("network: unknown field ", Quote(key)));
  }
  const json mode = j.value("mode", json(j.contains("allow") ? "allow" : "none"));
  if (!mode.is_string()) return Error(EINVAL, "network: mode must be a string");
  STRATA_ASSIGN_OR_RETURN(p.mode, ParseNetMode(mode.get<std::string>()));
  if (j.contains("allow")) {
    if (!j["allow"].is_array()) return Error(EINVAL, "network: allow must be a list of strings");
    if (p.mode != NetMode::kAllow && !j["allow"].empty()) {
      return Error(EINVAL, StrCat("network: an allow list needs mode allow, not ", NetModeName(p.mode)));
    }
    if (j["allow"].size() > 1024) return Error(EINVAL, "network: at most 1024 allow entries");
    for (const auto& e : j["allow"]) {
      if (!e.is_string()) return Error(EINVAL, "network: allow must be a list of strings");
      STRATA_ASSIGN_OR_RETURN(AllowEntry entry, AllowEntry::Parse(e.get<std::string>()));
      p.allow.push_back(std::move(entry));
    }
  }
  return p;
}

Result<NetPolicy> NetPolicy::FromFlags(const std::string& mode, const std::vector<std::string>& allow) {
  json j = {{"mode", mode.empty() ? (allow.empty() ? "none" : "allow") : mode}};
  if (!allow.empty()) j["allow"] = allow;
  return FromJson(j);
}

}  // namespace strata::launcher
