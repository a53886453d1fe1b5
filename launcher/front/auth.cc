// One authentication for the node's API and the gateway.
#include "launcher/front/auth.h"

#include <fstream>
#include <sstream>

#include "common/strings.h"

namespace strata::launcher {
namespace {

// Every group the peer process is in (SO_PEERCRED gives only its primary).
bool InGroup(pid_t pid, gid_t primary, gid_t group) {
  if (primary == group) return true;
  std::ifstream status(StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with("Groups:")) continue;
    std::istringstream in(line.substr(7));
    gid_t g;
    while (in >> g) {
      if (g == group) return true;
    }
  }
  return false;
}

}  // namespace

Status Authenticator::Load(const std::string& tokens_file, const std::string& legacy_token_file) {
  tokens_file_ = tokens_file;
  legacy_token_file_ = legacy_token_file;
  if (tokens_file.empty() && legacy_token_file.empty()) return OkStatus();
  STRATA_ASSIGN_OR_RETURN(auto tenants, Read());
  SetTenants(std::move(tenants));
  return OkStatus();
}

Result<std::vector<Tenant>> Authenticator::Read() const {
  return tokens_file_.empty() ? LoadLegacyTokenFile(legacy_token_file_) : LoadTokensFile(tokens_file_);
}

Status Authenticator::Reload() {
  if (tokens_file_.empty() && legacy_token_file_.empty()) return OkStatus();
  auto tenants = Read();
  if (!tenants.ok()) return tenants.status().Annotate("reload tokens (the tenants stay as they were)");
  tenants_.Replace(std::move(*tenants));
  return OkStatus();
}

void Authenticator::SetTenants(std::vector<Tenant> tenants) {
  tenants_.Replace(std::move(tenants));
  has_tenants_ = true;
}

Result<Caller> Authenticator::Authenticate(const HttpServer::Request& req) const {
  const std::string& who = policy_.who;
  Caller caller;
  auto named = req.headers.find(kTenantHeader);
  const bool names_tenant = named != req.headers.end() && !named->second.empty();
  if (policy_.unix_operator && req.unix_peer) {
    // Root, or the operator's group, on the node's socket; anyone else
    // there needs a token.
    if (req.peer_uid == 0 ||
        (policy_.operator_group != static_cast<gid_t>(-1) && InGroup(req.peer_pid, req.peer_gid, policy_.operator_group))) {
      caller.is_operator = true;
      return caller;
    }
  } else if (!has_tenants_ && policy_.open_without_tokens) {
    if (names_tenant) return Error(EPERM, who + ": no tokens (--insecure), so no call may name a tenant (X-Strata-Tenant)");
    caller.is_operator = true;
    return caller;
  }
  auto it = req.headers.find("authorization");
  STRATA_ASSIGN_OR_RETURN(caller.tenant, tenants_.FromAuthorization(it == req.headers.end() ? nullptr : &it->second, who));
  if (caller.tenant->limits.gateway) {
    if (!policy_.gateway_credentials) return Error(EPERM, who + ": a gateway's credential is for nodes, not for calls to a gateway");
    // Only a gateway's credential may say whom it calls for.
    if (!names_tenant) {  // an operator's call, passed on
      caller.tenant = nullptr;
      caller.is_operator = true;
      return caller;
    }
    auto tenant = tenants_.Find(named->second);
    if (!tenant || tenant->limits.gateway) {
      return Error(EKEYREJECTED, who + ": the gateway's call names tenant " + Quote(named->second) + ", which this node does not know");
    }
    caller.tenant = std::move(tenant);
  } else if (names_tenant && named->second != caller.tenant->name) {
    // A tenant that names another tenant is refused rather than ignored.
    return Error(EPERM, who + ": only a gateway's credential may name a tenant (X-Strata-Tenant)");
  }
  return caller;
}

HttpServer::Response AuthRefusal(const Status& refusal) {
  HttpServer::Response r = HttpServer::ErrorResponse(refusal);
  r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

}  // namespace strata::launcher
