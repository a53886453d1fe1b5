// layerctl tag: point NAME:VERSION at a layer.
#include <iostream>
#include <memory>

#include "layerctl/cli/cli.h"

namespace strata::layerctl::cli {
namespace {

struct Flags {
  std::string ref, tag;
};

int Tag(const Flags& f, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto t = cache::ParseTag(f.tag);
  if (!t.ok()) return Fail(t.status());
  auto digest = catalog->Resolve(f.ref);
  if (!digest.ok()) return Fail(digest.status());
  auto record = catalog->SetTag(t->name, t->version, *digest);
  if (!record.ok()) return Fail(record.status());
  if (cli.as_json) std::cout << nlohmann::json{{"tag", t->ToString()}, {"digest", digest->Hex()}}.dump() << "\n";
  return 0;
}

}  // namespace

void AddTag(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("tag", "point NAME:VERSION at a layer");
  c->add_option("REF", f->ref, "NAME:VERSION or digest")->required();
  c->add_option("TAG", f->tag, "NAME:VERSION")->required();
  c->callback([f, &cli] { cli.exit_code = Tag(*f, cli); });
}

}  // namespace strata::layerctl::cli
