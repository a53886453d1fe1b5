// scripts/bench vm: the microVM back end, each row beside a baseline
// measured in the same run.
//   - create -> first exec -> destroy through the API (one at a time)
//     against a bare QEMU boot of the same kernel, same machine and
//     accelerator, with an initramfs whose init powers off at once (the
//     agent finding no disks): the target is 1.3x;
//   - exec of `true` in a live microVM against the same in a live container;
//   - N idle microVMs at once (default 16, 128 MiB each): MemAvailable drop
//     per VM, and QEMU's resident memory (its own beside what guest RAM the
//     guest touched).
// Usage: vm_bench [CYCLES] [IDLE]
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launcher/api/client.h"
#include "launcher/sandbox/sandbox.h"
#include "tests/bench/bench_layers.h"
#include "tests/bench/bench_util.h"
#include "vmm/guest_files.h"
#include "vmm/qemu.h"

namespace {

// Resident KiB of a process (VmRSS), 0 when gone.
uint64_t RssKiB(pid_t pid) {
  std::ifstream in(strata::StrCat("/proc/", pid, "/status"));
  std::string key;
  uint64_t value = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
  }
  return 0;
}

}  // namespace

static int Body(int argc, char** argv) {
  using namespace strata;
  using namespace strata::bench;
  using nlohmann::json;
  const int cycles = argc > 1 ? std::atoi(argv[1]) : 20;
  const int idle = argc > 2 ? std::atoi(argv[2]) : 16;
  launcher::NodeConfig node = launcher::NodeConfig::FromEnvironment();
  if (node.agent_binary.empty()) node.agent_binary = SelfDir() + "/../../launcher/strata-agent";
  if (::access(node.vm_kernel.c_str(), R_OK) != 0) Check(Error(ENOENT, "no guest kernel at " + node.vm_kernel + ": run scripts/guest-kernel"));
  BusyboxLayer layer = PublishBusybox();
  const TempDir& dir = layer.dir;
  BenchDaemon daemon(layer);
  launcher::LauncherClient client(dir.Sub("launcher.sock"));
  const json vm_spec = {{"layers", {"bench:1"}}, {"store", layer.store}, {"backend", "microvm"}, {"memory", 128 << 20}};
  const json ct_spec = {{"layers", {"bench:1"}}, {"store", layer.store}};
  const json true_cmd = {{"argv", {"true"}}};

  // One create -> first exec -> destroy; returns the ms to the first exec's end.
  auto cycle = [&] {
    const auto t0 = Clock::now();
    std::string id = Check(client.Create(vm_spec))["id"];
    ExecOk(client, id, true_cmd);
    const double first_ms = Seconds(Clock::now() - t0) * 1000;
    Check(client.Destroy(id));
    return first_ms;
  };
  cycle();  // warm: the layer mounted, the disk image, initramfs and the stack's template made

  // The baseline: the same kernel, machine and accelerator, no disks; its
  // init (the agent, finding none) powers off at once.
  const std::string initramfs = Check(vmm::EnsureInitramfs(node.agent_binary, {}, node.vm_cache));
  const std::vector<std::string> bare = vmm::BareBootCommandLine(node.vm_kernel, initramfs, node.vm_accel);
  auto boot_once = [&] {
    auto r = Check(RunCommand({.argv = bare, .timeout = std::chrono::seconds(120)}));
    if (r.timed_out) Check(Error(ETIMEDOUT, "a bare boot did not power off in 120 s"));
  };
  // Interleaved, one of each in turn, so both see the same noise.
  std::fprintf(stderr, "vm_bench: %d create/exec/destroy cycles and as many bare boots...\n", cycles);
  std::vector<double> ours_ms, boot_ms, cold_first_ms;
  for (int i = 0; i < cycles; ++i) {
    auto t0 = Clock::now();
    cold_first_ms.push_back(cycle());
    auto t1 = Clock::now();
    boot_once();
    auto t2 = Clock::now();
    ours_ms.push_back(Seconds(t1 - t0) * 1000);
    boot_ms.push_back(Seconds(t2 - t1) * 1000);
  }
  Figures ours{Median(ours_ms), Percentile(ours_ms, 99), 0};
  Figures boot{Median(boot_ms), Percentile(boot_ms, 99), 0};
  Figures cold_first{Median(cold_first_ms), Percentile(cold_first_ms, 99), 0};

  // The first create of a stack: no template yet, so it boots (and saves
  // one before it answers); each after the cycles above resumed from it.
  const int firsts = std::min(cycles, 5);
  std::vector<double> booted_ms, first_boot_ms;
  for (int i = 0; i < firsts; ++i) {
    RemoveTree(node.uppers + "/.vm-templates/saved").IgnoreError();
    auto t0 = Clock::now();
    cycle();
    auto t1 = Clock::now();
    boot_once();
    booted_ms.push_back(Seconds(t1 - t0) * 1000);
    first_boot_ms.push_back(Seconds(Clock::now() - t1) * 1000);
  }
  Figures booted{Median(booted_ms), Percentile(booted_ms, 99), 0};
  Figures first_boot{Median(first_boot_ms), Percentile(first_boot_ms, 99), 0};

  // A warm pool of two booted guests: each create takes one while the
  // other waits (the pool boots a refill once takes pause for 200 ms, so
  // on two cores a take does not race a boot); timed one at a time, each
  // once the pool is full again.
  const int takes = std::min(cycles, 10);
  std::fprintf(stderr, "vm_bench: %d creates from a warm pool of microVMs...\n", takes);
  auto ready = [&] {
    for (const auto& p : Check(client.WarmPools())) return p.value("ready", 0);
    return 0;
  };
  auto wait_ready = [&] {
    for (int i = 0; i < 1200 && ready() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (ready() < 2) Check(Error(ETIMEDOUT, "the microVM warm pool was not full within 120 s"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // (its boot's tail, off the next take)
  };
  Check(client.SetWarmPool(vm_spec, 2));
  std::vector<double> pooled_ms;
  for (int i = 0; i < takes; ++i) {
    wait_ready();
    auto t0 = Clock::now();
    json made = Check(client.Create(vm_spec));
    const std::string id = made["id"];
    ExecOk(client, id, true_cmd);
    pooled_ms.push_back(Seconds(Clock::now() - t0) * 1000);
    if (!made.contains("warm_pool")) Check(Error(EIO, "a create with a ready pooled microVM was made cold"));
    Check(client.Destroy(id));
  }
  Check(client.SetWarmPool(vm_spec, 0));
  for (int i = 0; i < 300 && !Check(client.WarmPools()).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Figures pooled{Median(pooled_ms), Percentile(pooled_ms, 99), 0};

  std::fprintf(stderr, "vm_bench: exec latency...\n");
  std::string vm = Check(client.Create(vm_spec))["id"];
  std::string ct = Check(client.Create(ct_spec))["id"];
  for (int i = 0; i < 3; ++i) {
    ExecOk(client, vm, true_cmd);
    ExecOk(client, ct, true_cmd);
  }
  const int execs = cycles * 5;
  Figures vm_exec = Measure(execs, 1, [&](int) { ExecOk(client, vm, true_cmd); });
  Figures ct_exec = Measure(execs, 1, [&](int) { ExecOk(client, ct, true_cmd); });
  Check(client.Destroy(vm));
  Check(client.Destroy(ct));

  std::fprintf(stderr, "vm_bench: %d idle microVMs...\n", idle);
  const uint64_t before = MemAvailableKiB();
  std::vector<std::string> ids;
  for (int i = 0; i < idle; ++i) ids.push_back(Check(client.Create(vm_spec))["id"]);
  for (const auto& id : ids) ExecOk(client, id, true_cmd);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const uint64_t with_idle = MemAvailableKiB();
  uint64_t rss = 0;
  for (const auto& id : ids) {
    // The jail's waiter (vm.json) has one child: QEMU.
    auto text = ReadFileToString(StrCat(dir.Sub("run"), "/", id, "/vm/vm.json"));
    pid_t waiter = text.ok() ? json::parse(*text).value("pid", 0) : 0;
    auto children = ReadFileToString(StrCat("/proc/", waiter, "/task/", waiter, "/children"));
    if (children.ok() && !children->empty()) rss += RssKiB(std::atoi(children->c_str()));
  }
  for (const auto& id : ids) Check(client.Destroy(id));
  if (const char* keep = std::getenv("VM_BENCH_DAEMON_LOG")) {  // (with STRATA_LOG=debug: each step's time)
    Check(WriteFileAtomic(keep, ReadFileToString(dir.Sub("daemon.log")).value_or(""), false));
  }
  daemon.Stop();

  const double drop_kib = before > with_idle ? static_cast<double>(before - with_idle) / idle : 0;
  const double rss_kib = static_cast<double>(rss) / idle;
  std::printf("microVMs under %s (QEMU %s), busybox layer, 128 MiB guests; %d cycles one at a time; %d execs; %d idle\n",
              node.vm_accel.c_str(), "7.2", cycles, execs, idle);
  Table t({"measure", "p50 ms", "p99 ms", "baseline", "baseline p50 ms", "baseline p99 ms", "ratio"});
  t.Add({"create -> first exec -> destroy (API; resumed from the stack's template)", Fixed(ours.p50_ms, 0), Fixed(ours.p99_ms, 0),
         "bare QEMU boot to an init that powers off", Fixed(boot.p50_ms, 0), Fixed(boot.p99_ms, 0),
         Fixed(ours.p50_ms / boot.p50_ms, 2) + " (p50), " + Fixed(ours.p99_ms / boot.p99_ms, 2) + " (p99)"});
  t.Add({StrCat("the same, a stack's first create (boots, saves the template; ", firsts, ")"), Fixed(booted.p50_ms, 0),
         Fixed(booted.p99_ms, 0), "bare QEMU boot (interleaved with these)", Fixed(first_boot.p50_ms, 0), Fixed(first_boot.p99_ms, 0),
         Fixed(booted.p50_ms / first_boot.p50_ms, 2) + " (p50)"});
  t.Add({StrCat("create -> first exec from a warm pool (API, ", takes, ")"), Fixed(pooled.p50_ms, 1), Fixed(pooled.p99_ms, 1),
         "the same, cold (resumed: the first row)", Fixed(cold_first.p50_ms, 0), Fixed(cold_first.p99_ms, 0),
         Fixed(pooled.p50_ms / cold_first.p50_ms, 3) + " (p50)"});
  t.Add({"exec true in a live microVM (API)", Fixed(vm_exec.p50_ms, 2), Fixed(vm_exec.p99_ms, 2), "in a live container",
         Fixed(ct_exec.p50_ms, 2), Fixed(ct_exec.p99_ms, 2), Fixed(vm_exec.p50_ms / ct_exec.p50_ms, 2) + " (p50)"});
  t.Add({StrCat("memory per idle microVM (MiB, MemAvailable drop / ", idle, ")"), Fixed(drop_kib / 1024, 1), "",
         "guest RAM given", "128", "", Fixed(drop_kib / 1024 / 128, 2)});
  t.Add({"QEMU resident per idle microVM (MiB)", Fixed(rss_kib / 1024, 1), "", "guest RAM given", "128", "",
         Fixed(rss_kib / 1024 / 128, 2)});
  t.Print();
  return 0;
}

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return Body(argc, argv); });
}
