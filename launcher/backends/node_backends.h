// The node's table of back ends: the one place that names them all.
#pragma once

#include <memory>

#include "launcher/sandbox/backend.h"

namespace strata::launcher {

// Every back end this launcher is built with, in the order the API lists
// them: container, fncall, microvm. Made once; shared read-only.
std::shared_ptr<const BackendTable> NodeBackends();

}  // namespace strata::launcher
