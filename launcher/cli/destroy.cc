// launcher destroy: remove a sandbox and everything it made.
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {

void AddDestroy(CLI::App& app, Cli& cli) { AddSandboxVerb(app, cli, "destroy", "remove a sandbox and everything it made", &LauncherClient::Destroy); }

}  // namespace strata::launcher::cli
