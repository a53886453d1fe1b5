// launcher create: a sandbox through the daemon; prints its id.
#include <cstdio>
#include <memory>

#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  SandboxFlags sandbox;
  ClientFlags client;
};

int Create(const Flags& f) {
  auto spec = f.sandbox.Spec();
  if (!spec.ok()) return Fail(spec.status());
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto info = client->Create(SpecJson(*spec));
  if (!info.ok()) return Fail(info.status());
  if (f.sandbox.verbose) PrintLayers(*info);
  std::printf("%s\n", (*info)["id"].get<std::string>().c_str());
  return 0;
}

}  // namespace

void AddCreate(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("create", "create a sandbox through the daemon; prints its id");
  f->sandbox.Add(c);
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = Create(*f); });
}

}  // namespace strata::launcher::cli
