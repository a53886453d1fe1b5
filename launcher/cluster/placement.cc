// Filter, sample, least loaded; the overflow gate.
#include "launcher/cluster/placement.h"

#include <algorithm>

#include "common/strings.h"

namespace strata::launcher {

namespace {
// A report is made about once a second and takes a moment to reach the
// gateway: placements older than this are in the node's count.
constexpr auto kPendingWindow = std::chrono::milliseconds(1500);
// A placement reaches its node within this; a report the node made later
// counts it (its sandboxes and the creates it has admitted). Without it, a
// burst's placements were counted twice until the window passed, in the
// report and as pending, and opened the overflow pool early.
constexpr int64_t kTransitMs = 250;
}  // namespace

Placer::Placer(PlacementPolicy policy) : policy_(std::move(policy)), rng_(std::random_device{}()) {
  if (policy_.sample < 1) policy_.sample = 1;
}

void Placer::Update(const std::vector<NodeRecord>& live, const std::set<std::string>& cordoned) {
  std::lock_guard lock(mu_);
  std::vector<Node> nodes;
  std::map<std::string, size_t> index;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& record : live) {
    Node n;
    if (auto it = index_.find(record.name); it != index_.end()) {
      n.pending = std::move(nodes_[it->second].pending);
      // A newer report counts what was placed before it arrived.
      if (record.at_ms != nodes_[it->second].record.at_ms) {
        while (!n.pending.empty() && (n.pending.front().wall_ms < record.at_ms - kTransitMs ||
                                      now - n.pending.front().at > kPendingWindow)) {
          n.pending.pop_front();
        }
      }
    }
    n.record = record;
    n.cordoned = cordoned.count(record.name) > 0;
    auto label = record.labels.find(policy_.overflow_key);
    n.overflow = label != record.labels.end() && label->second == policy_.overflow_value;
    n.slots = record.EffectiveSlots();
    index[record.name] = nodes.size();
    nodes.push_back(std::move(n));
  }
  nodes_ = std::move(nodes);
  index_ = std::move(index);
}

double Placer::MainUtilisationLocked() const {
  int64_t used = 0, offered = 0;
  for (const auto& n : nodes_) {
    if (n.overflow || n.cordoned) continue;
    used += n.record.sandboxes + static_cast<int64_t>(n.pending.size());
    offered += n.slots;
  }
  return offered > 0 ? static_cast<double>(used) / static_cast<double>(offered) : 0;
}

double Placer::MainUtilisation() {
  std::lock_guard lock(mu_);
  return MainUtilisationLocked();
}

Result<std::string> Placer::Place(const PlacementRequest& request, const std::set<std::string>& exclude) {
  std::lock_guard lock(mu_);
  // Asking for the overflow pool by its label is asking for it.
  auto asked = request.labels.find(policy_.overflow_key);
  const bool wants_overflow = asked != request.labels.end() && asked->second == policy_.overflow_value;
  const bool overflow_open = wants_overflow || MainUtilisationLocked() > policy_.overflow_threshold;
  scratch_.clear();
  int matching = 0, full = 0, closed = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.cordoned || exclude.count(n.record.name)) continue;
    if (std::find(n.record.backends.begin(), n.record.backends.end(), request.backend) == n.record.backends.end()) continue;
    bool labels_match = true;
    for (const auto& [k, v] : request.labels) {
      auto it = n.record.labels.find(k);
      if (it == n.record.labels.end() || it->second != v) {
        labels_match = false;
        break;
      }
    }
    if (!labels_match) continue;
    ++matching;
    if (!n.record.accepting || n.record.sandboxes + static_cast<int64_t>(n.pending.size()) + request.count > n.slots ||
        (request.memory > 0 && n.record.memory_available < request.memory)) {
      ++full;
      continue;
    }
    if (n.overflow && !overflow_open) {
      ++closed;
      continue;
    }
    scratch_.push_back(i);
  }
  if (scratch_.empty()) {
    if (matching == 0) {
      return Error(EAGAIN, StrCat("no live node offers back end ", request.backend,
                                  request.labels.empty() ? "" : " with the labels asked for",
                                  exclude.empty() ? "" : StrCat(" (", exclude.size(), " tried)")));
    }
    return Error(EAGAIN, StrCat("no node can take it now: ", full, " full or refusing", closed ? StrCat(", ", closed, " in the overflow pool, which opens above ",
                                                                                                        static_cast<int>(policy_.overflow_threshold * 100), " % use of the main pool") : "",
                                exclude.empty() ? "" : StrCat(", ", exclude.size(), " tried")));
  }
  // d distinct candidates at random (a partial shuffle), the least loaded wins.
  const size_t d = std::min<size_t>(static_cast<size_t>(policy_.sample), scratch_.size());
  size_t best = scratch_.size();
  double best_load = 0;
  for (size_t k = 0; k < d; ++k) {
    std::uniform_int_distribution<size_t> pick(k, scratch_.size() - 1);
    std::swap(scratch_[k], scratch_[pick(rng_)]);
    const double load = nodes_[scratch_[k]].Load();
    if (best == scratch_.size() || load < best_load) {
      best = k;
      best_load = load;
    }
  }
  Node& chosen = nodes_[scratch_[best]];
  chosen.pending.insert(chosen.pending.end(), static_cast<size_t>(std::max(1, request.count)),
                        Node::Placed{std::chrono::steady_clock::now(), ReportClockMs()});
  return chosen.record.name;
}

void Placer::Unplace(const std::string& node, int count) {
  std::lock_guard lock(mu_);
  auto it = index_.find(node);
  if (it == index_.end()) return;
  auto& pending = nodes_[it->second].pending;
  for (int i = 0; i < count && !pending.empty(); ++i) pending.pop_back();
}

}  // namespace strata::launcher
