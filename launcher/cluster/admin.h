// The operator's cluster verbs, straight on etcd (no gateway needed):
// cordon, uncordon, drain, and the list of nodes.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/units.h"

namespace strata::launcher {

// A cordoned node gets no new sandboxes; its sandboxes keep working.
// `endpoints`: etcd's. ENOENT for a node that never registered.
Status Cordon(const std::string& endpoints, const std::string& node, const std::string& by);
Status Uncordon(const std::string& endpoints, const std::string& node);
// Cordons the node, then waits until it holds no sandbox (or `timeout`:
// ETIMEDOUT, the node stays cordoned). `progress` gets the count now and then.
Status Drain(const std::string& endpoints, const std::string& node, Duration timeout,
             const std::function<void(int64_t sandboxes)>& progress);
// Every node etcd knows: its record (live ones with their load), "live", "cordoned".
Result<nlohmann::json> ListNodes(const std::string& endpoints);

}  // namespace strata::launcher
