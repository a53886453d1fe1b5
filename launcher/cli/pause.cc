// launcher pause: freeze every process of a sandbox.
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {

void AddPause(CLI::App& app, Cli& cli) { AddSandboxVerb(app, cli, "pause", "freeze every process of a sandbox", &LauncherClient::Pause); }

}  // namespace strata::launcher::cli
