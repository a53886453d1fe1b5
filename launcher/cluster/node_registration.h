// NodeRegistration: a serving node daemon in its cluster — its record in
// etcd (membership.h) made from the node API server's settings and kept
// current from its health, while this object lives.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "launcher/api/server.h"
#include "launcher/cluster/membership.h"

namespace strata::launcher {

// `launcher serve --cluster ...` (docs/cluster.md).
struct ClusterOptions {
  std::string endpoints;  // etcd, comma-separated; empty: no cluster
  std::string etcd_ca;
  std::string advertise;  // the API URL gateways use; empty: the first --listen's
  std::map<std::string, std::string> labels;
  int64_t lease_seconds = 5;
};

class NodeRegistration {
 public:
  // Registers the node `server` serves (it needs NodeConfig::name, and a
  // TCP listener or `advertise`), and shows the registration in the
  // server's health. `server` must outlive the registration.
  static Result<std::unique_ptr<NodeRegistration>> Start(const ClusterOptions& options, LauncherServer& server);
  // Leaves the cluster (before the server stops answering).
  ~NodeRegistration();
  NodeRegistration(const NodeRegistration&) = delete;
  NodeRegistration& operator=(const NodeRegistration&) = delete;

 private:
  explicit NodeRegistration(LauncherServer& server) : server_(server) {}
  LauncherServer& server_;
  std::unique_ptr<Registrar> registrar_;
};

}  // namespace strata::launcher
