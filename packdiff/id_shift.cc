// Host ids back to the container's view, in owners, capabilities and ACLs.
#include "packdiff/id_shift.h"

#include <cstring>

#include "common/strings.h"

namespace strata::packdiff {
namespace {

// <linux/capability.h>: struct vfs_ns_cap_data, little-endian.
constexpr uint32_t kCapRevisionMask = 0xFF000000;
constexpr uint32_t kCapRevision3 = 0x03000000;
constexpr size_t kCapV3Size = 24;
constexpr size_t kCapRootIdOffset = 20;

// <linux/posix_acl_xattr.h>: a version word, then (tag, perm, id) entries.
constexpr uint32_t kAclVersion = 2;
constexpr size_t kAclHeader = 4, kAclEntry = 8;
constexpr uint16_t kAclUser = 0x02, kAclGroup = 0x08;

uint32_t Le32(const char* p) {
  uint8_t b[4];
  std::memcpy(b, p, 4);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}
uint16_t Le16(const char* p) {
  uint8_t b[2];
  std::memcpy(b, p, 2);
  return static_cast<uint16_t>(b[0] | b[1] << 8);
}
void PutLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

Result<uint32_t> IdShift::ToContainer(uint32_t host_id, std::string_view what) const {
  if (host_id < shift || host_id - shift >= count) {
    return Error(ERANGE, StrCat(what, " is host id ", host_id, ", outside the sandbox's range ", shift, "..",
                                uint64_t{shift} + count - 1, " (--uid-shift ", shift, ")"));
  }
  return host_id - shift;
}

Result<std::string> IdShift::ShiftXattr(std::string_view name, std::string_view value, std::string_view path) const {
  std::string out(value);
  if (name == "security.capability") {
    if (value.size() < 4) {
      return Error(EINVAL, StrCat(Quote(path), ": security.capability of ", value.size(), " bytes is malformed"));
    }
    if ((Le32(value.data()) & kCapRevisionMask) != kCapRevision3) return out;  // v1, v2: no root id
    if (value.size() != kCapV3Size) {
      return Error(EINVAL, StrCat(Quote(path), ": security.capability v3 of ", value.size(), " bytes (expected ",
                                  kCapV3Size, ")"));
    }
    STRATA_ASSIGN_OR_RETURN(uint32_t root, ToContainer(Le32(value.data() + kCapRootIdOffset),
                                                       StrCat("the root id in security.capability of ", Quote(path))));
    PutLe32(out.data() + kCapRootIdOffset, root);
    return out;
  }
  if (name == "system.posix_acl_access" || name == "system.posix_acl_default") {
    if (value.size() < kAclHeader || (value.size() - kAclHeader) % kAclEntry != 0 ||
        Le32(value.data()) != kAclVersion) {
      return Error(EINVAL, StrCat(Quote(path), ": ", name, " is not a version 2 POSIX ACL"));
    }
    for (size_t off = kAclHeader; off < value.size(); off += kAclEntry) {
      const uint16_t tag = Le16(value.data() + off);
      if (tag != kAclUser && tag != kAclGroup) continue;  // the others carry no id
      STRATA_ASSIGN_OR_RETURN(
          uint32_t id, ToContainer(Le32(value.data() + off + 4),
                                   StrCat("a ", tag == kAclUser ? "user" : "group", " in ", name, " of ", Quote(path))));
      PutLe32(out.data() + off + 4, id);
    }
    return out;
  }
  return out;
}

}  // namespace strata::packdiff
