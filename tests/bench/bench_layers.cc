// PublishBusybox for the benches.
#include "tests/bench/bench_layers.h"

#include <sys/stat.h>

#include "cache/catalog.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/tree.h"

namespace strata::bench {

BusyboxLayer PublishBusybox() {
  BusyboxLayer l{Check(TempDir::Create("strata-bench")), "", ""};
  Check(::chmod(l.dir.path().c_str(), 0711) == 0 ? OkStatus() : ErrnoError(errno, "chmod " + l.dir.path()));
  l.tree = l.dir.Sub("busybox");
  Check(testing::MakeBusyboxRoot(l.tree));
  l.store = "file://" + l.dir.Sub("store");
  auto built = Check(layerctl::BuildLayer({.source = l.tree, .output_dir = l.dir.Sub("layer"), .name = "busybox"}));
  cache::Catalog catalog(Check(cache::OpenStore(l.store)));
  Check(layerctl::Push(built, catalog, cache::LayerRef{"bench", "1"}).status());
  return l;
}

}  // namespace strata::bench
