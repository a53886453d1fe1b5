// What the warm pools' fillers decide, apart from doing it: which pool
// gives back a ready sandbox, which one gets the next, when a refill waits
// for takes to pause, and how long a failing pool backs off. Pure
// functions of the pools' counts, so they are tested without a node
// (tests/launcher/warm_policy_test.cc); WarmPools::Fill acts on
// them. docs/api.md, "Warm pools".
#pragma once

#include <chrono>
#include <span>

namespace strata::launcher::warm {

using Clock = std::chrono::steady_clock;

// A refill waits this long after the last take (a burst of takes comes
// first: a refill costs a cold create's CPU).
inline constexpr auto kRefillQuiet = std::chrono::milliseconds(200);

// One pool as the policy sees it.
struct PoolView {
  int size = 0;     // ready sandboxes it should keep
  int ready = 0;    // ready now
  int filling = 0;  // being made
  Clock::time_point retry_at{};  // no fill before (its back-off)
};

// The pool that gives back one ready sandbox now: the first with more
// ready than its size (shrunk), or with `shed` (memory short, the node
// full) the first with any ready. -1: none.
int Surplus(std::span<const PoolView> pools, bool shed);

// The pool to make the next sandbox for: below its size counting those
// being made, past its back-off, the one with fewest (the first of
// those). -1: none, or the node's admission refuses (`admitted` false).
int ToFill(std::span<const PoolView> pools, bool admitted, Clock::time_point now);

// Whether filling `pool` waits for takes to pause: it still has ready
// sandboxes and the last take was under kRefillQuiet ago (a pool run dry
// fills at once: creates are cold anyway).
bool WaitForQuiet(const PoolView& pool, Clock::time_point now, Clock::time_point last_take);

// The back-off after `streak` (at least 1) failures in a row: 1 s,
// doubling, at most 32 s — a pool whose layers went away must not spin.
Clock::duration Backoff(int streak);

}  // namespace strata::launcher::warm
