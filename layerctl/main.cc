// layerctl: build, publish, version, pull, inspect, verify and collect
// layers. Each verb is its own file under cli/.
#include <CLI/CLI.hpp>

#include "layerctl/cli/cli.h"

int main(int argc, char** argv) {
  using namespace strata::layerctl;
  CLI::App app{"layerctl: build, publish, version, pull, inspect, verify and collect layers"};
  app.require_subcommand(1);
  app.fallthrough();
  cli::Cli cli;
  app.add_option("--store", cli.store_url, "store URL (default: $STRATA_STORE, else /var/lib/strata/store)");
  app.add_flag("--json", cli.as_json, "print JSON for scripts");
  for (cli::AddVerb add : {cli::AddBuild, cli::AddPush, cli::AddSettings, cli::AddPull, cli::AddLs, cli::AddInspect,
                           cli::AddVerify, cli::AddTag, cli::AddRm, cli::AddGc}) {
    add(app, cli);
  }
  CLI11_PARSE(app, argc, argv);  // runs the chosen verb's callback, after the global flags
  return cli.exit_code;
}
