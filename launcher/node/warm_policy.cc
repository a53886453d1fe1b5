// The warm pools' decisions.
#include "launcher/node/warm_policy.h"

#include <algorithm>
#include <cstdint>

namespace strata::launcher::warm {

int Surplus(std::span<const PoolView> pools, bool shed) {
  for (size_t i = 0; i < pools.size(); ++i) {
    const PoolView& p = pools[i];
    if (p.ready > 0 && (p.ready > p.size || shed)) return static_cast<int>(i);
  }
  return -1;
}

int ToFill(std::span<const PoolView> pools, bool admitted, Clock::time_point now) {
  if (!admitted) return -1;
  int best = -1;
  for (size_t i = 0; i < pools.size(); ++i) {
    const PoolView& p = pools[i];
    const int have = p.ready + p.filling;
    if (have < p.size && now >= p.retry_at && (best < 0 || have < pools[best].ready + pools[best].filling)) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

bool WaitForQuiet(const PoolView& pool, Clock::time_point now, Clock::time_point last_take) {
  return pool.ready > 0 && now - last_take < kRefillQuiet;
}

Clock::duration Backoff(int streak) {
  return std::chrono::seconds(int64_t{1} << std::clamp(streak - 1, 0, 5));
}

}  // namespace strata::launcher::warm
