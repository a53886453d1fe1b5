// The node daemon's record in its cluster, from its API server.
#include "launcher/cluster/node_registration.h"

#include <sys/statvfs.h>

#include <fstream>
#include <thread>

#include "common/strings.h"
#include "launcher/front/http_server.h"
#include "launcher/sandbox/backend.h"

namespace strata::launcher {

using nlohmann::json;

Result<std::unique_ptr<NodeRegistration>> NodeRegistration::Start(const ClusterOptions& c, LauncherServer& server) {
  const ServeOptions& options = server.options();
  SandboxManager& manager = server.manager();
  const NodeConfig& config = manager.node();
  NodeRecord node;
  node.name = config.name;
  if (node.name.empty()) return Error(EINVAL, "serve: --cluster needs --node NAME (sandbox ids carry it)");
  node.url = c.advertise;
  if (node.url.empty()) {
    node.url = server.TcpUrl();
    if (node.url.empty()) return Error(EINVAL, "serve: --cluster needs --listen HOST:PORT (gateways reach nodes over TCP) or --advertise URL");
    auto hp = ParseHostPort(options.listen.front());
    if (hp.ok() && (hp->first.empty() || hp->first == "0.0.0.0" || hp->first == "::")) {
      return Error(EINVAL, "serve: --listen " + options.listen.front() + " is every address: say which one gateways use (--advertise https://HOST:PORT)");
    }
  }
  node.labels = c.labels;
  node.accelerator = "none";
  if (config.backends) {
    node.backends = config.backends->Available(config);
    config.backends->ForEach([&](const BackendKind& k) {
      if (k.machine && k.available(config).ok()) node.accelerator = config.vm_accel;
    });
  }
  node.slots = options.max_sandboxes;
  node.cpus = static_cast<int64_t>(std::thread::hardware_concurrency());
  node.memory = options.memory_capacity;
  if (node.memory == 0) {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    uint64_t kb = 0;
    if (in >> key >> kb >> unit && key == "MemTotal:") node.memory = kb * 1024;
  }
  struct statvfs vfs{};
  if (::statvfs(config.uppers.c_str(), &vfs) == 0) node.disk = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  Registrar::Options o{.endpoints = c.endpoints, .ca_file = c.etcd_ca, .lease_seconds = c.lease_seconds};
  LauncherServer* s = &server;
  auto report = [s](NodeRecord* r) {
    const json health = s->NodeHealth();
    // With the creates admitted and under way: a gateway counts its
    // placements as pending until a report made after they arrived.
    r->sandboxes = health.value("sandboxes", int64_t{0}) + s->Creating();
    r->accepting = health.value("accepting", true);
    r->headroom = health["headroom"];
    r->memory_available = r->headroom.value("memory_available", uint64_t{0});
    r->disk_available = r->headroom.value("disk_available", uint64_t{0});
    r->states = s->manager().StateCounts();
  };
  std::unique_ptr<NodeRegistration> reg(new NodeRegistration(server));
  STRATA_ASSIGN_OR_RETURN(reg->registrar_, Registrar::Start(o, std::move(node), report));
  Registrar* registrar = reg->registrar_.get();
  server.SetClusterStatus([registrar] { return registrar->Status(); });
  return reg;
}

NodeRegistration::~NodeRegistration() {
  server_.SetClusterStatus(nullptr);
  registrar_.reset();
}

}  // namespace strata::launcher
