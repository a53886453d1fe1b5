// Tenants: the tokens file, authentication and creation rates.
#include "launcher/front/tenants.h"

#include <strings.h>

#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <sstream>

#include "cache/catalog.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/strings.h"

namespace strata::launcher {

namespace {

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
  });
}

std::vector<std::string> SplitList(std::string_view v) {
  std::vector<std::string> out;
  for (auto& s : Split(v, ',')) {
    if (!s.empty()) out.push_back(s);
  }
  return out;
}

// The file's lines, each tenant line parsed; comments and blank lines kept
// as they are (so `token new` and `revoke` keep an operator's notes).
struct FileLine {
  std::string text;
  std::optional<Tenant> tenant;
};

Result<std::vector<FileLine>> ReadLines(const std::string& path, bool missing_ok) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT && missing_ok) return std::vector<FileLine>{};
    return ErrnoError(errno, "tokens file " + path);
  }
  if (!S_ISREG(st.st_mode)) return Error(EINVAL, "tokens file " + path + ": not a regular file");
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Error(EACCES, StrCat("tokens file ", path, ": mode ", mode, " lets others read or change it; chmod 600 it"));
  }
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<FileLine> lines;
  int number = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    ++number;
    FileLine fl{line, std::nullopt};
    std::string_view t = line;
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    if (!t.empty() && t.front() != '#') {
      auto tenant = ParseTenantLine(line);
      if (!tenant.ok()) return tenant.status().Annotate(StrCat("tokens file ", path, " line ", number));
      for (const auto& other : lines) {
        if (other.tenant && other.tenant->name == tenant->name) {
          return Error(EINVAL, StrCat("tokens file ", path, " line ", number, ": tenant ", tenant->name, " is listed twice"));
        }
      }
      fl.tenant = std::move(*tenant);
    }
    lines.push_back(std::move(fl));
  }
  return lines;
}

Status WriteLines(const std::string& path, const std::vector<FileLine>& lines) {
  std::string text;
  for (const auto& l : lines) text += (l.tenant ? FormatTenantLine(*l.tenant) : l.text) + "\n";
  return WriteFileAtomic(path, text, true, 0600);
}

}  // namespace

Result<Tenant> ParseTenantLine(std::string_view line) {
  std::vector<std::string> words;
  std::istringstream in{std::string(line)};
  std::string w;
  while (in >> w) words.push_back(w);
  if (words.size() < 2) return Error(EINVAL, "expected NAME sha256:HEX [LIMIT=VALUE ...]");
  Tenant t;
  t.name = words[0];
  if (!ValidName(t.name)) return Error(EINVAL, "tenant name " + Quote(t.name) + " must be 1-64 of A-Z a-z 0-9 - _ .");
  if (!words[1].starts_with("sha256:") || words[1].size() != 7 + 64 || !HexDecode(words[1].substr(7))) {
    return Error(EINVAL, "tenant " + t.name + ": the second field must be sha256: and 64 hex digits (the token's hash, never the token)");
  }
  t.token_sha256 = words[1].substr(7);
  std::transform(t.token_sha256.begin(), t.token_sha256.end(), t.token_sha256.begin(), ::tolower);
  for (size_t i = 2; i < words.size(); ++i) {
    size_t eq = words[i].find('=');
    if (eq == std::string::npos) return Error(EINVAL, "tenant " + t.name + ": expected LIMIT=VALUE, got " + Quote(words[i]));
    std::string key = words[i].substr(0, eq), value = words[i].substr(eq + 1);
    char* end = nullptr;
    if (key == "max_sandboxes") {
      t.limits.max_sandboxes = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end || t.limits.max_sandboxes < 0) return Error(EINVAL, "tenant " + t.name + ": max_sandboxes=" + value + " is not a count");
    } else if (key == "creates_per_s") {
      t.limits.creates_per_second = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || t.limits.creates_per_second < 0) return Error(EINVAL, "tenant " + t.name + ": creates_per_s=" + value + " is not a rate");
    } else if (key == "stores") {
      t.limits.stores = SplitList(value);
    } else if (key == "layers") {
      t.limits.layers = SplitList(value);
    } else if (key == "publish") {
      t.limits.publish = SplitList(value);
    } else if (key == "net_host") {
      if (value != "yes" && value != "no") return Error(EINVAL, "tenant " + t.name + ": net_host must be yes or no");
      t.limits.net_host = value == "yes";
    } else if (key == "gateway") {
      if (value != "yes" && value != "no") return Error(EINVAL, "tenant " + t.name + ": gateway must be yes or no");
      t.limits.gateway = value == "yes";
    } else {
      return Error(EINVAL, "tenant " + t.name + ": unknown limit " + Quote(key) +
                               " (max_sandboxes, creates_per_s, stores, layers, publish, net_host, gateway)");
    }
  }
  return t;
}

std::string FormatTenantLine(const Tenant& t) {
  std::string out = StrCat(t.name, " sha256:", t.token_sha256);
  if (t.limits.max_sandboxes) out += StrCat(" max_sandboxes=", t.limits.max_sandboxes);
  if (t.limits.creates_per_second > 0) {
    std::ostringstream r;
    r << t.limits.creates_per_second;
    out += " creates_per_s=" + r.str();
  }
  if (!t.limits.stores.empty()) out += " stores=" + Join(t.limits.stores, ",");
  if (!t.limits.layers.empty()) out += " layers=" + Join(t.limits.layers, ",");
  if (!t.limits.publish.empty()) out += " publish=" + Join(t.limits.publish, ",");
  if (t.limits.net_host) out += " net_host=yes";
  if (t.limits.gateway) out += " gateway=yes";
  return out;
}

Result<std::vector<Tenant>> LoadTokensFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto lines, ReadLines(path, false));
  std::vector<Tenant> out;
  for (auto& l : lines) {
    if (l.tenant) out.push_back(std::move(*l.tenant));
  }
  return out;
}

Result<std::vector<Tenant>> LoadLegacyTokenFile(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, "token file " + path);
  if (st.st_mode & 077) return Error(EACCES, StrCat("token file ", path, ": others may read or change it; chmod 600 it"));
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::string token = text.substr(0, text.find('\n'));
  while (!token.empty() && (token.back() == ' ' || token.back() == '\r')) token.pop_back();
  if (token.empty()) return Error(EINVAL, "token file " + path + ": the first line (the token) is empty");
  Tenant t;
  t.name = "default";
  STRATA_ASSIGN_OR_RETURN(t.token_sha256, Sha256Hex(token));
  return std::vector<Tenant>{t};
}

Result<std::string> NewToken() {
  STRATA_ASSIGN_OR_RETURN(std::string raw, RandomBytes(32));
  return "st_" + HexEncode(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()));
}

Status AddTenant(const std::string& path, const Tenant& tenant) {
  STRATA_ASSIGN_OR_RETURN(auto lines, ReadLines(path, true));
  for (const auto& l : lines) {
    if (l.tenant && l.tenant->name == tenant.name) {
      return Error(EEXIST, StrCat("tokens file ", path, ": tenant ", tenant.name, " exists (revoke it first)"));
    }
  }
  lines.push_back({"", tenant});
  return WriteLines(path, lines);
}

Status RevokeTenant(const std::string& path, const std::string& name) {
  STRATA_ASSIGN_OR_RETURN(auto lines, ReadLines(path, false));
  auto it = std::find_if(lines.begin(), lines.end(), [&](const FileLine& l) { return l.tenant && l.tenant->name == name; });
  if (it == lines.end()) return Error(ENOENT, StrCat("tokens file ", path, ": no tenant ", Quote(name)));
  lines.erase(it);
  return WriteLines(path, lines);
}

void TenantTable::Replace(std::vector<Tenant> tenants) {
  std::vector<std::shared_ptr<const Tenant>> next;
  for (auto& t : tenants) next.push_back(std::make_shared<const Tenant>(std::move(t)));
  std::lock_guard lock(mu_);
  tenants_ = std::move(next);
}

size_t TenantTable::size() const {
  std::lock_guard lock(mu_);
  return tenants_.size();
}

std::shared_ptr<const Tenant> TenantTable::Authenticate(std::string_view token) const {
  auto hash = Sha256Hex(token);
  if (!hash.ok() || token.empty()) return nullptr;
  std::vector<std::shared_ptr<const Tenant>> tenants;
  {
    std::lock_guard lock(mu_);
    tenants = tenants_;
  }
  std::shared_ptr<const Tenant> found;
  for (const auto& t : tenants) {  // every one, so the time says nothing of which matched
    if (ConstantTimeEqual(*hash, t->token_sha256) && !found) found = t;
  }
  return found;
}

Result<std::shared_ptr<const Tenant>> TenantTable::FromAuthorization(const std::string* header, std::string_view who) const {
  if (!header || header->size() < 7 || strncasecmp(header->c_str(), "bearer ", 7) != 0) {
    return Error(ENOKEY, StrCat(who, ": no token (send Authorization: Bearer <token>)"));
  }
  auto tenant = Authenticate(std::string_view(*header).substr(7));
  if (!tenant) return Error(EKEYREJECTED, StrCat(who, ": unknown or revoked token"));
  return tenant;
}

std::shared_ptr<const Tenant> TenantTable::Find(std::string_view name) const {
  std::lock_guard lock(mu_);
  for (const auto& t : tenants_) {
    if (t->name == name) return t;
  }
  return nullptr;
}

int TenantTable::TakeCreations(const Tenant& tenant, int n) {
  const double rate = tenant.limits.creates_per_second;
  if (rate <= 0) return n;
  const double burst = std::max(1.0, rate);
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  Bucket& b = buckets_[tenant.name];
  if (!b.started) {
    b.tokens = burst;
    b.started = true;
  } else {
    b.tokens = std::min(burst, b.tokens + rate * std::chrono::duration<double>(now - b.last).count());
  }
  b.last = now;
  int got = std::min(n, static_cast<int>(b.tokens));
  b.tokens -= got;
  return got;
}

bool PublishAllowed(const TenantLimits& limits, const std::string& tag) {
  const std::string name = tag.substr(0, tag.find(':'));
  for (const auto& pattern : limits.publish) {
    if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

bool LayerAllowed(const TenantLimits& limits, const std::string& ref) {
  if (limits.layers.empty()) return true;
  std::string name = ref.substr(0, ref.find_first_of(":@"));
  auto parsed = cache::ParseRef(ref);
  if (parsed.ok() && parsed->is_digest()) return false;
  for (const auto& pattern : limits.layers) {
    if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace strata::launcher
