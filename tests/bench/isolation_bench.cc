// scripts/bench isolation: what file rules and a hostile neighbour cost.
//   - exec of `true` in a sandbox with file rules (a denied directory and
//     two read-only ones) against the same sandbox's exec without them;
//   - a quiet sandbox's exec latency while another sandbox runs a fork
//     bomb (under --pids) and while another streams output as fast as it
//     can through the API, against the same exec on a quiet node.
// Usage: isolation_bench [EXECS]
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launcher/api/client.h"
#include "tests/bench/bench_layers.h"
#include "tests/bench/bench_util.h"

static int Body(int argc, char** argv) {
  using namespace strata;
  using namespace strata::bench;
  using nlohmann::json;
  const int execs = argc > 1 ? std::atoi(argv[1]) : 300;
  BusyboxLayer layer = PublishBusybox();
  const TempDir& dir = layer.dir;

  BenchDaemon daemon(layer);
  launcher::LauncherClient client(dir.Sub("launcher.sock"));
  const json spec = {{"layers", {"bench:1"}}, {"store", layer.store}};
  const json true_cmd = {{"argv", {"true"}}};
  auto exec_ok = [&](const std::string& id, const json& req) { ExecOk(client, id, req); };
  auto measure_exec = [&](const std::string& id, const json& req) {
    for (int i = 0; i < 5; ++i) exec_ok(id, req);
    return Measure(execs, 1, [&](int) { exec_ok(id, req); });
  };

  // File rules: the same sandbox, alternating runs with and without them.
  std::fprintf(stderr, "isolation_bench: exec with and without file rules...\n");
  json ruled_spec = spec;
  ruled_spec["files"] = {{"deny", {"/grader"}}, {"read_only", {"/bin", "/etc"}}};
  const std::string ruled = Check(client.Create(ruled_spec))["id"];
  json grader_cmd = true_cmd;
  grader_cmd["role"] = "grader";  // the same sandbox, its rules left out
  Figures with_rules{}, without{};
  for (int round = 0; round < 2; ++round) {  // alternated, so drift hits both
    Figures a = measure_exec(ruled, grader_cmd), b = measure_exec(ruled, true_cmd);
    if (round == 1 || a.p50_ms < without.p50_ms || without.p50_ms == 0) without = a;
    if (round == 1 || b.p50_ms < with_rules.p50_ms || with_rules.p50_ms == 0) with_rules = b;
  }
  Check(client.Destroy(ruled));

  // Neighbours: a quiet sandbox's exec, alone and beside a hostile one.
  std::fprintf(stderr, "isolation_bench: a neighbour's exec on a quiet node...\n");
  const std::string quiet = Check(client.Create(spec))["id"];
  Figures alone = measure_exec(quiet, true_cmd);

  std::fprintf(stderr, "isolation_bench: ... beside a fork bomb...\n");
  json bomb_spec = spec;
  bomb_spec["pids"] = 256;
  const std::string bomber = Check(client.Create(bomb_spec))["id"];
  std::thread bomb([&] {
    // Until the sandbox is destroyed: the exec ends with it.
    client.Exec(bomber, {{"argv", {"sh", "-c", "while :; do sleep 1000 & done"}}}, [](int, std::string_view) {}).status().IgnoreError();
  });
  ::sleep(2);
  Figures beside_bomb = measure_exec(quiet, true_cmd);
  Check(client.Destroy(bomber));
  bomb.join();

  std::fprintf(stderr, "isolation_bench: ... beside an output flood...\n");
  const std::string flooder = Check(client.Create(spec))["id"];
  std::thread flood([&] {
    // The agent reads all of it (what passes the cap is dropped there).
    client.Exec(flooder, {{"argv", {"cat", "/dev/zero"}}, {"output_cap", 64 << 20}}, [](int, std::string_view) {}).status().IgnoreError();
  });
  ::sleep(1);
  Figures beside_flood = measure_exec(quiet, true_cmd);
  Check(client.Destroy(flooder));
  flood.join();
  Check(client.Destroy(quiet));

  daemon.Stop();

  std::printf("isolation: exec true through the API, %d execs one at a time per row\n", execs);
  Table t({"measure", "p50 ms", "p99 ms", "baseline", "baseline p50 ms", "baseline p99 ms", "p50 +ms", "p99 ratio"});
  auto row = [&](const std::string& name, const Figures& f, const std::string& base_name, const Figures& base) {
    t.Add({name, Fixed(f.p50_ms, 2), Fixed(f.p99_ms, 2), base_name, Fixed(base.p50_ms, 2), Fixed(base.p99_ms, 2),
           Fixed(f.p50_ms - base.p50_ms, 2), Fixed(base.p99_ms > 0 ? f.p99_ms / base.p99_ms : 0, 2)});
  };
  row("exec with file rules (deny 1, read-only 2)", with_rules, "same sandbox, grader (no rules)", without);
  row("neighbour's exec during a fork bomb (--pids 256)", beside_bomb, "quiet node", alone);
  row("neighbour's exec during an output flood (cat /dev/zero)", beside_flood, "quiet node", alone);
  t.Print();
  return 0;
}

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return Body(argc, argv); });
}
