// launcher net: show or change a sandbox's network policy (task phases).
#include <cstdio>
#include <memory>

#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string id, mode;
  std::vector<std::string> allow;
  ClientFlags client;
};

int Net(const Flags& f) {
  const bool change = !f.mode.empty() || !f.allow.empty();
  auto policy = change ? NetPolicy::FromFlags(f.mode, f.allow) : Result<NetPolicy>(NetPolicy{});
  if (!policy.ok()) return Fail(policy.status().Annotate("net"));
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto r = change ? client->SetNetwork(f.id, policy->ToJson()) : client->Network(f.id);
  if (!r.ok()) return Fail(r.status());
  std::printf("%s\n", r->dump(2).c_str());
  return 0;
}

}  // namespace

void AddNet(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("net", "show or change a sandbox's network policy (task phases)");
  c->add_option("ID", f->id, "sandbox id")->required();
  c->add_option("--mode", f->mode, "none, allow or open: new connections follow at once, refused open ones are reset");
  c->add_option("--allow", f->allow, "with --mode allow: DOMAIN, *.DOMAIN, ADDR or CIDR[:PORT] (repeatable)");
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = Net(*f); });
}

}  // namespace strata::launcher::cli
