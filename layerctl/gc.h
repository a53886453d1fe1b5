// Garbage collection of a store: deletes what no tag reaches, only after it
// has been unreachable for a grace period, and never a layer some node holds
// a fresh lease on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/catalog.h"

namespace strata::layerctl {

struct GcOptions {
  int64_t grace_seconds = 24 * 3600;
  int64_t now = 0;      // unix seconds; 0: the clock
  bool dry_run = false;
};

struct GcReport {
  uint64_t reachable_layers = 0;
  uint64_t leased_layers = 0;
  uint64_t objects_scanned = 0;
  uint64_t newly_unreachable = 0;  // first seen unreachable in this run
  uint64_t waiting = 0;            // unreachable, grace period not over yet
  uint64_t deleted = 0;
  uint64_t bytes_deleted = 0;
  std::vector<std::string> deleted_keys;  // filled on dry runs
};

// One pass. What is reachable: every tag's layer, every layer with an
// unexpired lease, and transitively their parents; of a reachable layer its
// manifest, access list, metadata image and extents.
//
// Unreachable objects are recorded in gc/state.json with the time they were
// first seen unreachable; a later pass deletes those still unreachable once
// the grace period has passed (manifests before the chunks they name). A
// push must finish within the grace period. Run one gc per store at a time.
Result<GcReport> CollectGarbage(const cache::Catalog& catalog, const GcOptions& options);

}  // namespace strata::layerctl
