// launcher gateway: a cluster gateway (the node API for every node in etcd)
// in the foreground.
#include <cstdio>
#include <memory>

#include "common/units.h"
#include "common/strings.h"
#include "launcher/cli/cli.h"
#include "launcher/cluster/gateway.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  GatewayOptions options;
  std::string overflow = "pool=cloud", create_deadline = "30s";
};

int RunGateway(Flags f) {
  GatewayOptions& options = f.options;
  auto d = ParseDuration(f.create_deadline);
  if (!d.ok()) return Fail(d.status().Annotate("--create-deadline"));
  options.create_deadline = *d;
  const size_t eq = f.overflow.find('=');
  if (eq == std::string::npos || eq == 0) return Fail(Error(EINVAL, "--overflow " + Quote(f.overflow) + ": expected KEY=VALUE"));
  options.policy.overflow_key = f.overflow.substr(0, eq);
  options.policy.overflow_value = f.overflow.substr(eq + 1);

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

}  // namespace

void AddGateway(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  GatewayOptions& o = f->options;
  auto* c = app.add_subcommand("gateway", "run a cluster gateway (the node API for every node in etcd) in the foreground");
  c->add_option("--cluster", o.cluster, "etcd: URL[,URL...]")->required();
  c->add_option("--etcd-ca", o.etcd_ca, "PEM of the CAs of https etcd endpoints");
  c->add_option("--listen", o.listen, "serve on TCP HOST:PORT (repeatable)")->required();
  c->add_option("--tls-cert", o.tls_cert_file, "PEM certificate (chain)");
  c->add_option("--tls-key", o.tls_key_file, "PEM private key");
  c->add_option("--tokens", o.tokens_file, "tenants and their token hashes (the nodes' tokens file)");
  c->add_flag("--insecure", o.insecure, "allow no tokens (every caller is the operator) or plain TCP off loopback");
  c->add_option("--node-token", o.node_token_file, "file holding this gateway's credential on the nodes")->required();
  c->add_option("--node-ca", o.node_ca_file, "PEM of the CAs of the nodes' certificates");
  c->add_option("--overflow", f->overflow, "K=V of the overflow pool's nodes")->capture_default_str();
  c->add_option("--overflow-threshold", o.policy.overflow_threshold, "main-pool utilisation above which the overflow pool gets work")
      ->capture_default_str();
  c->add_option("--sample", o.policy.sample, "nodes compared per placement")->capture_default_str();
  c->add_option("--create-deadline", f->create_deadline, "how long a create tries nodes")->capture_default_str();
  c->callback([f, &cli] { cli.exit_code = RunGateway(*f); });
}

}  // namespace strata::launcher::cli
