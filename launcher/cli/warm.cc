// launcher warm: keep N sandboxes of a layer stack ready (a warm pool), or
// list the pools.
#include <cstdio>
#include <memory>

#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  SandboxFlags sandbox;  // the shape: --layer, --backend, --store, limits, network
  int size = -1;
  ClientFlags client;
};

int Warm(const Flags& f) {
  if (f.sandbox.spec.layers.empty() != (f.size < 0)) {
    return Fail(Error(EINVAL, "warm: give --layer and --size to set a pool, neither to list them"));
  }
  auto spec = f.sandbox.Spec();
  if (!spec.ok()) return Fail(spec.status());
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto r = spec->layers.empty() ? client->WarmPools() : client->SetWarmPool(SpecJson(*spec), f.size);
  if (!r.ok()) return Fail(r.status().Annotate("warm"));
  std::printf("%s\n", r->dump(2).c_str());
  return 0;
}

}  // namespace

void AddWarm(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto& s = f->sandbox;
  auto* c = app.add_subcommand("warm", "keep N sandboxes of a layer stack ready (a warm pool); without --layer, list the pools");
  c->add_option("--layer", s.spec.layers, "layer REF, bottom first");
  c->add_option("--backend", s.spec.backend, "container or microvm")->capture_default_str();
  c->add_option("--store", s.spec.store, "store URL (default: the daemon's)");
  c->add_option("--size", f->size, "ready sandboxes to keep (0 removes the pool)");
  c->add_option("--cpus", s.cpus, "CPU quota in cores");
  c->add_option("--memory", s.memory, "memory limit, e.g. 512M");
  c->add_option("--pids", s.pids, "process limit");
  c->add_option("--disk", s.disk, "size cap of the writable layer")->capture_default_str();
  c->add_option("--net", s.net, "none (the default), allow or open");
  c->add_option("--allow", s.allow, "with --net allow: DOMAIN, *.DOMAIN, ADDR or CIDR[:PORT] (repeatable)");
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = Warm(*f); });
}

}  // namespace strata::launcher::cli
