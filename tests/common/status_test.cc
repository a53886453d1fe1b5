#include "common/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace strata {
namespace {

Status Fails() { return ErrnoError(ENOSPC, "mount overlay at /run/strata/sb-42"); }

Result<int> Half(int v) {
  if (v % 2) return Error(EINVAL, "half of an odd number");
  return v / 2;
}

Result<int> Quarter(int v) {
  STRATA_ASSIGN_OR_RETURN(int h, Half(v));
  STRATA_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status Chain() {
  STRATA_RETURN_IF_ERROR(Fails());
  return OkStatus();
}

TEST(StatusTest, OkIsEmpty) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), 0);
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, ErrnoErrorNamesStepAndReason) {
  Status s = Fails();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ENOSPC);
  EXPECT_EQ(s.ToString(), "mount overlay at /run/strata/sb-42: No space left on device");
}

TEST(StatusTest, AnnotatePrependsContextAndKeepsCode) {
  Status s = Fails().Annotate("start sandbox sb-42");
  EXPECT_EQ(s.code(), ENOSPC);
  EXPECT_EQ(s.ToString(), "start sandbox sb-42: mount overlay at /run/strata/sb-42: No space left on device");
  EXPECT_TRUE(OkStatus().Annotate("x").ok());
}

TEST(StatusTest, CopiesAreIndependent) {
  Status a = Error(EIO, "a");
  Status b = a;
  b = std::move(b).Annotate("b");
  EXPECT_EQ(a.ToString(), "a");
  EXPECT_EQ(b.ToString(), "b: a");
}

TEST(StatusTest, ResultCarriesValueOrError) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EINVAL);
  EXPECT_EQ(Chain().code(), ENOSPC);
}

TEST(StatusTest, ResultHoldsMoveOnlyTypes) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

}  // namespace
}  // namespace strata
