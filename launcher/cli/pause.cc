// launcher pause: freeze every process of a sandbox.
#include <memory>

#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string id;
  ClientFlags client;
};

int PauseSandbox(const Flags& f) {
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  return Done(client->Pause(f.id));
}

}  // namespace

void AddPause(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("pause", "freeze every process of a sandbox");
  c->add_option("ID", f->id)->required();
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = PauseSandbox(*f); });
}

}  // namespace strata::launcher::cli
