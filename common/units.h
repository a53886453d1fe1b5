// Parsing of the sizes and durations users type: "10G", "512KiB", "60s", "250ms".
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace strata {

using Duration = std::chrono::nanoseconds;

// "4096", "4K", "4KiB", "1.5G" (binary units: K = 1024); names the input on error.
Result<uint64_t> ParseSize(std::string_view text);
// "30" (seconds), "250ms", "60s", "5m", "2h", "1d", "1.5s".
Result<Duration> ParseDuration(std::string_view text);

}  // namespace strata
