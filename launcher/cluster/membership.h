// Cluster membership in etcd: what a node publishes about itself (its
// record), where (the key layout below), and the Registrar that keeps it
// there under a lease while the node daemon lives. docs/cluster.md.
//
//   /strata/nodes/<name>   the node as it registered: address, labels,
//                          capacity. Kept after the node dies, so gateways
//                          tell a lost node's sandboxes from unknown ones.
//   /strata/live/<name>    the full record with its load, under the node's
//                          lease (<= 10 s): gone when the node is lost.
//   /strata/cordon/<name>  present while an operator has cordoned the node.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/units.h"
#include "launcher/cluster/etcd.h"

namespace strata::launcher {

inline constexpr const char* kClusterPrefix = "/strata/";
inline constexpr const char* kNodesPrefix = "/strata/nodes/";
inline constexpr const char* kLivePrefix = "/strata/live/";
inline constexpr const char* kCordonPrefix = "/strata/cordon/";

// The clock a node's reports are dated by (`at_ms`): wall clock, ms. A
// gateway compares its own placements with them on the same clock.
int64_t ReportClockMs();

struct NodeRecord {
  std::string name;
  std::string url;  // its API: "https://10.0.0.7:7443"
  std::map<std::string, std::string> labels;  // --label K=V
  std::vector<std::string> backends;          // "container", "fncall"
  std::string accelerator;                    // what VMs would run on ("none": no VM back end yet)
  // Capacity.
  int64_t slots = 0;  // --max-sandboxes; 0: not set
  int64_t cpus = 0;
  uint64_t memory = 0;  // --memory-capacity, else the node's memory
  uint64_t disk = 0;    // the uppers filesystem's size
  // Load, as of `at_ms` (wall clock, milliseconds).
  int64_t sandboxes = 0;
  std::map<std::string, int64_t> states;  // "running", "paused"
  uint64_t memory_available = 0;
  uint64_t disk_available = 0;
  bool accepting = true;  // the node's admission would take a creation now
  nlohmann::json headroom;  // /v1/health's, as it is
  int64_t at_ms = 0;

  nlohmann::json ToJson() const;
  static Result<NodeRecord> FromJson(const nlohmann::json& j);
  // The slots placement counts against: --max-sandboxes, or without it one
  // per 256 MiB of the node's memory.
  int64_t EffectiveSlots() const;
};

class Registrar {
 public:
  struct Options {
    std::string endpoints;  // etcd
    std::string ca_file;
    int64_t lease_seconds = 5;  // 2..10
    Duration period = std::chrono::seconds(1);
  };
  // Registers `node` (refusing a name another live node registered from
  // another address) and refreshes its live record every period, with the
  // load `report` fills in. When etcd cannot be reached the daemon serves
  // on and registration is retried every period.
  static Result<std::unique_ptr<Registrar>> Start(Options options, NodeRecord node,
                                                  std::function<void(NodeRecord*)> report);
  // Revokes the lease: gateways see the node gone at once.
  ~Registrar();

  // {"registered", "lease", "last_error", "refreshes"} for health.
  nlohmann::json Status();

 private:
  Registrar() = default;
  void Run();
  strata::Status RefreshOnce();

  Options options_;
  NodeRecord node_;
  std::function<void(NodeRecord*)> report_;
  std::unique_ptr<EtcdClient> etcd_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<int64_t> lease_{0};
  uint64_t refreshes_ = 0;
  std::string last_error_;
  std::thread thread_;
};

}  // namespace strata::launcher
