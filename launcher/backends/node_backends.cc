// The back ends the node composes (as crun's handler table lists its
// runtimes): each adds its own kinds; generic code only walks the table.
#include "launcher/backends/node_backends.h"

#include <cstdio>
#include <cstdlib>

#include "launcher/container/container_backend.h"
#include "launcher/vm/microvm_backend.h"

namespace strata::launcher {

std::shared_ptr<const BackendTable> NodeBackends() {
  static const std::shared_ptr<const BackendTable> table = [] {
    auto t = std::make_shared<BackendTable>();
    for (Status s : {AddContainerBackends(*t), AddMicroVmBackend(*t)}) {
      if (!s.ok()) {  // (two kinds of one name: a build's mistake)
        std::fprintf(stderr, "launcher: %s\n", s.ToString().c_str());
        std::abort();
      }
    }
    return std::shared_ptr<const BackendTable>(std::move(t));
  }();
  return table;
}

}  // namespace strata::launcher
