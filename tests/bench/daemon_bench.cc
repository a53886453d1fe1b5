// scripts/bench daemon (also run by scripts/bench launcher): the launcher
// daemon's rows, each beside a crun baseline measured in the same run.
//   - create -> first exec -> destroy through the API, 8 in flight, against
//     `crun run` of the same OCI config (seccomp precompiled), 8 in flight;
//   - exec of `true` in a live sandbox against `crun exec` in a live crun
//     container, and a function call (fncall back end) of `true`;
//   - N idle sandboxes at once (default 500): memory each (MemAvailable
//     drop / N) against N idle crun containers, and the creation rate while
//     they run.
// Usage: daemon_bench [CYCLES] [IDLE]
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launcher/api/client.h"
#include "launcher/container/oci_config.h"
#include "launcher/sandbox/seccomp.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "tests/bench/bench_layers.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/tree.h"

static int Body(int argc, char** argv) {
  using namespace strata;
  using namespace strata::bench;
  using nlohmann::json;
  const int cycles = argc > 1 ? std::atoi(argv[1]) : 200;
  const int idle = argc > 2 ? std::atoi(argv[2]) : 500;
  constexpr int kInFlight = 8;
  BusyboxLayer layer = PublishBusybox();
  const TempDir& dir = layer.dir;
  const std::string& tree = layer.tree;
  const std::string& store = layer.store;

  // The daemon, on its own socket, run directory and cgroup parent.
  BenchDaemon daemon(layer);
  launcher::LauncherClient client(dir.Sub("launcher.sock"));
  const json spec = {{"layers", {"bench:1"}}, {"store", store}};
  const json true_cmd = {{"argv", {"true"}}};
  auto exec_ok = [&](const std::string& id, const json& req) { ExecOk(client, id, req); };
  auto cycle = [&](int) {
    json info = Check(client.Create(spec));
    std::string id = info["id"];
    exec_ok(id, true_cmd);
    Check(client.Destroy(id));
  };
  for (int i = 0; i < 3; ++i) cycle(i);  // warm: layer mounted, binaries cached
  std::fprintf(stderr, "daemon_bench: create/exec/destroy cycles...\n");
  Figures ours = Measure(cycles, kInFlight, cycle);
  std::fprintf(stderr, "daemon_bench: crun run...\n");

  // crun: the same OCI config on a plain directory, seccomp precompiled.
  launcher::ContainerConfig c;
  c.rootfs = tree;
  c.hostname = "bench";
  c.agent_binary = "/bin/true";
  c.agent_socket_dir = dir.path();
  c.env = {"PATH=/bin"};
  Check(launcher::EnsureSharedMounts());
  // Its /dev, as a sandbox's: one directory all of its containers bind.
  c.dev_dir = Check(launcher::MakeSandboxDev("bench-crun", c.idmap.host));
  json config = launcher::OciConfig(c);
  config["linux"].erase("cgroupsPath");  // crun then uses each container's id
  auto& mounts = config["mounts"];
  for (auto it = mounts.begin(); it != mounts.end();) {
    std::string d = (*it)["destination"];
    it = d.starts_with("/.strata") ? mounts.erase(it) : it + 1;
  }
  config["annotations"]["run.oci.seccomp_bpf_data"] = Check(launcher::CompileSeccomp(launcher::DefaultSeccompProfile()));
  config["process"]["args"] = {"true"};
  Check(MakeDirs(dir.Sub("bundle-true")));
  Check(WriteFileAtomic(dir.Sub("bundle-true/config.json"), config.dump()));
  const std::string tag = StrCat("bench-", ::getpid(), "-");
  Figures crun_run = Measure(cycles, kInFlight, [&](int i) {
    Check(RunChecked({.argv = {"crun", "run", "--bundle", dir.Sub("bundle-true"), tag + std::to_string(i)}}, "crun run").status());
  });

  std::fprintf(stderr, "daemon_bench: exec latency...\n");
  // Exec latency: a live sandbox, a function call, a live crun container.
  std::string live = Check(client.Create(spec))["id"];
  for (int i = 0; i < 3; ++i) exec_ok(live, true_cmd);
  Figures exec = Measure(cycles, 1, [&](int) { exec_ok(live, true_cmd); });
  json fn_spec = spec;
  fn_spec["backend"] = "fncall";
  std::string fn = Check(client.Create(fn_spec))["id"];
  for (int i = 0; i < 3; ++i) exec_ok(fn, true_cmd);
  Figures call = Measure(cycles, 1, [&](int) { exec_ok(fn, true_cmd); });
  config["process"]["args"] = {"sleep", "100000"};
  Check(MakeDirs(dir.Sub("bundle-sleep")));
  Check(WriteFileAtomic(dir.Sub("bundle-sleep/config.json"), config.dump()));
  const std::string sleeper = tag + "sleeper";
  auto detached = [](std::vector<std::string> args) {  // the container keeps no pipe of ours
    auto r = RunCommand({.argv = std::move(args), .stdout_mode = StdStream::kNull, .stderr_mode = StdStream::kNull});
    if (!r.ok() || !r->success()) Check(Error(EIO, "crun run --detach failed"));
  };
  detached({"crun", "run", "--detach", "--bundle", dir.Sub("bundle-sleep"), sleeper});
  Figures crun_exec = Measure(cycles, 1, [&](int) {
    Check(RunChecked({.argv = {"crun", "exec", sleeper, "true"}}, "crun exec").status());
  });
  RunCommand({.argv = {"crun", "delete", "--force", sleeper}}).status().IgnoreError();
  Check(client.Destroy(live));
  Check(client.Destroy(fn));

  std::fprintf(stderr, "daemon_bench: %d idle sandboxes...\n", idle);
  // N idle sandboxes; then N idle crun containers (sleep) for the baseline.
  const uint64_t before = MemAvailableKiB();
  std::vector<std::string> ids(static_cast<size_t>(idle));
  Figures fill = Measure(idle, kInFlight, [&](int i) { ids[static_cast<size_t>(i)] = Check(client.Create(spec))["id"]; });
  const uint64_t with_idle = MemAvailableKiB();
  Figures more = Measure(std::max(idle / 10, 8), kInFlight, [&](int) { cycle(0); });
  Measure(idle, kInFlight, [&](int i) { Check(client.Destroy(ids[static_cast<size_t>(i)])); });
  std::fprintf(stderr, "daemon_bench: %d idle crun containers...\n", idle);
  const uint64_t before_crun = MemAvailableKiB();
  Measure(idle, kInFlight, [&](int i) {
    detached({"crun", "run", "--detach", "--bundle", dir.Sub("bundle-sleep"), StrCat(tag, "idle-", i)});
  });
  const uint64_t with_crun = MemAvailableKiB();
  Measure(idle, kInFlight, [&](int i) {
    RunCommand({.argv = {"crun", "delete", "--force", StrCat(tag, "idle-", i)}}).status().IgnoreError();
  });

  daemon.Stop();

  auto kib_each = [&](uint64_t a, uint64_t b) { return a > b ? static_cast<double>(a - b) / idle : 0.0; };
  const double ours_kib = kib_each(before, with_idle), crun_kib = kib_each(before_crun, with_crun);
  std::printf("launcher daemon, %d cycles, %d in flight; exec/call latency one at a time; %d idle sandboxes\n", cycles, kInFlight, idle);
  Table t({"measure", "p50 ms", "p99 ms", "per s", "baseline", "baseline p50 ms", "baseline per s", "ratio"});
  t.Add({"create -> exec true -> destroy (API)", Fixed(ours.p50_ms, 1), Fixed(ours.p99_ms, 1), Fixed(ours.per_second, 1),
         "crun run true", Fixed(crun_run.p50_ms, 1), Fixed(crun_run.per_second, 1),
         Fixed(ours.per_second / crun_run.per_second, 2) + " (rate)"});
  t.Add({"exec true in a live sandbox (API)", Fixed(exec.p50_ms, 2), Fixed(exec.p99_ms, 2), Fixed(exec.per_second, 1),
         "crun exec true", Fixed(crun_exec.p50_ms, 2), Fixed(crun_exec.per_second, 1), Fixed(exec.p50_ms / crun_exec.p50_ms, 2) + " (p50)"});
  t.Add({"fncall: call true (API)", Fixed(call.p50_ms, 2), Fixed(call.p99_ms, 2), Fixed(call.per_second, 1),
         "crun exec true", Fixed(crun_exec.p50_ms, 2), Fixed(crun_exec.per_second, 1), Fixed(call.p50_ms / crun_exec.p50_ms, 2) + " (p50)"});
  t.Add({StrCat("create ", idle, " idle sandboxes"), Fixed(fill.p50_ms, 1), Fixed(fill.p99_ms, 1), Fixed(fill.per_second, 1), "", "", "", ""});
  t.Add({StrCat("create -> exec -> destroy with ", idle, " running"), Fixed(more.p50_ms, 1), Fixed(more.p99_ms, 1),
         Fixed(more.per_second, 1), "same, none running", Fixed(ours.p50_ms, 1), Fixed(ours.per_second, 1),
         Fixed(more.per_second / ours.per_second, 2) + " (rate)"});
  t.Add({"memory per idle sandbox (KiB, MemAvailable drop / N)", Fixed(ours_kib, 0), "", "", "idle crun container (sleep)",
         Fixed(crun_kib, 0), "", Fixed(crun_kib > 0 ? ours_kib / crun_kib : 0, 2)});
  t.Print();
  launcher::RemoveSandboxDev("bench-crun").IgnoreError();
  return 0;
}

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return Body(argc, argv); });
}
