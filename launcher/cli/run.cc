// launcher run: one command in a fresh sandbox, removed after; through the
// daemon when one answers, else in this process.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

// SIGINT/SIGTERM/SIGHUP end the sandbox cleanly: `on_signal` runs once.
class SignalWatch {
 public:
  explicit SignalWatch(std::function<void()> on_signal) {
    sigemptyset(&set_);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set_, s);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    std::thread([this, f = std::move(on_signal)] {
      int sig = 0;
      sigwait(&set_, &sig);
      caught_ = sig;
      f();
    }).detach();
  }
  int caught() const { return caught_; }

 private:
  sigset_t set_;
  std::atomic<int> caught_{0};
};

// Without a daemon: everything in this process.
int RunHere(const SandboxSpec& spec, const NodeConfig& node, ExecRequest request, bool verbose) {
  SweepStaleSandboxes(node).IgnoreError();
  std::atomic<Sandbox*> live{nullptr};
  SignalWatch signals([&] {
    if (Sandbox* sb = live.load()) sb->Interrupt();
  });
  auto sandbox = Sandbox::Create(spec, node);
  if (!sandbox.ok()) return signals.caught() ? 128 + signals.caught() : Fail(sandbox.status());
  live = sandbox->get();
  if (signals.caught()) (*sandbox)->Interrupt();
  if (verbose) PrintLayers((*sandbox)->Info());
  const uint64_t cap = request.stdout_cap;
  auto result = (*sandbox)->Exec(std::move(request), Print);
  if (result.ok() && result->signal == SIGKILL && !result->timed_out) result->oom_killed = (*sandbox)->OomKilled();
  live = nullptr;
  Status destroyed = (*sandbox)->Destroy();
  if (!destroyed.ok()) std::fprintf(stderr, "launcher: cleanup: %s\n", destroyed.ToString().c_str());
  if (signals.caught()) return 128 + signals.caught();
  if (!result.ok()) return Fail(result.status());
  return Report(*result, cap, spec.limits.memory);
}

// Through the daemon: create, exec, destroy.
int RunThroughDaemon(LauncherClient& client, const SandboxSpec& spec, const ExecRequest& request, bool verbose) {
  std::atomic<bool> created{false};
  std::string id;
  std::mutex mu;
  SignalWatch signals([&] {
    std::lock_guard lock(mu);
    if (created) client.Destroy(id).IgnoreError();  // ends the exec below
  });
  auto info = client.Create(SpecJson(spec));
  if (!info.ok()) return signals.caught() ? 128 + signals.caught() : Fail(info.status());
  {
    std::lock_guard lock(mu);
    id = (*info)["id"].get<std::string>();
    created = true;
  }
  if (verbose) PrintLayers(*info);
  auto result = signals.caught() ? Result<ExecResult>(Error(EINTR, "interrupted")) : client.Exec(id, ExecJson(request), Print);
  Status destroyed = client.Destroy(id);
  if (!destroyed.ok() && destroyed.code() != ENOENT) std::fprintf(stderr, "launcher: cleanup: %s\n", destroyed.ToString().c_str());
  if (signals.caught()) return 128 + signals.caught();
  if (!result.ok()) return Fail(result.status());
  return Report(*result, request.stdout_cap, spec.limits.memory);
}

struct Flags {
  SandboxFlags sandbox;
  ExecFlags exec;
  ClientFlags client;
  bool no_daemon = false;
};

int Run(const Flags& f, Cli& cli) {
  if (cli.command.empty()) return Fail(Error(EINVAL, "run: no command given (launcher run [options] -- CMD [ARG ...])"));
  auto spec = f.sandbox.Spec();
  if (!spec.ok()) return Fail(spec.status());
  ExecRequest request;
  if (Status s = f.exec.Apply(&request); !s.ok()) return Fail(s);
  request.argv = cli.command;
  request.env = spec->env;
  request.cwd = spec->workdir;
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  if (!f.no_daemon && client->Alive()) return RunThroughDaemon(*client, *spec, request, f.sandbox.verbose);
  if (!f.client.url.empty() && !f.no_daemon) return Fail(Error(ECONNREFUSED, "run: no daemon answers at " + f.client.url));
  // Here, as root on this machine, a runtime may also be a path of one's own.
  if (spec->runtime.find('/') != std::string::npos) cli.node.runtime = spec->runtime;
  return RunHere(*spec, cli.node, request, f.sandbox.verbose);
}

}  // namespace

void AddRun(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("run", "run one command in a fresh sandbox and remove it");
  f->sandbox.Add(c);
  f->exec.Add(c);
  f->client.Add(c);
  c->add_flag("--no-daemon", f->no_daemon, "do everything in this process even when a daemon listens");
  c->footer("Command: launcher run [options] -- CMD [ARG ...]");
  c->callback([f, &cli] { cli.exit_code = Run(*f, cli); });
}

}  // namespace strata::launcher::cli
