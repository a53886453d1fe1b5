// launcher: compose layers into sandboxes and run commands in them; the
// node daemon, the cluster's gateway and their client verbs. Each verb is
// its own file under cli/.
#include <CLI/CLI.hpp>
#include <string_view>

#include "common/log.h"
#include "launcher/backends/node_backends.h"
#include "launcher/cli/cli.h"

int main(int argc, char** argv) {
  using namespace strata::launcher;
  strata::SetLogTag("launcher");
  CLI::App app{"launcher: compose layers into sandboxes and run commands in them"};
  app.require_subcommand(1);
  cli::Cli cli;
  cli.node = NodeConfig::FromEnvironment();
  cli.node.backends = NodeBackends();
  for (cli::AddVerb add : {cli::AddRun, cli::AddDoctor, cli::AddServe, cli::AddGateway, cli::AddCordon, cli::AddUncordon,
                           cli::AddDrain, cli::AddNodes, cli::AddToken, cli::AddCreate, cli::AddNet, cli::AddUsage, cli::AddExec, cli::AddCp,
                           cli::AddPause, cli::AddResume, cli::AddSnapshot, cli::AddDestroy, cli::AddWarm, cli::AddTemplate, cli::AddLs}) {
    add(app, cli);
  }
  // Everything after the first `--` is the command, untouched by option parsing.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      cli.command.assign(argv + i + 1, argv + argc);
      argc = i;
      break;
    }
  }
  CLI11_PARSE(app, argc, argv);  // runs the chosen verb's callback
  return cli.exit_code;
}
