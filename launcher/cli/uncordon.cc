// launcher uncordon: let a cordoned node take sandboxes again.
#include <cstdio>
#include <memory>

#include "launcher/cli/cli.h"
#include "launcher/cluster/admin.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string cluster = EnvOr("STRATA_CLUSTER", "");
  std::string node;
};

int Do(const Flags& f) {
  if (f.cluster.empty()) return Fail(Error(EINVAL, "--cluster URL (or $STRATA_CLUSTER) is required"));
  return Done(Uncordon(f.cluster, f.node));
}

}  // namespace

void AddUncordon(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("uncordon", "let a cordoned node take sandboxes again");
  c->add_option("--cluster", f->cluster, "etcd: URL[,URL...] (default: $STRATA_CLUSTER)");
  c->add_option("NODE", f->node, "node name")->required();
  c->callback([f, &cli] { cli.exit_code = Do(*f); });
}

}  // namespace strata::launcher::cli
