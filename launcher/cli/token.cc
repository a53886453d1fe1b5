// launcher token new|revoke: a tenant's API token in a tokens file.
#include <cstdio>
#include <memory>

#include "common/crypto.h"
#include "launcher/cli/cli.h"
#include "launcher/front/tenants.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string name, tokens_path;
  Tenant tenant;
};

int New(Flags f) {
  auto token = NewToken();
  if (!token.ok()) return Fail(token.status());
  f.tenant.name = f.name;
  auto hash = Sha256Hex(*token);
  if (!hash.ok()) return Fail(hash.status());
  f.tenant.token_sha256 = *hash;
  // Checks the name and limits as the daemon will read them.
  auto checked = ParseTenantLine(FormatTenantLine(f.tenant));
  if (!checked.ok()) return Fail(checked.status());
  if (Status s = AddTenant(f.tokens_path, *checked); !s.ok()) return Fail(s);
  std::printf("%s\n", token->c_str());
  return 0;
}

}  // namespace

void AddToken(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* token = app.add_subcommand("token", "add or revoke a tenant's API token in a tokens file");
  token->require_subcommand(1);
  auto* add = token->add_subcommand("new", "add a tenant with a fresh token; prints only the token");
  add->add_option("NAME", f->name, "tenant name")->required();
  add->add_option("--tokens", f->tokens_path, "tokens file (created 0600)")->required();
  TenantLimits& limits = f->tenant.limits;
  add->add_option("--max-sandboxes", limits.max_sandboxes, "most sandboxes at once");
  add->add_option("--creates-per-s", limits.creates_per_second, "most creations per second");
  add->add_option("--store", limits.stores, "a store URL it may use besides the daemon's (repeatable)");
  add->add_option("--layers", limits.layers, "a layer name pattern it may use (repeatable; default any)");
  add->add_option("--publish", limits.publish, "a tag name pattern it may publish snapshots under (repeatable; default none)");
  add->add_flag("--net-host", limits.net_host, "may ask for the host's network");
  add->add_flag("--gateway", limits.gateway, "a cluster gateway's credential (it names the tenant it calls for)");
  add->callback([f, &cli] { cli.exit_code = New(*f); });
  auto* revoke = token->add_subcommand("revoke", "remove a tenant (takes effect on the daemon's SIGHUP)");
  revoke->add_option("NAME", f->name, "tenant name")->required();
  revoke->add_option("--tokens", f->tokens_path, "tokens file")->required();
  revoke->callback([f, &cli] { cli.exit_code = Done(RevokeTenant(f->tokens_path, f->name)); });
}

}  // namespace strata::launcher::cli
