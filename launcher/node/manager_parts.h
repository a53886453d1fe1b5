// What the parts of SandboxManager (manager.cc: opening, recovery and the
// node's queries; calls.cc: function-call pools; warm_pools.cc; and
// lifecycle.cc: execs, pause, resume, destroy, snapshot) share.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "launcher/sandbox/spec.h"

namespace strata::launcher::manager {

// The steady clock in milliseconds.
int64_t NowMs();
// The wall clock in milliseconds since the epoch (deadlines).
int64_t WallMs();

// Function-call pools are not shared across tenants (their calls share a
// cgroup).
std::string PoolKey(const SandboxSpec& spec, const std::string& owner);
// Warm pools: what a ready sandbox must match (the rest a take assigns).
std::string WarmKey(const SandboxSpec& spec);
// A warm pool's spec as its lasting record keeps it, and back.
nlohmann::json WarmSpecJson(const SandboxSpec& spec);
Result<SandboxSpec> WarmSpecFromJson(const nlohmann::json& j);
// A function-call sandbox's own settings (its record's).
nlohmann::json CallSpecJson(const SandboxSpec& spec);

}  // namespace strata::launcher::manager
