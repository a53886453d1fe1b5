// Sandbox ids: "sb-" and 12 hex digits, or "sb-<node>-" and 12 hex digits
// in a cluster, so a gateway routes a call by the id alone.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace strata::launcher {

// A new random sandbox id: "sb-" and 12 hex digits, or with a node name
// "sb-<node>-" and 12 hex digits.
std::string NewSandboxId(std::string_view node = {});
// The node a sandbox id names ("" for an id without one, or not an id).
std::string SandboxIdNode(std::string_view id);
// Whether `name` may be a node name: 1-20 of a-z, 0-9 and '-', starting
// with a letter or digit (sandbox ids and their socket paths stay short).
Status CheckNodeName(std::string_view name);

}  // namespace strata::launcher
