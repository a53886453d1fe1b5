// What the launcher, daemon and API benches start from: a busybox root in
// a fresh directory, built and published as the layer bench:1.
#pragma once

#include <string>

#include "common/fs.h"

namespace strata::bench {

struct BusyboxLayer {
  TempDir dir;        // everything the bench makes (0711: sandboxes reach their rootfs)
  std::string tree;   // the busybox root (for baselines that run it directly)
  std::string store;  // file:// store holding bench:1
};

// Throws (Check) on failure, like every bench step.
BusyboxLayer PublishBusybox();

}  // namespace strata::bench
