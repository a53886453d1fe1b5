// layerctl pull: a published layer's files written into a directory.
#include <iostream>
#include <memory>

#include "layerctl/cli/cli.h"

namespace strata::layerctl::cli {
namespace {

struct Flags {
  std::string ref, out_dir;
};

int PullLayer(const Flags& f, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto digest = catalog->Resolve(f.ref);
  if (!digest.ok()) return Fail(digest.status());
  auto report = Pull(*catalog, *digest, f.out_dir);
  if (!report.ok()) return Fail(report.status());
  if (cli.as_json) std::cout << ManifestSummary(*digest, report->manifest).dump() << "\n";
  else std::cout << digest->Hex() << "\n";
  return 0;
}

}  // namespace

void AddPull(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("pull", "write a published layer's files into a directory");
  c->add_option("REF", f->ref, "NAME:VERSION or digest")->required();
  c->add_option("-o,--output", f->out_dir, "directory")->required();
  c->callback([f, &cli] { cli.exit_code = PullLayer(*f, cli); });
}

}  // namespace strata::layerctl::cli
