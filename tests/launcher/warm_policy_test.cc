// The warm pools' decisions, apart from a node: what gives way, what fills
// next, when a refill waits, how a failing pool backs off.
#include "launcher/node/warm_policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata::launcher::warm {
namespace {

using namespace std::chrono_literals;

TEST(WarmPolicyTest, AShrunkPoolGivesBackItsSurplusAndSheddingTakesFromAny) {
  std::vector<PoolView> pools = {{.size = 2, .ready = 2}, {.size = 1, .ready = 3}};
  EXPECT_EQ(Surplus(pools, false), 1);
  pools[1].ready = 1;
  EXPECT_EQ(Surplus(pools, false), -1);  // every pool at its size
  EXPECT_EQ(Surplus(pools, true), 0);    // memory short: the first with any
  // Nothing ready, nothing to give, whatever the pressure; sandboxes being
  // made are not ready ones.
  std::vector<PoolView> empty = {{.size = 0, .ready = 0, .filling = 2}};
  EXPECT_EQ(Surplus(empty, true), -1);
}

TEST(WarmPolicyTest, TheEmptiestPoolPastItsBackOffFillsFirstAndOnlyWhenAdmitted) {
  const auto now = Clock::now();
  std::vector<PoolView> pools = {
      {.size = 4, .ready = 2, .filling = 1},  // has 3
      {.size = 4, .ready = 0, .filling = 1},  // has 1: the emptiest
      {.size = 4, .ready = 0, .filling = 0, .retry_at = now + 1s},  // has 0, backing off
  };
  EXPECT_EQ(ToFill(pools, true, now), 1);
  EXPECT_EQ(ToFill(pools, true, now + 2s), 2);  // its back-off over
  EXPECT_EQ(ToFill(pools, false, now + 2s), -1);  // the node refuses
  // Being made counts: a pool whose missing sandboxes are all under way
  // gets no more.
  std::vector<PoolView> full = {{.size = 2, .ready = 1, .filling = 1}, {.size = 0}};
  EXPECT_EQ(ToFill(full, true, now), -1);
  // Ties go to the first.
  std::vector<PoolView> tie = {{.size = 2}, {.size = 2}};
  EXPECT_EQ(ToFill(tie, true, now), 0);
}

TEST(WarmPolicyTest, ARefillWaitsForABurstOfTakesUnlessThePoolRanDry) {
  const auto now = Clock::now();
  const PoolView some{.size = 4, .ready = 1};
  const PoolView dry{.size = 4, .ready = 0};
  EXPECT_TRUE(WaitForQuiet(some, now, now - 50ms));
  EXPECT_FALSE(WaitForQuiet(some, now, now - kRefillQuiet - 1ms));
  EXPECT_FALSE(WaitForQuiet(dry, now, now - 50ms));
}

TEST(WarmPolicyTest, BackOffDoublesFromOneSecondToThirtyTwo) {
  EXPECT_EQ(Backoff(1), Clock::duration(1s));
  EXPECT_EQ(Backoff(2), Clock::duration(2s));
  EXPECT_EQ(Backoff(3), Clock::duration(4s));
  EXPECT_EQ(Backoff(6), Clock::duration(32s));
  EXPECT_EQ(Backoff(60), Clock::duration(32s));
  EXPECT_EQ(Backoff(0), Clock::duration(1s));  // (never below a second)
}

}  // namespace
}  // namespace strata::launcher::warm
