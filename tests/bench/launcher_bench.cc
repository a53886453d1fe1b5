// scripts/bench launcher: `launcher run ... -- sh -c 'echo hi'` against
// `crun run` of the same command on a plain directory rootfs (same OCI
// config: namespaces, user namespace, cgroups, seccomp), and against
// `unshare --mount --pid --net --uts --ipc --fork chroot`, in one run.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launcher/container/oci_config.h"
#include "launcher/sandbox/sandbox.h"
#include "launcher/sandbox/seccomp.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "tests/bench/bench_layers.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/tree.h"

namespace strata::bench {
namespace {

// Runs every contender once per round, round after round, so that drift on
// a noisy machine (a btrfs cleaner deleting old subvolumes, another job)
// falls on all of them alike. Rate: runs per second of the contender's own time.
std::vector<Figures> MeasureInterleaved(int runs, const std::vector<std::function<void(int)>>& contenders) {
  std::vector<std::vector<double>> ms(contenders.size());
  for (int i = 0; i < runs; ++i) {
    for (size_t c = 0; c < contenders.size(); ++c) {
      auto t0 = Clock::now();
      contenders[c](i);
      ms[c].push_back(Seconds(Clock::now() - t0) * 1000);
    }
  }
  std::vector<Figures> out;
  for (auto& m : ms) {
    double total_ms = 0;
    for (double v : m) total_ms += v;
    out.push_back({Percentile(m, 50), Percentile(m, 99), runs * 1000.0 / total_ms});
  }
  return out;
}

void RunOk(SubprocessOptions o) {
  const std::string program = o.argv[0];
  auto r = RunCommand(std::move(o));
  Check(r.status());
  if (!r->success() || r->out != "hi\n") Check(Error(EIO, StrCat(program, " ", r->Describe(), ": ", r->out, r->err)));
}

}  // namespace
}  // namespace strata::bench

static int Body(int argc, char** argv) {
  using namespace strata;
  using namespace strata::bench;
  const int runs = argc > 1 ? std::atoi(argv[1]) : 200;
  BusyboxLayer layer = PublishBusybox();
  const TempDir& dir = layer.dir;
  const std::string& tree = layer.tree;
  const std::string& store = layer.store;

  const std::string launcher = SelfDir() + "/../../launcher/launcher";
  const std::vector<std::string> env = {"STRATA_STORE=" + store, "STRATA_LAZYFS_SOCKET=" + dir.Sub("lazyfs.sock"),
                                        "STRATA_CACHE=" + dir.Sub("cache"), "STRATA_RUN_DIR=" + dir.Sub("run")};
  const std::vector<std::string> cmd = {"sh", "-c", "echo hi"};

  // Warm: the layer mounted by lazyfs, crun's binary in the page cache.
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> args = {launcher, "run", "--no-daemon", "--layer", "bench:1", "--"};
    args.insert(args.end(), cmd.begin(), cmd.end());
    RunOk({.argv = args, .env = env});
  }
  auto ours = [&](int) {
    std::vector<std::string> args = {launcher, "run", "--no-daemon", "--layer", "bench:1", "--"};
    args.insert(args.end(), cmd.begin(), cmd.end());
    RunOk({.argv = args, .env = env});
  };

  // crun on a plain directory, with the sandbox's own OCI config minus the agent.
  launcher::ContainerConfig c;
  c.rootfs = tree;
  c.hostname = "bench";
  c.cgroup_path = "/strata/bench";
  c.agent_binary = "/bin/true";
  c.agent_socket_dir = dir.path();
  c.env = {"PATH=/bin"};
  Check(launcher::EnsureSharedMounts());
  // Its /dev, as a sandbox's: one directory all of its containers bind.
  c.dev_dir = Check(launcher::MakeSandboxDev("bench-crun", c.idmap.host));
  auto config = launcher::OciConfig(c);
  config["process"]["args"] = cmd;
  auto& mounts = config["mounts"];
  for (auto it = mounts.begin(); it != mounts.end();) {
    std::string d = (*it)["destination"];
    it = d.starts_with("/.strata") ? mounts.erase(it) : it + 1;
  }
  // As crun users run it: crun compiles the seccomp profile every time.
  Check(MakeDirs(dir.Sub("bundle")));
  Check(WriteFileAtomic(dir.Sub("bundle/config.json"), config.dump()));
  auto crun = [&](int i) {
    RunOk({.argv = {"crun", "run", "--bundle", dir.Sub("bundle"), StrCat("bench-", ::getpid(), "-", i)}});
  };
  // With the profile precompiled, as strata hands it to crun.
  config["annotations"]["run.oci.seccomp_bpf_data"] =
      Check(launcher::CompileSeccomp(launcher::DefaultSeccompProfile()));
  Check(MakeDirs(dir.Sub("bundle-bpf")));
  Check(WriteFileAtomic(dir.Sub("bundle-bpf/config.json"), config.dump()));
  auto crun_bpf = [&](int i) {
    RunOk({.argv = {"crun", "run", "--bundle", dir.Sub("bundle-bpf"), StrCat("bench-bpf-", ::getpid(), "-", i)}});
  };

  auto unshare = [&](int) {
    std::vector<std::string> args = {"unshare", "--mount", "--pid", "--net", "--uts", "--ipc", "--fork", "chroot", tree};
    args.insert(args.end(), cmd.begin(), cmd.end());
    RunOk({.argv = args});
  };
  const std::vector<Figures> figures = MeasureInterleaved(runs, {ours, crun, crun_bpf, unshare});

  // Stop the lazyfs daemon this run started, and wait until its mounts are gone.
  RunCommand({.argv = {"pkill", "-TERM", "-f", "lazyfs daemon --socket " + dir.Sub("lazyfs.sock")}}).status().IgnoreError();
  for (int i = 0; i < 500 && RunCommand({.argv = {"pgrep", "-f", "lazyfs daemon --socket " + dir.Sub("lazyfs.sock")}})->success(); ++i) {
    ::usleep(10000);
  }

  Table table({"measure", "p50 ms", "p99 ms", "sandboxes/s", "p50 ratio to crun run"});
  auto row = [&](const char* name, const Figures& f) {
    table.Add({name, Fixed(f.p50_ms, 1), Fixed(f.p99_ms, 1), Fixed(f.per_second, 1), Fixed(f.p50_ms / figures[1].p50_ms, 2)});
  };
  row("launcher run -- sh -c 'echo hi'", figures[0]);
  row("crun run (plain dir, same config; crun compiles seccomp)", figures[1]);
  row("crun run (plain dir, same config, seccomp precompiled)", figures[2]);
  row("unshare ... chroot", figures[3]);
  std::printf("%d runs each, one at a time, the four interleaved; target: launcher p50 ratio <= 1.3\n", runs);
  table.Print();
  launcher::RemoveSandboxDev("bench-crun").IgnoreError();
  return 0;
}

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return Body(argc, argv); });
}
