// launcher: compose layers into sandboxes and run commands in them; the
// node daemon and its client verbs.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <functional>
#include <iostream>
#include <thread>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/units.h"
#include "launcher/api/client.h"
#include "launcher/backends/doctor.h"
#include "launcher/backends/node_backends.h"
#include "launcher/node/manager.h"
#include "launcher/sandbox/sandbox.h"
#include "launcher/api/server.h"
#include "launcher/node/node_cgroup.h"
#include "launcher/front/tenants.h"
#include "launcher/cluster/admin.h"
#include "launcher/cluster/gateway.h"
#include "launcher/cluster/node_registration.h"
#include "launcher/node/node_claims.h"
#include "common/crypto.h"

namespace {

using namespace strata;
using namespace strata::launcher;
using nlohmann::json;

int Fail(const Status& s) {
  std::fprintf(stderr, "launcher: %s\n", s.ToString().c_str());
  return 125;  // like `docker run`: the launcher itself failed, not the command
}

void Print(int stream, std::string_view bytes) {
  WriteFull(stream == 1 ? STDOUT_FILENO : STDERR_FILENO, bytes).IgnoreError();  // a closed pipe: nobody reads on
}

// The exit code of DESIGN.md for a finished command, with the notices.
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
          {"kill_leftovers", s.kill_leftovers}};
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

// `launcher run` without a daemon: everything in this process.
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

// `launcher run` through the daemon: create, exec, destroy.
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

// A daemon's signals: blocked here (so every thread it starts inherits
// the mask), then waited for by WaitForStop.
sigset_t BlockDaemonSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

// Waits for SIGINT or SIGTERM (returned); each SIGHUP rereads the tokens
// (added and revoked tenants take effect at once; sandboxes are not touched).
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

int Serve(const ServeOptions& options, const ClusterOptions& cluster, const NodeConfig& node) {
  const sigset_t signals = BlockDaemonSignals();
  if (Status placed = PlaceNodeProcesses(node.cgroup_parent); !placed.ok()) {
    std::fprintf(stderr, "launcher: warning: %s\n", placed.ToString().c_str());
  }
  if (options.memory_capacity > 0) {
    if (Status capped = LimitSandboxMemory(node.cgroup_parent, options.memory_capacity); !capped.ok()) return Fail(capped);
  }
  // Before anything is touched: another daemon of this host given one of
  // our settings by mistake would have its sandboxes removed by our recovery.
  auto claims = ClaimDaemonSettings(node, options.state_dir, options.socket_path);
  if (!claims.ok()) return Fail(claims.status().Annotate("serve"));
  SweepStaleSandboxes(node).IgnoreError();
  auto manager = SandboxManager::Open(node, options.state_dir);
  if (!manager.ok()) return Fail(manager.status());
  const auto& recovery = (*manager)->recovery();
  if (recovery.moved > 0) {
    std::fprintf(stderr, "launcher: moved %d records of an older daemon into this boot's registry\n", recovery.moved);
  }
  std::fprintf(stderr, "launcher: re-adopted %d sandboxes, removed %d\n", recovery.adopted, recovery.removed);
  std::vector<std::string> warnings;
  auto server = LauncherServer::Start(options, **manager, &warnings);
  if (!server.ok()) return Fail(server.status());
  std::unique_ptr<NodeRegistration> registration;
  if (!cluster.endpoints.empty()) {
    auto registered = NodeRegistration::Start(cluster, **server);
    if (!registered.ok()) return Fail(registered.status());
    registration = std::move(*registered);
  }
  for (const auto& w : warnings) std::fprintf(stderr, "launcher: WARNING: %s\n", w.c_str());
  for (const auto& url : (*server)->urls()) std::fprintf(stderr, "launcher: serving on %s\n", url.c_str());
  const int sig = WaitForStop(signals, [&] { return (*server)->ReloadTokens(); },
                              !options.tokens_file.empty() || !options.legacy_token_file.empty());
  std::fprintf(stderr, "launcher: signal %d: stopping (sandboxes keep running; a restart re-adopts them)\n", sig);
  registration.reset();  // (the node leaves the cluster before it stops answering)
  server->reset();
  return 0;
}

int RunGateway(GatewayOptions options) {
  const sigset_t signals = BlockDaemonSignals();
  const bool have_tokens = !options.tokens_file.empty();
  std::vector<std::string> warnings;
  auto gateway = Gateway::Start(std::move(options), &warnings);
  if (!gateway.ok()) return Fail(gateway.status());
  for (const auto& w : warnings) std::fprintf(stderr, "launcher: WARNING: %s\n", w.c_str());
  for (const auto& url : (*gateway)->urls()) std::fprintf(stderr, "launcher: gateway serving on %s\n", url.c_str());
  const int sig = WaitForStop(signals, [&] { return (*gateway)->ReloadTokens(); }, have_tokens);
  std::fprintf(stderr, "launcher: signal %d: gateway stopping\n", sig);
  gateway->reset();
  return 0;
}

// "K=V" flags into a map.
Result<std::map<std::string, std::string>> ParseLabels(const std::vector<std::string>& flags, const char* flag) {
  std::map<std::string, std::string> labels;
  for (const auto& f : flags) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || eq == 0) return Error(EINVAL, StrCat(flag, " ", Quote(f), ": expected KEY=VALUE"));
    labels[f.substr(0, eq)] = f.substr(eq + 1);
  }
  return labels;
}

// "ID:/path" -> (id, path); a plain path -> ("", path).
std::pair<std::string, std::string> SplitCopyArg(const std::string& arg) {
  size_t colon = arg.find(':');
  if (colon != std::string::npos && arg.starts_with("sb-")) return {arg.substr(0, colon), arg.substr(colon + 1)};
  return {"", arg};
}

}  // namespace

int main(int argc, char** argv) {
  SetLogTag("launcher");
  CLI::App app{"launcher: compose layers into sandboxes and run commands in them"};
  app.require_subcommand(1);

  NodeConfig node = NodeConfig::FromEnvironment();
  node.backends = NodeBackends();
  SandboxSpec spec;
  ExecRequest request;
  std::vector<std::string> allow, deny, read_only;
  std::string role = "agent";
  bool include_denied = false, kill_leftovers = false, keep_leftovers = false;
  std::string memory, disk = "10G", timeout, runtime, net, output_cap = "1M", token_file;
  auto env_or = [](const char* name, const char* fallback) { return std::string(std::getenv(name) ? std::getenv(name) : fallback); };
  std::string socket = env_or("STRATA_LAUNCHER_SOCKET", kDefaultLauncherSocket);
  std::string url = env_or("STRATA_URL", ""), token = env_or("STRATA_TOKEN", ""), ca = env_or("STRATA_CA", "");
  double cpus = 0;
  int64_t pids = 0;
  bool verbose = false, with_stdin = false, as_json = false, no_daemon = false;
  std::vector<std::string> command;

  auto sandbox_flags = [&](CLI::App* c) {
    c->add_option("--store", spec.store, "store URL (default: $STRATA_STORE, else /var/lib/strata/store)");
    c->add_option("--layer", spec.layers, "layer REF, bottom first (a diff alone brings its parents)")->required();
    c->add_option("--backend", spec.backend, "container, fncall or microvm")->capture_default_str();
    c->add_option("--cpus", cpus, "CPU quota in cores (shares follow)");
    c->add_option("--memory", memory, "memory limit, e.g. 512M");
    c->add_option("--pids", pids, "process limit");
    c->add_option("--disk", disk, "size cap of the writable layer")->capture_default_str();
    c->add_option("--net", net, "none (loopback only, the default), allow (only --allow), open (public addresses), host");
    c->add_option("--allow", allow, "with --net allow: DOMAIN, *.DOMAIN, ADDR or CIDR, each with an optional :PORT (repeatable)");
    c->add_option("--runtime", runtime, "OCI runtime (default crun, or $STRATA_RUNTIME)");
    c->add_option("--env", spec.env, "K=V for commands");
    c->add_option("--workdir", spec.workdir, "working directory of commands")->capture_default_str();
    c->add_option("--deny", deny, "PATH no command but the grader's may read, list, write or run (repeatable)");
    c->add_flag("--kill-leftovers", spec.kill_leftovers, "by default, kill what each command leaves running when it ends");
    c->add_option("--read-only", read_only, "PATH no command but the grader's may change (repeatable)");
    c->add_flag("-v,--verbose", verbose, "print the resolved layer digests and the sandbox id");
  };
  auto exec_flags = [&](CLI::App* c) {
    c->add_option("--timeout", timeout, "kill the command (and all it started) after this long: exit 124");
    c->add_option("--output-cap", output_cap, "bytes kept of each of stdout and stderr")->capture_default_str();
  };
  auto client_flags = [&](CLI::App* c) {
    c->add_option("--socket", socket, "launcher daemon socket (the default daemon)")->capture_default_str();
    c->add_option("--url", url, "daemon: http(s)://HOST:PORT or unix:///PATH (default: $STRATA_URL, else --socket)");
    c->add_option("--token", token, "API token (default: $STRATA_TOKEN)");
    c->add_option("--token-file", token_file, "file holding the API token");
    c->add_option("--ca", ca, "PEM of the CA that signed an https daemon's certificate (default: $STRATA_CA)");
  };

  auto* run = app.add_subcommand("run", "run one command in a fresh sandbox and remove it");
  sandbox_flags(run);
  exec_flags(run);
  client_flags(run);
  run->add_flag("--no-daemon", no_daemon, "do everything in this process even when a daemon listens");
  run->footer("Command: launcher run [options] -- CMD [ARG ...]");

  auto* doctor = app.add_subcommand("doctor", "check (and with --fix repair) what sandboxes need");
  bool fix = false;
  std::string uppers_size = "64G";
  doctor->add_flag("--fix", fix, "repair what can be repaired safely");
  doctor->add_option("--uppers-size", uppers_size, "size of the loop-file btrfs --fix creates for uppers")->capture_default_str();

  ServeOptions serve_options;
  ClusterOptions cluster_options;
  auto* serve = app.add_subcommand("serve", "run the node daemon (API on a unix socket) in the foreground");
  serve->add_option("--socket", serve_options.socket_path, "socket")->capture_default_str();
  serve->add_option("--kernel", node.vm_kernel, "microVMs' guest kernel, an uncompressed vmlinux (STRATA_VM_KERNEL)")
      ->capture_default_str();
  serve->add_option("--vm-templates", node.vm_templates,
                    "saved states of booted microVMs kept, one per stack and shape, to resume instead of boot; 0: off "
                    "(STRATA_VM_TEMPLATES)")
      ->capture_default_str();
  serve->add_option("--state", serve_options.state_dir, "state directory (LMDB registry)")->capture_default_str();
  serve->add_option("--allow-group", serve_options.allow_group, "also allow members of this group (as the operator)");
  serve->add_option("--tokens", serve_options.tokens_file, "tenants and their token hashes (launcher token new)");
  serve->add_option("--token-file", serve_options.legacy_token_file, "old single-token file (read as the tenant \"default\")");
  serve->add_option("--listen", serve_options.listen, "also serve on TCP HOST:PORT (repeatable)");
  serve->add_option("--tls-cert", serve_options.tls_cert_file, "PEM certificate (chain) for the TCP listeners");
  serve->add_option("--tls-key", serve_options.tls_key_file, "PEM private key for the TCP listeners");
  serve->add_flag("--insecure", serve_options.insecure, "allow TCP without tokens, or off loopback without TLS");
  serve->add_option("--store", serve_options.stores, "a store sandboxes may use (repeatable; the first is the default)");
  serve->add_option("--max-sandboxes", serve_options.max_sandboxes, "refuse creations beyond this many sandboxes (503)");
  std::string memory_reserve, idle_timeout = "60s", request_timeout = "10s", max_body = "16M", max_upload = "4G";
  serve->add_option("--memory-reserve", memory_reserve, "refuse creations while MemAvailable is below this (503)");
  std::string memory_capacity, disk_reserve;
  serve->add_option("--memory-capacity", memory_capacity,
                    "memory the node gives sandboxes: their parent cgroup is capped at it, and creations whose limits would pass it are refused (503)");
  serve->add_option("--disk-reserve", disk_reserve, "refuse creations while the uppers filesystem has less free (503)");
  serve->add_option("--max-connections", serve_options.tcp_limits.max_connections, "TCP connections in all")->capture_default_str();
  serve->add_option("--max-connections-per-client", serve_options.tcp_limits.max_per_client,
                    "TCP connections from one address")->capture_default_str();
  serve->add_option("--idle-timeout", idle_timeout, "close a TCP connection idle this long")->capture_default_str();
  serve->add_option("--request-timeout", request_timeout, "a request's first line to its last byte (uploads excepted)")->capture_default_str();
  serve->add_option("--max-body", max_body, "largest request body (uploads excepted)")->capture_default_str();
  serve->add_option("--max-upload", max_upload, "largest file upload")->capture_default_str();

  std::string net_pool = "10.213.0.0/16", dns_upstream;
  std::vector<std::string> allow_private;
  uint32_t dns_grace = 5;
  size_t net_warm = 4;
  serve->add_option("--net-warm", net_warm, "sandbox network namespaces kept ready (0: made on create)")->capture_default_str();
  serve->add_option("--net-pool", net_pool, "addresses of sandbox networks (.1 is their gateway and DNS proxy)")->capture_default_str();
  serve->add_option("--dns-upstream", dns_upstream, "resolver for sandboxes' admitted names, ADDR[:PORT] (default: /etc/resolv.conf's)");
  serve->add_option("--dns-grace", dns_grace, "seconds a resolved address stays admitted past its TTL")->capture_default_str();
  serve->add_option("--allow-private", allow_private, "a private range (CIDR) sandbox networks may reach (repeatable)");
  std::vector<std::string> labels;
  serve->add_option("--node", node.name, "this node's name in a cluster (1-20 of a-z 0-9 -); sandbox ids carry it");
  serve->add_option("--cluster", cluster_options.endpoints, "register in this etcd cluster: URL[,URL...]");
  serve->add_option("--etcd-ca", cluster_options.etcd_ca, "PEM of the CAs of https etcd endpoints");
  serve->add_option("--label", labels, "K=V the gateways place by (repeatable), e.g. pool=main");
  serve->add_option("--advertise", cluster_options.advertise, "the API URL gateways use (default: the first --listen's)");
  serve->add_option("--lease", cluster_options.lease_seconds, "seconds before a silent node is lost (2-10)")->capture_default_str();

  GatewayOptions gateway_options;
  std::string overflow = "pool=cloud", create_deadline = "30s";
  auto* gateway = app.add_subcommand("gateway", "run a cluster gateway (the node API for every node in etcd) in the foreground");
  gateway->add_option("--cluster", gateway_options.cluster, "etcd: URL[,URL...]")->required();
  gateway->add_option("--etcd-ca", gateway_options.etcd_ca, "PEM of the CAs of https etcd endpoints");
  gateway->add_option("--listen", gateway_options.listen, "serve on TCP HOST:PORT (repeatable)")->required();
  gateway->add_option("--tls-cert", gateway_options.tls_cert_file, "PEM certificate (chain)");
  gateway->add_option("--tls-key", gateway_options.tls_key_file, "PEM private key");
  gateway->add_option("--tokens", gateway_options.tokens_file, "tenants and their token hashes (the nodes' tokens file)");
  gateway->add_flag("--insecure", gateway_options.insecure, "allow no tokens (every caller is the operator) or plain TCP off loopback");
  gateway->add_option("--node-token", gateway_options.node_token_file, "file holding this gateway's credential on the nodes")->required();
  gateway->add_option("--node-ca", gateway_options.node_ca_file, "PEM of the CAs of the nodes' certificates");
  gateway->add_option("--overflow", overflow, "K=V of the overflow pool's nodes")->capture_default_str();
  gateway->add_option("--overflow-threshold", gateway_options.policy.overflow_threshold,
                      "main-pool utilisation above which the overflow pool gets work")->capture_default_str();
  gateway->add_option("--sample", gateway_options.policy.sample, "nodes compared per placement")->capture_default_str();
  gateway->add_option("--create-deadline", create_deadline, "how long a create tries nodes")->capture_default_str();

  std::string cluster_url = env_or("STRATA_CLUSTER", ""), drain_timeout = "10m", node_name;
  auto* cordon = app.add_subcommand("cordon", "give a cluster node no new sandboxes");
  auto* uncordon = app.add_subcommand("uncordon", "let a cordoned node take sandboxes again");
  auto* drain = app.add_subcommand("drain", "cordon a node and wait until its sandboxes are gone");
  auto* nodes = app.add_subcommand("nodes", "list the cluster's nodes with their load");
  for (auto* c : {cordon, uncordon, drain, nodes}) {
    c->add_option("--cluster", cluster_url, "etcd: URL[,URL...] (default: $STRATA_CLUSTER)");
    if (c != nodes) c->add_option("NODE", node_name, "node name")->required();
  }
  drain->add_option("--timeout", drain_timeout, "give up after this long (the node stays cordoned)")->capture_default_str();
  nodes->add_flag("--json", as_json, "print JSON");

  auto* token_cmd = app.add_subcommand("token", "add or revoke a tenant's API token in a tokens file");
  token_cmd->require_subcommand(1);
  std::string tenant_name, tokens_path;
  Tenant new_tenant;
  auto* token_new = token_cmd->add_subcommand("new", "add a tenant with a fresh token; prints only the token");
  token_new->add_option("NAME", tenant_name, "tenant name")->required();
  token_new->add_option("--tokens", tokens_path, "tokens file (created 0600)")->required();
  token_new->add_option("--max-sandboxes", new_tenant.limits.max_sandboxes, "most sandboxes at once");
  token_new->add_option("--creates-per-s", new_tenant.limits.creates_per_second, "most creations per second");
  token_new->add_option("--store", new_tenant.limits.stores, "a store URL it may use besides the daemon's (repeatable)");
  token_new->add_option("--layers", new_tenant.limits.layers, "a layer name pattern it may use (repeatable; default any)");
  token_new->add_option("--publish", new_tenant.limits.publish,
                        "a tag name pattern it may publish snapshots under (repeatable; default none)");
  token_new->add_flag("--net-host", new_tenant.limits.net_host, "may ask for the host's network");
  token_new->add_flag("--gateway", new_tenant.limits.gateway, "a cluster gateway's credential (it names the tenant it calls for)");
  auto* token_revoke = token_cmd->add_subcommand("revoke", "remove a tenant (takes effect on the daemon's SIGHUP)");
  token_revoke->add_option("NAME", tenant_name, "tenant name")->required();
  token_revoke->add_option("--tokens", tokens_path, "tokens file")->required();

  auto* create = app.add_subcommand("create", "create a sandbox through the daemon; prints its id");
  sandbox_flags(create);
  client_flags(create);
  std::string id;
  auto* net_cmd = app.add_subcommand("net", "show or change a sandbox's network policy (task phases)");
  std::string net_mode;
  net_cmd->add_option("ID", id, "sandbox id")->required();
  net_cmd->add_option("--mode", net_mode, "none, allow or open: new connections follow at once, refused open ones are reset");
  net_cmd->add_option("--allow", allow, "with --mode allow: DOMAIN, *.DOMAIN, ADDR or CIDR[:PORT] (repeatable)");
  client_flags(net_cmd);
  auto* exec = app.add_subcommand("exec", "run a command in a sandbox; exits with its code");
  exec->add_option("ID", id, "sandbox id")->required();
  exec->add_option("--env", request.env, "K=V for the command");
  exec->add_option("--workdir", request.cwd, "working directory (default: the sandbox's)");
  exec->add_flag("-i,--stdin", with_stdin, "pass this process's stdin to the command");
  exec->add_option("--deny", deny, "PATH this command may not read, list, write or run (repeatable)");
  exec->add_option("--read-only", read_only, "PATH this command may not change (repeatable)");
  exec->add_flag("--kill-leftovers", kill_leftovers, "kill what the command leaves running when it ends (default: the sandbox's)");
  exec->add_flag("--keep-leftovers", keep_leftovers, "keep it running (the default unless the sandbox says otherwise)");
  exec->add_option("--role", role, "agent, or grader: run without the sandbox's file rules")->capture_default_str();
  exec_flags(exec);
  client_flags(exec);
  exec->footer("Command: launcher exec ID [options] -- CMD [ARG ...]");
  std::string src, dst;
  auto* cp = app.add_subcommand("cp", "copy a file into or out of a sandbox (ID:/path)");
  cp->add_option("SRC", src, "file or ID:/path")->required();
  cp->add_option("DST", dst, "file or ID:/path")->required();
  client_flags(cp);
  std::string tag;
  auto* pause = app.add_subcommand("pause", "freeze every process of a sandbox");
  pause->add_option("ID", id)->required();
  client_flags(pause);
  auto* resume = app.add_subcommand("resume", "thaw a paused sandbox");
  resume->add_option("ID", id)->required();
  client_flags(resume);
  auto* snapshot = app.add_subcommand("snapshot", "capture a sandbox's changes as a diff layer");
  snapshot->add_option("ID", id)->required();
  snapshot->add_option("--tag", tag, "NAME:VERSION")->required();
  snapshot->add_flag("--include-denied", include_denied, "also pack what lies under the sandbox's denied paths (operators)");
  client_flags(snapshot);
  auto* destroy = app.add_subcommand("destroy", "remove a sandbox and everything it made");
  destroy->add_option("ID", id)->required();
  client_flags(destroy);
  auto* warm = app.add_subcommand("warm", "keep N sandboxes of a layer stack ready (a warm pool); without --layer, list the pools");
  int warm_size = -1;
  warm->add_option("--layer", spec.layers, "layer REF, bottom first");
  warm->add_option("--backend", spec.backend, "container or microvm")->capture_default_str();
  warm->add_option("--store", spec.store, "store URL (default: the daemon's)");
  warm->add_option("--size", warm_size, "ready sandboxes to keep (0 removes the pool)");
  warm->add_option("--cpus", cpus, "CPU quota in cores");
  warm->add_option("--memory", memory, "memory limit, e.g. 512M");
  warm->add_option("--pids", pids, "process limit");
  warm->add_option("--disk", disk, "size cap of the writable layer")->capture_default_str();
  warm->add_option("--net", net, "none (the default), allow or open");
  warm->add_option("--allow", allow, "with --net allow: DOMAIN, *.DOMAIN, ADDR or CIDR[:PORT] (repeatable)");
  client_flags(warm);
  auto* ls = app.add_subcommand("ls", "list the daemon's sandboxes");
  ls->add_flag("--json", as_json, "print JSON");
  client_flags(ls);

  // Everything after the first `--` is the command, untouched by option parsing.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      command.assign(argv + i + 1, argv + argc);
      argc = i;
      break;
    }
  }
  CLI11_PARSE(app, argc, argv);

  if (!token_file.empty()) {
    auto t = ReadFileToString(token_file);
    if (!t.ok()) return Fail(t.status().Annotate("--token-file"));
    token = t->substr(0, t->find('\n'));
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  }
  if (token_new->parsed()) {
    auto t = NewToken();
    if (!t.ok()) return Fail(t.status());
    new_tenant.name = tenant_name;
    auto hash = Sha256Hex(*t);
    if (!hash.ok()) return Fail(hash.status());
    new_tenant.token_sha256 = *hash;
    // Checks the name and limits as the daemon will read them.
    auto checked = ParseTenantLine(FormatTenantLine(new_tenant));
    if (!checked.ok()) return Fail(checked.status());
    Status s = AddTenant(tokens_path, *checked);
    if (!s.ok()) return Fail(s);
    std::printf("%s\n", t->c_str());
    return 0;
  }
  if (token_revoke->parsed()) {
    Status s = RevokeTenant(tokens_path, tenant_name);
    return s.ok() ? 0 : Fail(s);
  }

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
  auto done = [](const Status& s) { return s.ok() ? 0 : Fail(s); };
  if (cordon->parsed() || uncordon->parsed() || drain->parsed() || nodes->parsed()) {
    if (cluster_url.empty()) return Fail(Error(EINVAL, "--cluster URL (or $STRATA_CLUSTER) is required"));
    if (cordon->parsed()) return done(Cordon(cluster_url, node_name, "launcher cordon"));
    if (uncordon->parsed()) return done(Uncordon(cluster_url, node_name));
    if (drain->parsed()) {
      auto t = ParseDuration(drain_timeout);
      if (!t.ok()) return Fail(t.status().Annotate("--timeout"));
      return done(Drain(cluster_url, node_name, *t, [&](int64_t n) { std::fprintf(stderr, "drain %s: %lld sandboxes left\n", node_name.c_str(), static_cast<long long>(n)); }));
    }
    auto list = ListNodes(cluster_url);
    if (!list.ok()) return Fail(list.status());
    if (as_json) {
      std::printf("%s\n", list->dump(2).c_str());
      return 0;
    }
    std::printf("%-20s %-6s %-9s %-10s %-10s %s\n", "NODE", "LIVE", "CORDONED", "SANDBOXES", "SLOTS", "URL");
    for (const auto& n : *list) {
      const auto load = n.value("load", nlohmann::json::object());
      const auto capacity = n.value("capacity", nlohmann::json::object());
      std::printf("%-20s %-6s %-9s %-10lld %-10lld %s\n", n.value("name", "").c_str(), n.value("live", false) ? "yes" : "no",
                  n.value("cordoned", false) ? "yes" : "no", static_cast<long long>(load.value("sandboxes", int64_t{0})),
                  static_cast<long long>(capacity.value("slots", int64_t{0})), n.value("url", "").c_str());
    }
    return 0;
  }
  if (gateway->parsed()) {
    auto d = ParseDuration(create_deadline);
    if (!d.ok()) return Fail(d.status().Annotate("--create-deadline"));
    gateway_options.create_deadline = *d;
    const size_t eq = overflow.find('=');
    if (eq == std::string::npos || eq == 0) return Fail(Error(EINVAL, "--overflow " + Quote(overflow) + ": expected KEY=VALUE"));
    gateway_options.policy.overflow_key = overflow.substr(0, eq);
    gateway_options.policy.overflow_value = overflow.substr(eq + 1);
    return RunGateway(std::move(gateway_options));
  }
  if (serve->parsed()) {
    if (!node.name.empty()) {
      if (Status s = CheckNodeName(node.name); !s.ok()) return Fail(s.Annotate("--node"));
    }
    auto parsed_labels = ParseLabels(labels, "--label");
    if (!parsed_labels.ok()) return Fail(parsed_labels.status());
    cluster_options.labels = std::move(*parsed_labels);
    auto parse = [](const std::string& text, const char* flag, auto* out, auto convert) -> Status {
      if (text.empty()) return OkStatus();
      auto v = convert(text);
      if (!v.ok()) return v.status().Annotate(flag);
      *out = *v;
      return OkStatus();
    };
    auto& l = serve_options.tcp_limits;
    for (Status s : {parse(memory_reserve, "--memory-reserve", &serve_options.memory_reserve, ParseSize),
                     parse(memory_capacity, "--memory-capacity", &serve_options.memory_capacity, ParseSize),
                     parse(disk_reserve, "--disk-reserve", &serve_options.disk_reserve, ParseSize),
                     parse(idle_timeout, "--idle-timeout", &l.idle_timeout, ParseDuration),
                     parse(request_timeout, "--request-timeout", &l.request_timeout, ParseDuration),
                     parse(max_upload, "--max-upload", &l.max_upload_bytes, ParseSize)}) {
      if (!s.ok()) return Fail(s);
    }
    auto body = ParseSize(max_body);
    if (!body.ok()) return Fail(body.status().Annotate("--max-body"));
    l.max_body_bytes = *body;
    NetworkConfig nc;
    auto pool = Cidr4::Parse(net_pool);
    if (!pool.ok()) return Fail(pool.status().Annotate("--net-pool"));
    nc.pool = *pool;
    nc.dns_grace_seconds = dns_grace;
    nc.warm = net_warm;
    if (!dns_upstream.empty()) {
      auto up = ParseDnsServer(dns_upstream);
      if (!up.ok()) return Fail(up.status().Annotate("--dns-upstream"));
      nc.dns_upstream = *up;
    }
    for (const auto& cidr : allow_private) {
      auto c = Cidr4::Parse(cidr);
      if (!c.ok()) return Fail(c.status().Annotate("--allow-private"));
      nc.private_ok.push_back(*c);
    }
    // Without them (no forwarding, no nftables) the node still serves
    // sandboxes of modes none and host.
    auto network = NodeNetwork::Open(nc);
    if (network.ok()) node.network = *network;
    else node.network_off_reason = network.status().ToString();
    if (!network.ok()) std::fprintf(stderr, "launcher: WARNING: sandbox networks (modes allow, open) are off: %s\n", network.status().ToString().c_str());
    return Serve(serve_options, cluster_options, node);
  }

  if (!runtime.empty()) node.runtime = runtime;
  if (run->parsed() || create->parsed() || warm->parsed()) {
    auto policy = NetPolicy::FromFlags(net, allow);
    if (!policy.ok()) return Fail(policy.status().Annotate("--net/--allow"));
    spec.network = *policy;
  }
  if (!deny.empty() || !read_only.empty()) {
    auto rules = MakeFileRules(deny, read_only, "--deny/--read-only");
    if (!rules.ok()) return Fail(rules.status());
    (exec->parsed() ? request.files : spec.files) = std::move(*rules);
  }
  if (role != "agent" && role != "grader") return Fail(Error(EINVAL, "--role: agent or grader, not " + Quote(role)));
  request.grader = role == "grader";
  if (kill_leftovers && keep_leftovers) return Fail(Error(EINVAL, "--kill-leftovers and --keep-leftovers: choose one"));
  if (kill_leftovers || keep_leftovers) request.kill_leftovers = kill_leftovers;
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
  // The daemon has its own environment: send the caller's store.
  if (spec.store.empty() && std::getenv("STRATA_STORE")) spec.store = std::getenv("STRATA_STORE");
  const bool explicit_daemon = !url.empty();
  LauncherClient client(DaemonAddress{url.empty() ? "unix://" + socket : url, token, ca});

  if (run->parsed()) {
    if (command.empty()) return Fail(Error(EINVAL, "run: no command given (launcher run [options] -- CMD [ARG ...])"));
    request.argv = command;
    request.env = spec.env;
    request.cwd = spec.workdir;
    if (!no_daemon && client.Alive()) return RunThroughDaemon(client, spec, request, verbose);
    if (explicit_daemon && !no_daemon) return Fail(Error(ECONNREFUSED, "run: no daemon answers at " + url));
    return RunHere(spec, node, request, verbose);
  }
  if (create->parsed()) {
    auto info = client.Create(SpecJson(spec));
    if (!info.ok()) return Fail(info.status());
    if (verbose) PrintLayers(*info);
    std::printf("%s\n", (*info)["id"].get<std::string>().c_str());
    return 0;
  }
  if (exec->parsed()) {
    if (command.empty()) return Fail(Error(EINVAL, "exec: no command given (launcher exec ID -- CMD [ARG ...])"));
    request.argv = command;
    if (with_stdin) {
      std::string in;
      char buf[65536];
      ssize_t n;
      while ((n = ::read(STDIN_FILENO, buf, sizeof buf)) > 0) in.append(buf, static_cast<size_t>(n));
      request.stdin_data = std::move(in);
    }
    auto result = client.Exec(id, ExecJson(request), Print);
    if (!result.ok()) return Fail(result.status());
    return Report(*result, request.stdout_cap, 0);
  }
  if (cp->parsed()) {
    auto [src_id, src_path] = SplitCopyArg(src);
    auto [dst_id, dst_path] = SplitCopyArg(dst);
    if (src_id.empty() == dst_id.empty()) return Fail(Error(EINVAL, "cp: exactly one of SRC and DST must be ID:/path"));
    if (dst_id.empty()) {
      auto data = client.Get(src_id, src_path);
      if (!data.ok()) return Fail(data.status());
      Status s = WriteFileAtomic(dst_path, *data, false);
      return s.ok() ? 0 : Fail(s);
    }
    auto data = ReadFileToString(src_path);
    if (!data.ok()) return Fail(data.status());
    struct stat st{};
    ::stat(src_path.c_str(), &st);
    Status s = client.Put(dst_id, dst_path, *data, st.st_mode & 07777);
    return s.ok() ? 0 : Fail(s);
  }
  if (net_cmd->parsed()) {
    const bool change = !net_mode.empty() || !allow.empty();
    auto policy = change ? NetPolicy::FromFlags(net_mode, allow) : Result<NetPolicy>(NetPolicy{});
    if (!policy.ok()) return Fail(policy.status().Annotate("net"));
    auto r = change ? client.SetNetwork(id, policy->ToJson()) : client.Network(id);
    if (!r.ok()) return Fail(r.status());
    std::printf("%s\n", r->dump(2).c_str());
    return 0;
  }
  if (pause->parsed()) return done(client.Pause(id));
  if (resume->parsed()) return done(client.Resume(id));
  if (destroy->parsed()) return done(client.Destroy(id));
  if (snapshot->parsed()) {
    auto r = client.Snapshot(id, tag, include_denied);
    if (!r.ok()) return Fail(r.status());
    std::printf("%s\n", (*r)["digest"].get<std::string>().c_str());
    return 0;
  }
  if (warm->parsed()) {
    if (spec.layers.empty() != (warm_size < 0)) return Fail(Error(EINVAL, "warm: give --layer and --size to set a pool, neither to list them"));
    auto r = spec.layers.empty() ? client.WarmPools() : client.SetWarmPool(SpecJson(spec), warm_size);
    if (!r.ok()) return Fail(r.status().Annotate("warm"));
    std::printf("%s\n", r->dump(2).c_str());
    return 0;
  }
  if (ls->parsed()) {
    auto list = client.List();
    if (!list.ok()) return Fail(list.status());
    if (as_json) {
      std::printf("%s\n", list->dump().c_str());
      return 0;
    }
    std::printf("%-16s %-10s %-8s %-6s %s\n", "ID", "BACKEND", "STATE", "NET", "LAYERS");
    for (const auto& s : *list) {
      std::vector<std::string> names;
      for (const auto& l : s["layers"]) names.push_back(l.value("name", "") + "@" + l.value("digest", "").substr(0, 12));
      const json net_info = s.value("network", json::object());
      const std::string mode = net_info.is_object() ? net_info.value("mode", "none") : net_info.get<std::string>();
      std::printf("%-16s %-10s %-8s %-6s %s\n", s.value("id", "").c_str(), s.value("backend", "").c_str(),
                  s.value("state", "").c_str(), mode.c_str(), Join(names, " ").c_str());
    }
    return 0;
  }
  return 0;
}
