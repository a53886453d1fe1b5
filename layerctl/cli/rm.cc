// layerctl rm: remove a tag (the layer stays until gc).
#include <memory>

#include "layerctl/cli/cli.h"

namespace strata::layerctl::cli {
namespace {

int Remove(const std::string& tag, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto t = cache::ParseTag(tag);
  if (!t.ok()) return Fail(t.status());
  Status s = catalog->DeleteTag(t->name, t->version);
  return s.ok() ? 0 : Fail(s);
}

}  // namespace

void AddRm(CLI::App& app, Cli& cli) {
  auto tag = std::make_shared<std::string>();
  auto* c = app.add_subcommand("rm", "remove a tag (the layer stays until gc)");
  c->add_option("TAG", *tag, "NAME:VERSION")->required();
  c->callback([tag, &cli] { cli.exit_code = Remove(*tag, cli); });
}

}  // namespace strata::layerctl::cli
