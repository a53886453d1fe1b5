// launcher: compose layers and run sandboxes.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <thread>

#include "common/log.h"
#include "common/strings.h"
#include "common/units.h"
#include "launcher/doctor.h"
#include "launcher/sandbox.h"

namespace {

using namespace strata;
using namespace strata::launcher;

int Fail(const Status& s) {
  std::fprintf(stderr, "launcher: %s\n", s.ToString().c_str());
  return 125;  // like `docker run`: the launcher itself failed, not the command
}

void WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

int Run(const SandboxSpec& spec, const NodeConfig& node, ExecRequest request, bool verbose) {
  const uint64_t cap = request.stdout_cap;
  SweepStaleSandboxes(node).IgnoreError();
  // SIGINT/SIGTERM end the sandbox (and everything in it) cleanly.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  std::atomic<int> caught{0};
  std::atomic<Sandbox*> live{nullptr};
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    caught = sig;
    if (Sandbox* sb = live.load()) sb->Interrupt();
  });
  watcher.detach();

  auto sandbox = Sandbox::Create(spec, node);
  if (!sandbox.ok()) return caught ? 128 + caught : Fail(sandbox.status());
  live = sandbox->get();
  if (caught) (*sandbox)->Interrupt();
  if (verbose) {
    for (const auto& l : (*sandbox)->layers()) {
      std::fprintf(stderr, "launcher: layer %s %s %s\n", l.digest.Hex().c_str(),
                   std::string(cache::LayerKindName(l.manifest.kind)).c_str(), l.manifest.name.c_str());
    }
    std::fprintf(stderr, "launcher: sandbox %s\n", (*sandbox)->id().c_str());
  }
  auto result = (*sandbox)->Exec(std::move(request), [](int stream, std::string_view bytes) {
    WriteAll(stream == 1 ? STDOUT_FILENO : STDERR_FILENO, bytes);
  });
  bool oom = result.ok() && result->signal == SIGKILL && !result->timed_out && (*sandbox)->OomKilled();
  live = nullptr;
  Status destroyed = (*sandbox)->Destroy();
  if (!destroyed.ok()) std::fprintf(stderr, "launcher: cleanup: %s\n", destroyed.ToString().c_str());
  if (caught) return 128 + caught;
  if (!result.ok()) return Fail(result.status());
  if (result->stdout_truncated) {
    std::fprintf(stderr, "launcher: stdout cut at %s (the command wrote %s)\n", FormatBytes(cap).c_str(),
                 FormatBytes(result->stdout_bytes).c_str());
  }
  if (result->stderr_truncated) {
    std::fprintf(stderr, "launcher: stderr cut at %s (the command wrote %s)\n", FormatBytes(cap).c_str(),
                 FormatBytes(result->stderr_bytes).c_str());
  }
  if (result->timed_out) {
    std::fprintf(stderr, "launcher: timed out; the command and everything it started were killed\n");
    return 124;
  }
  if (oom) {
    std::fprintf(stderr, "launcher: out of memory (limit %s): the kernel killed the command\n",
                 FormatBytes(spec.limits.memory).c_str());
    return 137;
  }
  if (result->signal) return 128 + result->signal;
  return result->exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  SetLogTag("launcher");
  CLI::App app{"launcher: compose layers into sandboxes and run commands in them"};
  app.require_subcommand(1);

  NodeConfig node = NodeConfig::FromEnvironment();
  SandboxSpec spec;
  ExecRequest request;
  std::string memory, disk = "10G", timeout, runtime, net = "none", output_cap = "1M";
  double cpus = 0;
  int64_t pids = 0;
  bool verbose = false;
  std::vector<std::string> command;

  auto* run = app.add_subcommand("run", "run one command in a fresh sandbox and remove it");
  run->add_option("--store", spec.store, "store URL (default: $STRATA_STORE, else /var/lib/strata/store)");
  run->add_option("--layer", spec.layers, "layer REF, bottom first (a diff alone brings its parents)")->required();
  run->add_option("--cpus", cpus, "CPU quota in cores (shares follow)");
  run->add_option("--memory", memory, "memory limit, e.g. 512M");
  run->add_option("--pids", pids, "process limit");
  run->add_option("--disk", disk, "size cap of the writable layer")->capture_default_str();
  run->add_option("--timeout", timeout, "kill the command (and all it started) after this long: exit 124");
  run->add_option("--env", spec.env, "K=V for the command");
  run->add_option("--workdir", spec.workdir, "working directory of the command")->capture_default_str();
  run->add_option("--net", net, "none (loopback only) or host")->capture_default_str();
  run->add_option("--runtime", runtime, "OCI runtime (default crun, or $STRATA_RUNTIME)");
  run->add_option("--output-cap", output_cap, "bytes kept of each of stdout and stderr")->capture_default_str();
  run->add_flag("-v,--verbose", verbose, "print the resolved layer digests and the sandbox id");
  run->footer("Command: launcher run [options] -- CMD [ARG ...]");

  auto* doctor = app.add_subcommand("doctor", "check (and with --fix repair) what sandboxes need");
  bool fix = false;
  std::string uppers_size = "64G";
  doctor->add_flag("--fix", fix, "repair what can be repaired safely");
  doctor->add_option("--uppers-size", uppers_size, "size of the loop-file btrfs --fix creates for uppers")->capture_default_str();
  // Everything after the first `--` is the command, untouched by option parsing.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      command.assign(argv + i + 1, argv + argc);
      argc = i;
      break;
    }
  }
  CLI11_PARSE(app, argc, argv);

  if (doctor->parsed()) {
    DoctorOptions options;
    options.fix = fix;
    auto size = ParseSize(uppers_size);
    if (!size.ok()) return Fail(size.status());
    options.uppers_size = *size;
    bool all_ok = true;
    for (const auto& c : RunDoctor(node, options)) {
      std::printf("%-7s %-32s %s\n", c.fixed ? "fixed" : (c.ok ? "ok" : "FAIL"), c.name.c_str(), c.detail.c_str());
      all_ok &= c.ok;
    }
    if (fix) SweepStaleSandboxes(node).IgnoreError();
    return all_ok ? 0 : 1;
  }

  if (!runtime.empty()) node.runtime = runtime;
  if (net != "none" && net != "host") return Fail(Error(EINVAL, "--net: expected none or host, got " + Quote(net)));
  spec.host_network = net == "host";
  spec.limits.cpus = cpus;
  spec.limits.pids = pids;
  if (!memory.empty()) {
    auto m = ParseSize(memory);
    if (!m.ok()) return Fail(m.status().Annotate("--memory"));
    spec.limits.memory = *m;
  }
  auto d = ParseSize(disk);
  if (!d.ok()) return Fail(d.status().Annotate("--disk"));
  spec.disk = *d;
  auto cap = ParseSize(output_cap);
  if (!cap.ok()) return Fail(cap.status().Annotate("--output-cap"));
  request.stdout_cap = request.stderr_cap = *cap;
  if (!timeout.empty()) {
    auto t = ParseDuration(timeout);
    if (!t.ok()) return Fail(t.status().Annotate("--timeout"));
    request.timeout = *t;
  }
  if (command.empty()) return Fail(Error(EINVAL, "run: no command given (launcher run [options] -- CMD [ARG ...])"));
  request.argv = command;
  request.env = spec.env;
  request.cwd = spec.workdir;
  return Run(spec, node, request, verbose);
}
