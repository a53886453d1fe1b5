// launcher nodes: list the cluster's nodes with their load.
#include <cstdio>
#include <memory>

#include "launcher/cli/cli.h"
#include "launcher/cluster/admin.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string cluster = EnvOr("STRATA_CLUSTER", "");
  bool as_json = false;
};

int Do(const Flags& f) {
  if (f.cluster.empty()) return Fail(Error(EINVAL, "--cluster URL (or $STRATA_CLUSTER) is required"));
  auto list = ListNodes(f.cluster);
  if (!list.ok()) return Fail(list.status());
  if (f.as_json) {
    std::printf("%s\n", list->dump(2).c_str());
    return 0;
  }
  std::printf("%-20s %-6s %-9s %-10s %-10s %s\n", "NODE", "LIVE", "CORDONED", "SANDBOXES", "SLOTS", "URL");
  for (const auto& n : *list) {
    const auto load = n.value("load", nlohmann::json::object());
    const auto capacity = n.value("capacity", nlohmann::json::object());
    std::printf("%-20s %-6s %-9s %-10lld %-10lld %s\n", n.value("name", "").c_str(), n.value("live", false) ? "yes" : "no",
                n.value("cordoned", false) ? "yes" : "no", static_cast<long long>(load.value("sandboxes", int64_t{0})),
                static_cast<long long>(capacity.value("slots", int64_t{0})), n.value("url", "").c_str());
  }
  return 0;
}

}  // namespace

void AddNodes(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("nodes", "list the cluster's nodes with their load");
  c->add_option("--cluster", f->cluster, "etcd: URL[,URL...] (default: $STRATA_CLUSTER)");
  c->add_flag("--json", f->as_json, "print JSON");
  c->callback([f, &cli] { cli.exit_code = Do(*f); });
}

}  // namespace strata::launcher::cli
