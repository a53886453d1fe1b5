// launcher resume: thaw a paused sandbox.
#include <memory>

#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string id;
  ClientFlags client;
};

int ResumeSandbox(const Flags& f) {
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  return Done(client->Resume(f.id));
}

}  // namespace

void AddResume(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("resume", "thaw a paused sandbox");
  c->add_option("ID", f->id)->required();
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = ResumeSandbox(*f); });
}

}  // namespace strata::launcher::cli
