// PublishBusybox for the benches.
#include "tests/bench/bench_layers.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/catalog.h"
#include "common/strings.h"
#include "launcher/api/client.h"
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

BenchDaemon::BenchDaemon(const BusyboxLayer& layer) : layer_(layer) {
  const TempDir& dir = layer.dir;
  const std::vector<std::string> env = {"STRATA_STORE=" + layer.store, "STRATA_LAZYFS_SOCKET=" + dir.Sub("lazyfs.sock"),
                                        "STRATA_CACHE=" + dir.Sub("cache"), "STRATA_RUN_DIR=" + dir.Sub("run"),
                                        "STRATA_CGROUP_PARENT=strata-bench"};
  process_.emplace(Check(Subprocess::Start({.argv = {SelfDir() + "/../../launcher/launcher", "serve", "--socket", dir.Sub("launcher.sock"),
                                                     "--state", dir.Sub("state")},
                                            .env = env, .stdout_mode = StdStream::kNull, .stderr_mode = StdStream::kFile,
                                            .stderr_file = dir.Sub("daemon.log")})));
  launcher::LauncherClient client(dir.Sub("launcher.sock"));
  for (int i = 0; i < 500 && !client.Alive(); ++i) ::usleep(10000);
  if (!client.Alive()) {
    Stop();  // (a throwing constructor runs no destructor)
    Check(Error(EIO, "the daemon did not start; see " + dir.Sub("daemon.log")));
  }
}

void ExecOk(launcher::LauncherClient& client, const std::string& id, const nlohmann::json& request) {
  auto r = Check(client.Exec(id, request, [](int, std::string_view) {}));
  if (r.exit_code != 0) Check(Error(EIO, "exec in " + id + " failed"));
}

void BenchDaemon::Stop() {
  if (!process_) return;
  {
    // What a bench step that threw left (after a clean run: nothing).
    launcher::LauncherClient client(layer_.dir.Sub("launcher.sock"));
    if (auto list = client.List(); list.ok()) {
      for (const auto& sb : *list) client.Destroy(sb.value("id", "")).IgnoreError();
    }
  }
  process_->Kill(SIGTERM);
  process_->Wait().status().IgnoreError();
  process_.reset();
  const std::string lazyfs = "lazyfs daemon --socket " + layer_.dir.Sub("lazyfs.sock");
  RunCommand({.argv = {"pkill", "-TERM", "-f", lazyfs}}).status().IgnoreError();
  for (int i = 0; i < 500 && RunCommand({.argv = {"pgrep", "-f", lazyfs}})->success(); ++i) ::usleep(10000);
  for (const char* controller : {"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "hugetlb", "memory", "pids", "systemd", "unified"}) {
    ::rmdir(StrCat("/sys/fs/cgroup/", controller, "/strata-bench").c_str());
  }
  ::rmdir("/sys/fs/cgroup/cpu/strata-bench-node");  // the daemon's own
}

}  // namespace strata::bench
