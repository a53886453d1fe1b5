// The `launcher` tool's verbs: each lives in its own file (cli/VERB.cc)
// and adds its own subcommand, its flags and what it does, through its
// Add function; main.cc calls them all. What several verbs share — the
// flag groups for a sandbox, a command and a daemon, how a finished
// command becomes an exit code — is here.
#pragma once

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "launcher/api/client.h"
#include "launcher/node/manager.h"
#include "launcher/sandbox/sandbox.h"

namespace strata::launcher::cli {

// What the verbs share while one runs.
struct Cli {
  NodeConfig node;                   // from the environment, with the node's back ends
  std::vector<std::string> command;  // what follows the first `--`
  int exit_code = 0;                 // the chosen verb's
};

// Each verb's Add: its subcommand on `app`, run through `cli`.
using AddVerb = void (*)(CLI::App& app, Cli& cli);
void AddRun(CLI::App&, Cli&);
void AddCreate(CLI::App&, Cli&);
void AddExec(CLI::App&, Cli&);
void AddCp(CLI::App&, Cli&);
void AddNet(CLI::App&, Cli&);
void AddUsage(CLI::App&, Cli&);
void AddPause(CLI::App&, Cli&);
void AddResume(CLI::App&, Cli&);
void AddSnapshot(CLI::App&, Cli&);
void AddDestroy(CLI::App&, Cli&);
void AddWarm(CLI::App&, Cli&);
void AddTemplate(CLI::App&, Cli&);
void AddLs(CLI::App&, Cli&);
void AddServe(CLI::App&, Cli&);
void AddGateway(CLI::App&, Cli&);
void AddCordon(CLI::App&, Cli&);
void AddUncordon(CLI::App&, Cli&);
void AddDrain(CLI::App&, Cli&);
void AddNodes(CLI::App&, Cli&);
void AddToken(CLI::App&, Cli&);
void AddDoctor(CLI::App&, Cli&);

// Prints "launcher: ERROR" and returns 125 (like `docker run`: the
// launcher itself failed, not the command).
int Fail(const Status& s);
// 0, or Fail(s).
int Done(const Status& s);
// A command's output, to our stdout (stream 1) or stderr.
void Print(int stream, std::string_view bytes);
// The exit code of DESIGN.md for a finished command, with the notices
// (cut output, timeout, the OOM killer under a `memory` limit).
int Report(const ExecResult& result, uint64_t cap, uint64_t memory);
// The API's JSON of a sandbox spec and of an exec.
nlohmann::json SpecJson(const SandboxSpec& spec);
nlohmann::json ExecJson(const ExecRequest& request);
// -v: the resolved layers and the sandbox id.
void PrintLayers(const nlohmann::json& info);
// The environment variable `name`, or `fallback` when it is unset.
std::string EnvOr(const char* name, const char* fallback);

// How a client verb reaches the daemon: --socket, --url, --token,
// --token-file, --ca (defaults from $STRATA_URL, $STRATA_TOKEN, $STRATA_CA).
struct ClientFlags {
  std::string socket = EnvOr("STRATA_LAUNCHER_SOCKET", kDefaultLauncherSocket);
  std::string url = EnvOr("STRATA_URL", ""), token = EnvOr("STRATA_TOKEN", ""), ca = EnvOr("STRATA_CA", "");
  std::string token_file;
  void Add(CLI::App* c);
  Result<LauncherClient> Connect() const;
};

// A sandbox's flags (run and create): layers, store, back end, limits,
// network, file rules.
struct SandboxFlags {
  SandboxSpec spec;
  double cpus = 0;
  int64_t pids = 0;
  std::string memory, disk = "10G", net;
  std::vector<std::string> allow, deny, read_only;
  bool verbose = false;
  void Add(CLI::App* c);
  // The spec the flags say, checked; the store is $STRATA_STORE's when
  // none is given (a daemon has its own environment).
  Result<SandboxSpec> Spec() const;
};

// A command's flags: --timeout, --output-cap.
struct ExecFlags {
  std::string timeout, output_cap = "1M";
  void Add(CLI::App* c);
  Status Apply(ExecRequest* request) const;
};

// A verb of one sandbox and nothing else (pause, resume, destroy): ID and
// the client flags, then `call` on the daemon.
void AddSandboxVerb(CLI::App& app, Cli& cli, const char* name, const char* help,
                    Status (LauncherClient::*call)(const std::string& id));

// A daemon's signals (serve, gateway): blocked (every thread it starts
// inherits the mask), then waited for.
sigset_t BlockDaemonSignals();
// Waits for SIGINT or SIGTERM (returned); each SIGHUP rereads the tokens
// (added and revoked tenants take effect at once; sandboxes are not touched).
int WaitForStop(const sigset_t& signals, const std::function<Status()>& reload_tokens, bool have_tokens);

}  // namespace strata::launcher::cli
