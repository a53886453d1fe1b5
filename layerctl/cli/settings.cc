// layerctl settings: the store's settings, shown or changed.
#include <iostream>
#include <memory>

#include "layerctl/cli/cli.h"

namespace strata::layerctl::cli {
namespace {

using nlohmann::json;

int Settings(const std::string& compress, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto current = catalog->GetSettings();
  if (!current.ok()) return Fail(current.status());
  if (!compress.empty()) {
    auto c = cache::ParseCompression(compress);
    if (!c.ok()) return Fail(c.status().Annotate("--compress"));
    current->compression = *c;
    Status s = catalog->PutSettings(*current);
    if (!s.ok()) return Fail(s.Annotate("write the store's settings"));
  }
  json j = {{"store", catalog->store().url()}, {"compress", current->compression.ToString()}};
  if (cli.as_json) std::cout << j.dump() << "\n";
  else std::cout << "compress " << current->compression.ToString() << "\n";
  return 0;
}

}  // namespace

void AddSettings(CLI::App& app, Cli& cli) {
  auto compress = std::make_shared<std::string>();
  auto* c = app.add_subcommand("settings", "show the store's settings, or change them");
  c->add_option("--compress", *compress, "what pushes without --compress use: none, zstd or zstd:LEVEL");
  c->callback([compress, &cli] { cli.exit_code = Settings(*compress, cli); });
}

}  // namespace strata::layerctl::cli
