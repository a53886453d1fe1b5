// launcher resume: thaw a paused sandbox.
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {

void AddResume(CLI::App& app, Cli& cli) { AddSandboxVerb(app, cli, "resume", "thaw a paused sandbox", &LauncherClient::Resume); }

}  // namespace strata::launcher::cli
