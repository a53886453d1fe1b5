// IdShift: maps the host ids of a sandbox's upper directory back to the
// container's view (docs/formats.md, "Diff layers"), owners and the ids
// inside xattrs alike, so a layer never depends on the node that made it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata::packdiff {

struct IdShift {
  uint32_t shift = 0;      // host id = container id + shift
  uint32_t count = 65536;  // container ids 0 .. count-1

  // The container id of `host_id`; ERANGE naming `what` (e.g. "uid of
  // usr/bin/x") when it lies outside [shift, shift + count).
  Result<uint32_t> ToContainer(uint32_t host_id, std::string_view what) const;

  // The value of xattr `name` with the ids inside it mapped back:
  // security.capability v3 (its root id; v1 and v2 carry none) and
  // system.posix_acl_access / system.posix_acl_default (user and group
  // entries). Other xattrs come back unchanged. EINVAL for a value of the
  // wrong shape, ERANGE for an id outside the range.
  Result<std::string> ShiftXattr(std::string_view name, std::string_view value, std::string_view path) const;
};

}  // namespace strata::packdiff
