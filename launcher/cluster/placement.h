// Placer: where a gateway creates a sandbox. Among the live nodes that
// can take the request (back end, labels, free slots, not cordoned) it
// samples a few at random and takes the least loaded (the "power of d
// choices"), counting its own placements since a node's last report so a
// burst does not pile onto one node. Nodes of the overflow pool
// (`pool=cloud` by default) get work only while the main pool's
// utilisation is above a threshold. Thread-safe; no I/O.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "launcher/cluster/membership.h"
#include "launcher/sandbox/spec.h"

namespace strata::launcher {

struct PlacementPolicy {
  // The label that marks the overflow pool.
  std::string overflow_key = "pool";
  std::string overflow_value = "cloud";
  // Main-pool utilisation (sandboxes, and placements not yet reported,
  // over the slots its nodes offer) above which overflow nodes get work.
  double overflow_threshold = 0.8;
  // Candidates sampled per decision.
  int sample = 2;
};

struct PlacementRequest {
  std::string backend = kDefaultBackend;
  std::map<std::string, std::string> labels;  // a node must carry all of them
  uint64_t memory = 0;                        // its memory limit, if any
  int count = 1;                              // a bulk create goes to one node
};

class Placer {
 public:
  explicit Placer(PlacementPolicy policy = {});

  // The cluster as etcd shows it now: live nodes and cordoned names.
  void Update(const std::vector<NodeRecord>& live, const std::set<std::string>& cordoned);

  // A node for `request`, not one of `exclude`; the placement is counted
  // against it until its next report. EAGAIN says why no node fits.
  Result<std::string> Place(const PlacementRequest& request, const std::set<std::string>& exclude = {});
  // A placement that did not happen after all (the node refused it).
  void Unplace(const std::string& node, int count = 1);

  // The main pool's utilisation now (0 with no main node).
  double MainUtilisation();

 private:
  struct Node {
    NodeRecord record;
    bool cordoned = false;
    bool overflow = false;
    int64_t slots = 1;  // EffectiveSlots()
    // This gateway's placements the node's last report may not count.
    struct Placed {
      std::chrono::steady_clock::time_point at;
      int64_t wall_ms;  // when, by ReportClockMs()
    };
    std::deque<Placed> pending;
    double Load() const { return static_cast<double>(record.sandboxes + static_cast<int64_t>(pending.size())) / slots; }
  };
  double MainUtilisationLocked() const;

  PlacementPolicy policy_;
  std::mutex mu_;
  std::vector<Node> nodes_;
  std::map<std::string, size_t> index_;
  std::mt19937_64 rng_;
  std::vector<size_t> scratch_;
};

}  // namespace strata::launcher
