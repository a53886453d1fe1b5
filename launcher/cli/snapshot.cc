// launcher snapshot: a sandbox's changes captured as a diff layer.
#include <cstdio>
#include <memory>

#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string id, tag;
  bool include_denied = false;
  ClientFlags client;
};

int Snapshot(const Flags& f) {
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto r = client->Snapshot(f.id, f.tag, f.include_denied);
  if (!r.ok()) return Fail(r.status());
  std::printf("%s\n", (*r)["digest"].get<std::string>().c_str());
  return 0;
}

}  // namespace

void AddSnapshot(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("snapshot", "capture a sandbox's changes as a diff layer");
  c->add_option("ID", f->id)->required();
  c->add_option("--tag", f->tag, "NAME:VERSION")->required();
  c->add_flag("--include-denied", f->include_denied, "also pack what lies under the sandbox's denied paths (operators)");
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = Snapshot(*f); });
}

}  // namespace strata::launcher::cli
