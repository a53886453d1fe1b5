// launcher serve: the node daemon (the API on a unix socket, and TCP
// listeners) in the foreground.
#include <cstdio>
#include <map>
#include <memory>

#include "common/strings.h"
#include "common/units.h"
#include "launcher/api/server.h"
#include "launcher/e2b/plane.h"
#include "launcher/cli/cli.h"
#include "launcher/cluster/node_registration.h"
#include "launcher/node/manager.h"
#include "launcher/node/node_cgroup.h"
#include "launcher/node/node_claims.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  ServeOptions serve;
  ClusterOptions cluster;
  std::vector<std::string> labels;
  std::string memory_reserve, memory_capacity, disk_reserve;
  std::string idle_timeout = "60s", request_timeout = "10s", max_body = "16M", max_upload = "4G";
  std::string net_pool = "10.213.0.0/16", dns_upstream;
  std::vector<std::string> allow_private;
  uint32_t dns_grace = 5;
  size_t net_warm = 4;
};

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

// Every flag into the options, checked.
Status Parse(Flags& f) {
  STRATA_ASSIGN_OR_RETURN(f.cluster.labels, ParseLabels(f.labels, "--label"));
  auto parse = [](const std::string& text, const char* flag, auto* out, auto convert) -> Status {
    if (text.empty()) return OkStatus();
    auto v = convert(text);
    if (!v.ok()) return v.status().Annotate(flag);
    *out = *v;
    return OkStatus();
  };
  ServeOptions& o = f.serve;
  auto& l = o.tcp_limits;
  for (Status s : {parse(f.memory_reserve, "--memory-reserve", &o.memory_reserve, ParseSize),
                   parse(f.memory_capacity, "--memory-capacity", &o.memory_capacity, ParseSize),
                   parse(f.disk_reserve, "--disk-reserve", &o.disk_reserve, ParseSize),
                   parse(f.idle_timeout, "--idle-timeout", &l.idle_timeout, ParseDuration),
                   parse(f.request_timeout, "--request-timeout", &l.request_timeout, ParseDuration),
                   parse(f.max_upload, "--max-upload", &l.max_upload_bytes, ParseSize)}) {
    STRATA_RETURN_IF_ERROR(s);
  }
  auto body = ParseSize(f.max_body);
  if (!body.ok()) return body.status().Annotate("--max-body");
  l.max_body_bytes = *body;
  return OkStatus();
}

// The node's sandbox networks; without them (no forwarding, no nftables)
// the node still serves sandboxes of modes none and host.
Status OpenNetwork(const Flags& f, NodeConfig& node) {
  NetworkConfig nc;
  auto pool = Cidr4::Parse(f.net_pool);
  if (!pool.ok()) return pool.status().Annotate("--net-pool");
  nc.pool = *pool;
  nc.dns_grace_seconds = f.dns_grace;
  nc.warm = f.net_warm;
  if (!f.dns_upstream.empty()) {
    auto up = ParseDnsServer(f.dns_upstream);
    if (!up.ok()) return up.status().Annotate("--dns-upstream");
    nc.dns_upstream = *up;
  }
  for (const auto& cidr : f.allow_private) {
    auto c = Cidr4::Parse(cidr);
    if (!c.ok()) return c.status().Annotate("--allow-private");
    nc.private_ok.push_back(*c);
  }
  auto network = NodeNetwork::Open(nc);
  if (network.ok()) {
    node.network = *network;
  } else {
    node.network_off_reason = network.status().ToString();
    std::fprintf(stderr, "launcher: WARNING: sandbox networks (modes allow, open) are off: %s\n", network.status().ToString().c_str());
  }
  return OkStatus();
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
  // E2B's API beside /v1, on the same listeners (docs/e2b.md).
  auto e2b = e2b::Plane::Open(**server, options.state_dir);
  if (!e2b.ok()) return Fail(e2b.status());
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
  server->reset();  // (its listeners stop, and their calls into the plane end, before the plane goes)
  e2b->reset();
  return 0;
}

int Run(Flags& f, Cli& cli) {
  if (!cli.node.name.empty()) {
    if (Status s = CheckNodeName(cli.node.name); !s.ok()) return Fail(s.Annotate("--node"));
  }
  if (Status s = Parse(f); !s.ok()) return Fail(s);
  if (Status s = OpenNetwork(f, cli.node); !s.ok()) return Fail(s);
  return Serve(f.serve, f.cluster, cli.node);
}

}  // namespace

void AddServe(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  ServeOptions& o = f->serve;
  NodeConfig& node = cli.node;
  auto* c = app.add_subcommand("serve", "run the node daemon (API on a unix socket) in the foreground");
  c->add_option("--socket", o.socket_path, "socket")->capture_default_str();
  c->add_option("--kernel", node.vm_kernel, "microVMs' guest kernel, an uncompressed vmlinux (STRATA_VM_KERNEL)")->capture_default_str();
  c->add_option("--vm-templates", node.vm_templates,
                "saved states of booted microVMs kept, one per stack and shape, to resume instead of boot; 0: off "
                "(STRATA_VM_TEMPLATES)")
      ->capture_default_str();
  c->add_option("--state", o.state_dir, "state directory (LMDB registry)")->capture_default_str();
  c->add_option("--allow-group", o.allow_group, "also allow members of this group (as the operator)");
  c->add_option("--tokens", o.tokens_file, "tenants and their token hashes (launcher token new)");
  c->add_option("--token-file", o.legacy_token_file, "old single-token file (read as the tenant \"default\")");
  c->add_option("--listen", o.listen, "also serve on TCP HOST:PORT (repeatable)");
  c->add_option("--tls-cert", o.tls_cert_file, "PEM certificate (chain) for the TCP listeners");
  c->add_option("--tls-key", o.tls_key_file, "PEM private key for the TCP listeners");
  c->add_flag("--insecure", o.insecure, "allow TCP without tokens, or off loopback without TLS");
  c->add_option("--store", o.stores, "a store sandboxes may use (repeatable; the first is the default)");
  c->add_option("--max-sandboxes", o.max_sandboxes, "refuse creations beyond this many sandboxes (503)");
  c->add_option("--memory-reserve", f->memory_reserve, "refuse creations while MemAvailable is below this (503)");
  c->add_option("--memory-capacity", f->memory_capacity,
                "memory the node gives sandboxes: their parent cgroup is capped at it, and creations whose limits would "
                "pass it are refused (503)");
  c->add_option("--disk-reserve", f->disk_reserve, "refuse creations while the uppers filesystem has less free (503)");
  c->add_option("--max-connections", o.tcp_limits.max_connections, "TCP connections in all")->capture_default_str();
  c->add_option("--max-connections-per-client", o.tcp_limits.max_per_client, "TCP connections from one address")
      ->capture_default_str();
  c->add_option("--idle-timeout", f->idle_timeout, "close a TCP connection idle this long")->capture_default_str();
  c->add_option("--request-timeout", f->request_timeout, "a request's first line to its last byte (uploads excepted)")
      ->capture_default_str();
  c->add_option("--max-body", f->max_body, "largest request body (uploads excepted)")->capture_default_str();
  c->add_option("--max-upload", f->max_upload, "largest file upload")->capture_default_str();
  c->add_option("--net-warm", f->net_warm, "sandbox network namespaces kept ready (0: made on create)")->capture_default_str();
  c->add_option("--net-pool", f->net_pool, "addresses of sandbox networks (.1 is their gateway and DNS proxy)")->capture_default_str();
  c->add_option("--dns-upstream", f->dns_upstream, "resolver for sandboxes' admitted names, ADDR[:PORT] (default: /etc/resolv.conf's)");
  c->add_option("--dns-grace", f->dns_grace, "seconds a resolved address stays admitted past its TTL")->capture_default_str();
  c->add_option("--allow-private", f->allow_private, "a private range (CIDR) sandbox networks may reach (repeatable)");
  c->add_option("--node", node.name, "this node's name in a cluster (1-20 of a-z 0-9 -); sandbox ids carry it");
  c->add_option("--cluster", f->cluster.endpoints, "register in this etcd cluster: URL[,URL...]");
  c->add_option("--etcd-ca", f->cluster.etcd_ca, "PEM of the CAs of https etcd endpoints");
  c->add_option("--label", f->labels, "K=V the gateways place by (repeatable), e.g. pool=main");
  c->add_option("--advertise", f->cluster.advertise, "the API URL gateways use (default: the first --listen's)");
  c->add_option("--lease", f->cluster.lease_seconds, "seconds before a silent node is lost (2-10)")->capture_default_str();
  c->callback([f, &cli] { cli.exit_code = Run(*f, cli); });
}

}  // namespace strata::launcher::cli
