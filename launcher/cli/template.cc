// launcher template: name a layer stack, back end and resources as a
// template (what E2B's clients create sandboxes from, docs/e2b.md), list
// them, remove one.
#include <cstdio>
#include <memory>

#include "common/units.h"
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string name;
  std::vector<std::string> layers;
  std::string backend, memory;
  double cpus = 0;
  ClientFlags client;
};

int Set(const Flags& f) {
  nlohmann::json spec = {{"layers", f.layers}};
  if (!f.backend.empty()) spec["backend"] = f.backend;
  if (f.cpus > 0) spec["cpus"] = f.cpus;
  if (!f.memory.empty()) {
    auto bytes = ParseSize(f.memory);
    if (!bytes.ok()) return Fail(bytes.status().Annotate("template set: --memory"));
    spec["memory"] = *bytes;
  }
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto r = client->SetTemplate(f.name, spec);
  if (!r.ok()) return Fail(r.status().Annotate("template set " + f.name));
  std::printf("%s\n", r->dump(2).c_str());
  return 0;
}

int List(const Flags& f) {
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto r = client->Templates();
  if (!r.ok()) return Fail(r.status().Annotate("template ls"));
  std::printf("%s\n", r->dump(2).c_str());
  return 0;
}

int Remove(const Flags& f) {
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  if (Status s = client->RemoveTemplate(f.name); !s.ok()) return Fail(s.Annotate("template rm " + f.name));
  return 0;
}

}  // namespace

void AddTemplate(CLI::App& app, Cli& cli) {
  auto* c = app.add_subcommand("template", "templates: named layer stacks E2B's clients create sandboxes from");
  c->require_subcommand(1);
  {
    auto f = std::make_shared<Flags>();
    auto* s = c->add_subcommand("set", "make or replace a template");
    s->add_option("name", f->name, "its name (\"base\" is what E2B's examples use)")->required();
    s->add_option("--layer", f->layers, "layer REF, bottom first (repeatable)")->required();
    s->add_option("--backend", f->backend, "container, fncall, microvm (default: the node's)");
    s->add_option("--memory", f->memory, "memory limit, e.g. 512M");
    s->add_option("--cpus", f->cpus, "CPU quota in cores");
    f->client.Add(s);
    s->callback([f, &cli] { cli.exit_code = Set(*f); });
  }
  {
    auto f = std::make_shared<Flags>();
    auto* s = c->add_subcommand("ls", "list the templates");
    f->client.Add(s);
    s->callback([f, &cli] { cli.exit_code = List(*f); });
  }
  {
    auto f = std::make_shared<Flags>();
    auto* s = c->add_subcommand("rm", "remove a template");
    s->add_option("name", f->name, "its name")->required();
    f->client.Add(s);
    s->callback([f, &cli] { cli.exit_code = Remove(*f); });
  }
}

}  // namespace strata::launcher::cli
