// launcher doctor: checks every prerequisite of container sandboxes and says
// how to fix what is missing; with `fix`, repairs what it safely can.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/sandbox/sandbox.h"

namespace strata::launcher {

struct DoctorCheck {
  std::string name;
  bool ok = false;
  bool fixed = false;    // was broken, repaired now
  std::string detail;    // what was found, or how to fix it
};

struct DoctorOptions {
  bool fix = false;
  // Size of the loop-file btrfs created for sandbox uppers when none exists.
  uint64_t uppers_size = uint64_t{64} << 30;
};

std::vector<DoctorCheck> RunDoctor(const NodeConfig& node, const DoctorOptions& options);

}  // namespace strata::launcher
