// What the two files of SandboxManager (manager.cc: opening, recovery,
// creation and the node's queries; lifecycle.cc: execs, pause, resume,
// destroy, snapshot) share.
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

// A function-call sandbox's own settings (its record's).
nlohmann::json CallSpecJson(const SandboxSpec& spec);

}  // namespace strata::launcher::manager
