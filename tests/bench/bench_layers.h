// What the launcher, daemon and API benches start from: a busybox root in
// a fresh directory, built and published as the layer bench:1.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/subprocess.h"
#include "launcher/api/client.h"

namespace strata::bench {

struct BusyboxLayer {
  TempDir dir;        // everything the bench makes (0711: sandboxes reach their rootfs)
  std::string tree;   // the busybox root (for baselines that run it directly)
  std::string store;  // file:// store holding bench:1
};

// Throws (Check) on failure, like every bench step.
BusyboxLayer PublishBusybox();

// The launcher daemon on `layer`'s store, with its own socket
// (`layer.dir`/launcher.sock), run directory, lazyfs and cgroup parent
// strata-bench; answering once constructed. Stop(), or the destructor
// when a bench step threw, destroys the sandboxes it still holds, stops it
// and its lazyfs daemon (which outlives it otherwise, with its mounts) and
// removes their cgroups.
class BenchDaemon {
 public:
  explicit BenchDaemon(const BusyboxLayer& layer);
  BenchDaemon(const BenchDaemon&) = delete;
  BenchDaemon& operator=(const BenchDaemon&) = delete;
  ~BenchDaemon() { Stop(); }
  void Stop();

 private:
  const BusyboxLayer& layer_;
  std::optional<Subprocess> process_;
};

// Runs `request` in sandbox `id`, output dropped; throws unless it exits 0.
void ExecOk(launcher::LauncherClient& client, const std::string& id, const nlohmann::json& request);

}  // namespace strata::bench
