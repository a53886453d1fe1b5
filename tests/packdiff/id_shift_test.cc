// Unit tests of packdiff's pure pieces: id shifting inside xattrs, --exclude globs.
#include <gtest/gtest.h>

#include <cstring>

#include "packdiff/id_shift.h"
#include "packdiff/upper_reader.h"
#include "tests/testing/test_util.h"

namespace strata::packdiff {
namespace {

TEST(IdShiftTest, CapabilitiesAndAclsAreMappedBack) {
  IdShift shift{100000, 65536};
  // v3: magic, permitted/inheritable x2, root id.
  std::string v3(24, '\0');
  v3[3] = 0x03;
  v3[0] = 0x01;
  const uint32_t root = 100000;
  std::memcpy(v3.data() + 20, &root, 4);
  ASSERT_OK_AND_ASSIGN(std::string mapped, shift.ShiftXattr("security.capability", v3, "f"));
  uint32_t got;
  std::memcpy(&got, mapped.data() + 20, 4);
  EXPECT_EQ(got, 0u);
  // v2 has no root id.
  std::string v2(20, '\0');
  v2[3] = 0x02;
  ASSERT_OK_AND_ASSIGN(std::string same, shift.ShiftXattr("security.capability", v2, "f"));
  EXPECT_EQ(same, v2);
  // A v3 cap of another range is refused.
  const uint32_t outside = 5;
  std::memcpy(v3.data() + 20, &outside, 4);
  EXPECT_EQ(shift.ShiftXattr("security.capability", v3, "f").status().code(), ERANGE);
  // ACL: user_obj, user 101000, group 100050, mask, other.
  auto entry = [](uint16_t tag, uint16_t perm, uint32_t id) {
    std::string e(8, '\0');
    std::memcpy(e.data(), &tag, 2);
    std::memcpy(e.data() + 2, &perm, 2);
    std::memcpy(e.data() + 4, &id, 4);
    return e;
  };
  std::string acl("\x02\0\0\0", 4);
  acl += entry(0x01, 7, UINT32_MAX) + entry(0x02, 5, 101000) + entry(0x08, 5, 100050) + entry(0x10, 7, UINT32_MAX) +
         entry(0x20, 0, UINT32_MAX);
  ASSERT_OK_AND_ASSIGN(std::string acl_mapped, shift.ShiftXattr("system.posix_acl_access", acl, "f"));
  EXPECT_EQ(acl_mapped, std::string("\x02\0\0\0", 4) + entry(0x01, 7, UINT32_MAX) + entry(0x02, 5, 1000) +
                            entry(0x08, 5, 50) + entry(0x10, 7, UINT32_MAX) + entry(0x20, 0, UINT32_MAX));
  EXPECT_EQ(shift.ShiftXattr("system.posix_acl_access", "bad", "f").status().code(), EINVAL);
  EXPECT_EQ(shift.ShiftXattr("user.x", "anything", "f").value(), "anything");
}

TEST(ExcludedTest, GlobsMatchPathsOrNames) {
  const std::vector<std::string> globs = {"/tmp/*", "*.pyc", "var/cache/"};
  EXPECT_TRUE(Excluded(globs, "tmp/x"));
  EXPECT_TRUE(Excluded(globs, "tmp/x/y"));
  EXPECT_FALSE(Excluded(globs, "tmp"));
  EXPECT_TRUE(Excluded(globs, "usr/lib/a.pyc"));
  EXPECT_TRUE(Excluded(globs, "var/cache"));
  EXPECT_FALSE(Excluded(globs, "var/cache2"));
  EXPECT_FALSE(Excluded(globs, "usr/tmp/x"));
}

}  // namespace
}  // namespace strata::packdiff
