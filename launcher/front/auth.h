// Who is calling, decided one way for every front (the node's API and the
// gateway): the tenants a tokens file names, and the few callers that are
// the operator without a token. docs/api.md ("Tenants and tokens",
// "Gateways") and docs/security.md describe the rules.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "launcher/front/http_server.h"
#include "launcher/front/tenants.h"

namespace strata::launcher {

// Who is calling: the operator, or a tenant by its token.
struct Caller {
  bool is_operator = false;
  std::shared_ptr<const Tenant> tenant;  // set when not the operator
  // The tenant's name; "" for the operator.
  std::string scope() const { return tenant ? tenant->name : ""; }
};

// How one front authenticates.
struct AuthPolicy {
  // Starts every refusal ("launcher", "gateway").
  std::string who;
  // A unix-socket peer that is root, or in this group (by any of its
  // groups), is the operator. The node's own socket; a gateway has none.
  bool unix_operator = false;
  gid_t operator_group = static_cast<gid_t>(-1);
  // Without a tokens file every other caller is the operator (--insecure).
  bool open_without_tokens = false;
  // A gateway's credential (gateway=yes) acts for the tenant its
  // X-Strata-Tenant header names, or for the operator without one (a node);
  // else that credential is refused (a gateway: it is for nodes).
  bool gateway_credentials = false;
};

class Authenticator {
 public:
  explicit Authenticator(AuthPolicy policy) : policy_(std::move(policy)) {}

  // Reads the tokens file (or, when only it is given, the old one-token
  // file: its token is the tenant "default"); from then on callers need a
  // token. Neither: no-op.
  Status Load(const std::string& tokens_file, const std::string& legacy_token_file = "");
  // Rereads what Load read (SIGHUP); on error the tenants stay as they were.
  Status Reload();
  void SetTenants(std::vector<Tenant> tenants);

  // A tokens file is in use.
  bool has_tenants() const { return has_tenants_; }
  TenantTable& tenants() { return tenants_; }

  // The caller of `request`, or why it may not call: ENOKEY (no bearer
  // token), EKEYREJECTED (one no tenant has, or a gateway naming a tenant
  // this front does not know), EPERM (a credential used where it may not).
  Result<Caller> Authenticate(const HttpServer::Request& request) const;

 private:
  Result<std::vector<Tenant>> Read() const;  // what Load names

  AuthPolicy policy_;
  std::string tokens_file_, legacy_token_file_;
  TenantTable tenants_;
  bool has_tenants_ = false;
};

// The answer to a caller Authenticate refused: its error, by errno
// (HttpServer::ErrorResponse), with WWW-Authenticate: Bearer.
HttpServer::Response AuthRefusal(const Status& refusal);

}  // namespace strata::launcher
