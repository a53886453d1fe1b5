// launcher cordon: give a cluster node no new sandboxes.
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
  return Done(Cordon(f.cluster, f.node, "launcher cordon"));
}

}  // namespace

void AddCordon(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("cordon", "give a cluster node no new sandboxes");
  c->add_option("--cluster", f->cluster, "etcd: URL[,URL...] (default: $STRATA_CLUSTER)");
  c->add_option("NODE", f->node, "node name")->required();
  c->callback([f, &cli] { cli.exit_code = Do(*f); });
}

}  // namespace strata::launcher::cli
