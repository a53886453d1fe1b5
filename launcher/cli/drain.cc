// launcher drain: cordon a node and wait until its sandboxes are gone.
#include <cstdio>
#include <memory>

#include "common/units.h"
#include "launcher/cli/cli.h"
#include "launcher/cluster/admin.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string cluster = EnvOr("STRATA_CLUSTER", "");
  std::string node, timeout = "10m";
};

int Do(const Flags& f) {
  if (f.cluster.empty()) return Fail(Error(EINVAL, "--cluster URL (or $STRATA_CLUSTER) is required"));
  auto t = ParseDuration(f.timeout);
  if (!t.ok()) return Fail(t.status().Annotate("--timeout"));
  return Done(Drain(f.cluster, f.node, *t, [&](int64_t n) {
    std::fprintf(stderr, "drain %s: %lld sandboxes left\n", f.node.c_str(), static_cast<long long>(n));
  }));
}

}  // namespace

void AddDrain(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("drain", "cordon a node and wait until its sandboxes are gone");
  c->add_option("--cluster", f->cluster, "etcd: URL[,URL...] (default: $STRATA_CLUSTER)");
  c->add_option("NODE", f->node, "node name")->required();
  c->add_option("--timeout", f->timeout, "give up after this long (the node stays cordoned)")->capture_default_str();
  c->callback([f, &cli] { cli.exit_code = Do(*f); });
}

}  // namespace strata::launcher::cli
