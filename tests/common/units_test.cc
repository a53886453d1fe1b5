#include "common/units.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(UnitsTest, Sizes) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("4K"), 4096u);
  EXPECT_EQ(*ParseSize("1M"), 1048576u);
  EXPECT_EQ(*ParseSize("1MiB"), 1048576u);
  EXPECT_EQ(*ParseSize("10G"), 10ull << 30);
  EXPECT_EQ(*ParseSize("1.5k"), 1536u);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("ten").ok());
  auto bad = ParseSize("5X");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("5X"), std::string::npos);
}

TEST(UnitsTest, Durations) {
  using namespace std::chrono;
  EXPECT_EQ(*ParseDuration("60s"), seconds(60));
  EXPECT_EQ(*ParseDuration("60"), seconds(60));
  EXPECT_EQ(*ParseDuration("250ms"), milliseconds(250));
  EXPECT_EQ(*ParseDuration("2m"), minutes(2));
  EXPECT_EQ(*ParseDuration("1.5s"), milliseconds(1500));
  EXPECT_EQ(*ParseDuration("1d"), hours(24));
  EXPECT_FALSE(ParseDuration("soon").ok());
  EXPECT_FALSE(ParseDuration("3 weeks").ok());
}

}  // namespace
}  // namespace strata
