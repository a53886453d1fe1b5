// layerctl push: publish a built layer directory.
#include <memory>

#include "layerctl/builder.h"
#include "layerctl/cli/cli.h"

namespace strata::layerctl::cli {
namespace {

struct Flags {
  std::string dir, tag, compress;
};

int PushDir(const Flags& f, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto push_options = ParsePushOptions(f.compress);
  if (!push_options.ok()) return Fail(push_options.status());
  auto to_tag = ParseOptionalTag(f.tag);
  if (!to_tag.ok()) return Fail(to_tag.status());
  auto layer = OpenLayerDir(f.dir);
  if (!layer.ok()) return Fail(layer.status());
  auto report = Push(*layer, *catalog, *to_tag, *push_options);
  if (!report.ok()) return Fail(report.status());
  PrintPush(*report, *to_tag, cli.as_json);
  return 0;
}

}  // namespace

void AddPush(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("push", "publish a built layer directory");
  c->add_option("DIR", f->dir, "layer directory from build -o")->required();
  c->add_option("--tag", f->tag, "tag as NAME:VERSION once published");
  c->add_option("--compress", f->compress, kCompressHelp);
  c->callback([f, &cli] { cli.exit_code = PushDir(*f, cli); });
}

}  // namespace strata::layerctl::cli
