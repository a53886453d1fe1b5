// What the launcher's verbs share.
#include "launcher/cli/cli.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "common/fs.h"
#include "common/strings.h"
#include "common/units.h"

namespace strata::launcher::cli {

using nlohmann::json;

int Fail(const Status& s) {
  std::fprintf(stderr, "launcher: %s\n", s.ToString().c_str());
  return 125;
}

int Done(const Status& s) { return s.ok() ? 0 : Fail(s); }

void Print(int stream, std::string_view bytes) {
  WriteFull(stream == 1 ? STDOUT_FILENO : STDERR_FILENO, bytes).IgnoreError();  // a closed pipe: nobody reads on
}

int Report(const ExecResult& r, uint64_t cap, uint64_t memory) {
  if (r.stdout_truncated) {
    std::fprintf(stderr, "launcher: stdout cut at %s (the command wrote %s)\n", FormatBytes(cap).c_str(), FormatBytes(r.stdout_bytes).c_str());
  }
  if (r.stderr_truncated) {
    std::fprintf(stderr, "launcher: stderr cut at %s (the command wrote %s)\n", FormatBytes(cap).c_str(), FormatBytes(r.stderr_bytes).c_str());
  }
  if (r.timed_out) {
    std::fprintf(stderr, "launcher: timed out; the command and everything it started were killed\n");
    return 124;
  }
  if (r.oom_killed) {
    std::fprintf(stderr, "launcher: out of memory (limit %s): the kernel killed the command\n",
                 memory ? FormatBytes(memory).c_str() : "none set");
    return 137;
  }
  if (r.signal) return 128 + r.signal;
  return r.exit_code;
}

json SpecJson(const SandboxSpec& s) {
  return {{"layers", s.layers}, {"store", s.store}, {"backend", s.backend}, {"cpus", s.limits.cpus},
          {"memory", s.limits.memory}, {"pids", s.limits.pids}, {"disk", s.disk},
          {"network", s.network.ToJson()}, {"env", s.env}, {"workdir", s.workdir}, {"files", s.files.ToJson()},
          {"kill_leftovers", s.kill_leftovers}, {"runtime", s.runtime}};
}

json ExecJson(const ExecRequest& r) {
  json j = {{"argv", r.argv}, {"env", r.env}, {"cwd", r.cwd}, {"output_cap", r.stdout_cap},
            {"timeout", std::chrono::duration<double>(r.timeout).count()}};
  if (r.stdin_data) j["stdin"] = Base64Encode(*r.stdin_data);
  if (!r.files.empty()) j["files"] = r.files.ToJson();
  if (r.grader) j["role"] = "grader";
  if (r.kill_leftovers) j["kill_leftovers"] = *r.kill_leftovers;
  return j;
}

void PrintLayers(const json& info) {
  for (const auto& l : info.value("layers", json::array())) {
    std::fprintf(stderr, "launcher: layer %s %s %s\n", l.value("digest", "").c_str(), l.value("kind", "").c_str(),
                 l.value("name", "").c_str());
  }
  std::fprintf(stderr, "launcher: sandbox %s\n", info.value("id", "").c_str());
}

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void ClientFlags::Add(CLI::App* c) {
  c->add_option("--socket", socket, "launcher daemon socket (the default daemon)")->capture_default_str();
  c->add_option("--url", url, "daemon: http(s)://HOST:PORT or unix:///PATH (default: $STRATA_URL, else --socket)");
  c->add_option("--token", token, "API token (default: $STRATA_TOKEN)");
  c->add_option("--token-file", token_file, "file holding the API token");
  c->add_option("--ca", ca, "PEM of the CA that signed an https daemon's certificate (default: $STRATA_CA)");
}

Result<LauncherClient> ClientFlags::Connect() const {
  std::string t = token;
  if (!token_file.empty()) {
    auto read = ReadFileToString(token_file);
    if (!read.ok()) return read.status().Annotate("--token-file");
    t = read->substr(0, read->find('\n'));
    while (!t.empty() && (t.back() == '\r' || t.back() == ' ')) t.pop_back();
  }
  return LauncherClient(DaemonAddress{url.empty() ? "unix://" + socket : url, t, ca});
}

void SandboxFlags::Add(CLI::App* c) {
  c->add_option("--store", spec.store, "store URL (default: $STRATA_STORE, else /var/lib/strata/store)");
  c->add_option("--layer", spec.layers, "layer REF, bottom first (a diff alone brings its parents)")->required();
  c->add_option("--backend", spec.backend, "container, fncall or microvm")->capture_default_str();
  c->add_option("--cpus", cpus, "CPU quota in cores (shares follow)");
  c->add_option("--memory", memory, "memory limit, e.g. 512M");
  c->add_option("--pids", pids, "process limit");
  c->add_option("--disk", disk, "size cap of the writable layer")->capture_default_str();
  c->add_option("--net", net, "none (loopback only, the default), allow (only --allow), open (public addresses), host");
  c->add_option("--allow", allow, "with --net allow: DOMAIN, *.DOMAIN, ADDR or CIDR, each with an optional :PORT (repeatable)");
  c->add_option("--runtime", spec.runtime, "OCI runtime of a container or fncall sandbox, one the node offers: crun (the default, or $STRATA_RUNTIME) or runc");
  c->add_option("--env", spec.env, "K=V for commands");
  c->add_option("--workdir", spec.workdir, "working directory of commands")->capture_default_str();
  c->add_option("--deny", deny, "PATH no command but the grader's may read, list, write or run (repeatable)");
  c->add_flag("--kill-leftovers", spec.kill_leftovers, "by default, kill what each command leaves running when it ends");
  c->add_option("--read-only", read_only, "PATH no command but the grader's may change (repeatable)");
  c->add_flag("-v,--verbose", verbose, "print the resolved layer digests and the sandbox id");
}

Result<SandboxSpec> SandboxFlags::Spec() const {
  SandboxSpec s = spec;
  auto policy = NetPolicy::FromFlags(net, allow);
  if (!policy.ok()) return policy.status().Annotate("--net/--allow");
  s.network = *policy;
  if (!deny.empty() || !read_only.empty()) {
    STRATA_ASSIGN_OR_RETURN(s.files, MakeFileRules(deny, read_only, "--deny/--read-only"));
  }
  s.limits.cpus = cpus;
  s.limits.pids = pids;
  if (!memory.empty()) {
    auto m = ParseSize(memory);
    if (!m.ok()) return m.status().Annotate("--memory");
    s.limits.memory = *m;
  }
  auto d = ParseSize(disk);
  if (!d.ok()) return d.status().Annotate("--disk");
  s.disk = *d;
  if (s.store.empty()) s.store = EnvOr("STRATA_STORE", "");
  return s;
}

void ExecFlags::Add(CLI::App* c) {
  c->add_option("--timeout", timeout, "kill the command (and all it started) after this long: exit 124");
  c->add_option("--output-cap", output_cap, "bytes kept of each of stdout and stderr")->capture_default_str();
}

Status ExecFlags::Apply(ExecRequest* request) const {
  auto cap = ParseSize(output_cap);
  if (!cap.ok()) return cap.status().Annotate("--output-cap");
  request->stdout_cap = request->stderr_cap = *cap;
  if (!timeout.empty()) {
    auto t = ParseDuration(timeout);
    if (!t.ok()) return t.status().Annotate("--timeout");
    request->timeout = *t;
  }
  return OkStatus();
}

void AddSandboxVerb(CLI::App& app, Cli& cli, const char* name, const char* help,
                    Status (LauncherClient::*call)(const std::string& id)) {
  struct Flags {
    std::string id;
    ClientFlags client;
  };
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand(name, help);
  c->add_option("ID", f->id)->required();
  f->client.Add(c);
  c->callback([f, call, &cli] {
    auto client = f->client.Connect();
    cli.exit_code = client.ok() ? Done(((*client).*call)(f->id)) : Fail(client.status());
  });
}

sigset_t BlockDaemonSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

int WaitForStop(const sigset_t& signals, const std::function<Status()>& reload_tokens, bool have_tokens) {
  int sig = 0;
  while (true) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) return sig;
    Status s = reload_tokens();
    if (!s.ok()) std::fprintf(stderr, "launcher: SIGHUP: %s\n", s.ToString().c_str());
    else std::fprintf(stderr, "launcher: SIGHUP: %s\n", have_tokens ? "tokens reread" : "no tokens file to reread");
  }
}

}  // namespace strata::launcher::cli
