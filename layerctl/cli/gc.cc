// layerctl gc: delete what no tag or lease reaches, after a grace period.
#include <chrono>
#include <iostream>
#include <memory>

#include "common/strings.h"
#include "common/units.h"
#include "layerctl/cli/cli.h"
#include "layerctl/gc.h"

namespace strata::layerctl::cli {
namespace {

using nlohmann::json;

struct Flags {
  std::string grace = "24h";
  bool dry_run = false;
};

int Collect(const Flags& f, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto grace = ParseDuration(f.grace);
  if (!grace.ok()) return Fail(grace.status());
  GcOptions options;
  options.grace_seconds = std::chrono::duration_cast<std::chrono::seconds>(*grace).count();
  options.dry_run = f.dry_run;
  auto report = CollectGarbage(*catalog, options);
  if (!report.ok()) return Fail(report.status());
  if (cli.as_json) {
    std::cout << json{{"reachable_layers", report->reachable_layers}, {"leased_layers", report->leased_layers},
                      {"objects_scanned", report->objects_scanned}, {"newly_unreachable", report->newly_unreachable},
                      {"waiting", report->waiting}, {"deleted", report->deleted},
                      {"bytes_deleted", report->bytes_deleted}, {"would_delete", report->deleted_keys}}.dump()
              << "\n";
  } else {
    for (const auto& k : report->deleted_keys) std::cout << "would delete " << k << "\n";
    std::cout << report->reachable_layers << " layers reachable (" << report->leased_layers << " leased), "
              << report->objects_scanned << " objects scanned, " << report->deleted << " deleted ("
              << FormatBytes(report->bytes_deleted) << "), " << report->waiting << " unreachable within the grace period\n";
  }
  return 0;
}

}  // namespace

void AddGc(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("gc", "delete what no tag or lease reaches, after a grace period");
  c->add_option("--grace", f->grace, "how long an object must have been unreachable")->capture_default_str();
  c->add_flag("--dry-run", f->dry_run, "only report");
  c->callback([f, &cli] { cli.exit_code = Collect(*f, cli); });
}

}  // namespace strata::layerctl::cli
