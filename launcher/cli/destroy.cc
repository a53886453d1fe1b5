// launcher destroy: remove a sandbox and everything it made.
#include <memory>

#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string id;
  ClientFlags client;
};

int DestroySandbox(const Flags& f) {
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  return Done(client->Destroy(f.id));
}

}  // namespace

void AddDestroy(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("destroy", "remove a sandbox and everything it made");
  c->add_option("ID", f->id)->required();
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = DestroySandbox(*f); });
}

}  // namespace strata::launcher::cli
