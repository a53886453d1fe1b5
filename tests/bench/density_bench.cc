// scripts/bench density: how fast a node makes sandboxes and how many it
// holds, each row beside a baseline measured in the same run.
//   - a warm pool against cold creates: a burst of POOL creates, 8 in
//     flight, each timed from create to the end of its first exec; and
//     create -> exec -> destroy cycles, 8 in flight, where the pool has to
//     refill (a refill costs what a cold create costs);
//   - creation rate (create -> exec -> destroy, 8 in flight) with none,
//     IDLE/3 and IDLE idle sandboxes running, also per core left by the
//     machine's PID 1 (on the development VM a supervisor that polls every
//     process: its CPU grows with the number of processes, strata's or not);
//     at each, exec latency, a warm pool's takes one at a time and a burst
//     of POOL from it, and the mean of each step of the cycles (the
//     daemon's strata_sandbox_step_seconds); a table of IDLE against none;
//   - memory per idle sandbox (MemAvailable drop / IDLE, page cache
//     dropped, the per-CPU lists' free pages counted as free) against IDLE idle crun containers of crun's default spec
//     (`crun spec`: pid, mount, network, ipc and uts namespaces of their
//     own, running sleep) on the same busybox root.
// Usage: density_bench [IDLE] [POOL]   (defaults 1000 and 64)
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launcher/api/client.h"
#include "tests/bench/bench_layers.h"
#include "tests/bench/bench_util.h"

namespace strata::bench {
namespace {

using nlohmann::json;

// Where memory goes: /proc/meminfo's kernel and process fields and every
// slab cache's bytes (active objects x object size), in KiB.
using Snapshot = std::map<std::string, double>;
Snapshot TakeSnapshot() {
  MemAvailableKiB();  // (drops the page cache first)
  Snapshot s;
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  double value;
  while (meminfo >> key >> value) {
    std::getline(meminfo, unit);
    key.pop_back();  // ':'
    for (const char* k : {"MemAvailable", "MemFree", "Cached", "Buffers", "Dirty", "AnonPages", "Shmem", "Slab", "SUnreclaim", "KernelStack",
                          "PageTables", "Percpu", "VmallocUsed", "Unevictable"}) {
      if (key == k) s["meminfo " + key] = value;
    }
  }
  // Free pages on the per-CPU lists are free memory too (MemAvailableKiB).
  const auto per_cpu_free = static_cast<double>(PerCpuFreeKiB());
  s["meminfo MemAvailable"] += per_cpu_free;
  s["meminfo MemFree"] += per_cpu_free;
  s["count: memory cgroups (live and dying)"] = MemoryCgroups();
  std::ifstream slab("/proc/slabinfo");
  std::string line;
  std::getline(slab, line);
  std::getline(slab, line);
  while (std::getline(slab, line)) {
    std::istringstream in(line);
    std::string name;
    double active = 0, total = 0, size = 0;
    in >> name >> active >> total >> size;
    s["slab " + name] = active * size / 1024;
  }
  return s;
}

// CPU seconds PID 1 has used, and its name.
double Pid1Seconds() {
  const std::string text = ReadFileToString("/proc/1/stat").value_or("");
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream f(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 0; i < 13 && f >> field; ++i) {
    if (i >= 11) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::string Pid1Name() {
  std::string name = ReadFileToString("/proc/1/comm").value_or("?");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

// What one more memory cgroup costs in kmalloc-1k (KiB, median of 5):
// mostly its shrinker slots, one 1 KiB block per 64 memory-cgroup-aware
// shrinkers (a superblock has one) the node has held at once since boot.
double NewMemoryCgroupKiB() {
  auto kmalloc_1k = [] {
    std::ifstream slab("/proc/slabinfo");
    std::string name;
    double active = 0;
    for (std::string line; std::getline(slab, line);) {
      std::istringstream in(line);
      if (in >> name >> active && name == "kmalloc-1k") return active;
    }
    return 0.0;
  };
  const std::string probe = StrCat("/sys/fs/cgroup/memory/strata-bench-probe-", ::getpid());
  std::vector<double> kib;
  for (int i = 0; i < 5; ++i) {
    const double before = kmalloc_1k();
    if (::mkdir(probe.c_str(), 0755) != 0) return 0;
    kib.push_back(kmalloc_1k() - before);
    ::rmdir(probe.c_str());
  }
  std::sort(kib.begin(), kib.end());
  return kib[kib.size() / 2];
}

// Superblocks a sandbox or container has of its own: the filesystems in
// its mount table that another one's does not show.
int OwnSuperblocks(pid_t one, pid_t another) {
  auto devices = [](pid_t pid) {
    std::set<std::string> out;
    std::ifstream in(StrCat("/proc/", pid, "/mountinfo"));
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string id, parent, dev;
      if (f >> id >> parent >> dev) out.insert(dev);
    }
    return out;
  };
  const auto a = devices(one), b = devices(another);
  int own = 0;
  for (const auto& d : a) own += b.count(d) ? 0 : 1;
  return a.empty() || b.empty() ? -1 : own;
}

pid_t FirstPid(const std::string& cgroup_procs) {
  std::ifstream in(cgroup_procs);
  pid_t pid = -1;
  in >> pid;
  return pid;
}

// The fields that grew most per sandbox, largest first.
std::vector<std::pair<std::string, double>> Growth(const Snapshot& before, const Snapshot& after, int n, size_t top) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [k, v] : after) {
    auto it = before.find(k);
    const double d = (v - (it == before.end() ? 0 : it->second)) / n;
    if (k == "meminfo MemAvailable") out.push_back({k + " (drop)", -d});
    else out.push_back({k, d});
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    const bool am = !a.first.starts_with("slab"), bm = !b.first.starts_with("slab");
    return am != bm ? am : a.second > b.second;
  });
  std::vector<std::pair<std::string, double>> kept;
  size_t slabs = 0;
  for (auto& e : out) {
    if (!e.first.starts_with("slab") || (slabs++ < top && e.second >= 0.5)) kept.push_back(std::move(e));
  }
  return kept;
}

// CPU seconds by process name (utime, stime and those of waited-for
// children, so a runtime that ran and was reaped counts for its parent).
using Cpu = std::map<std::string, double>;
using CpuByPid = std::map<std::string, std::pair<std::string, double>>;  // pid -> (name, seconds)
CpuByPid SampleCpu() {
  CpuByPid out;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::vector<std::string> pids;
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      if (std::isdigit(static_cast<unsigned char>(e->d_name[0]))) pids.push_back(e->d_name);
    }
    ::closedir(d);
  }
  for (const auto& pid : pids) {
    const std::string text = ReadFileToString("/proc/" + pid + "/stat").value_or("");
    const size_t open = text.find('('), close = text.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 2 > text.size()) continue;
    std::istringstream f(text.substr(close + 2));
    std::string field;
    double ticks = 0;
    for (int i = 0; i < 15 && f >> field; ++i) {
      if (i >= 11) ticks += std::stod(field);  // utime, stime, cutime, cstime
    }
    std::string name = text.substr(open + 1, close - open - 1);
    if (name.starts_with("kworker")) name = "kworker";  // (kworker/0:1H, ...)
    out[pid] = {name, ticks / tick};
  }
  return out;
}
// What each name used between two samples; a process that began between
// them counts whole, one that ended is lost (unless its parent waited).
Cpu CpuBetween(const CpuByPid& a, const CpuByPid& b) {
  Cpu out;
  for (const auto& [pid, v] : b) {
    auto it = a.find(pid);
    const double before = it != a.end() && it->second.first == v.first ? it->second.second : 0;
    if (v.second > before) out[v.first] += v.second - before;
  }
  return out;
}
// All CPU time the machine spent (user, nice, system, irq, softirq), s.
double BusySeconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq;
  return (user + nice + system + irq + softirq) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The daemon's step sums (strata_sandbox_step_seconds): (path, step) ->
// (seconds, count).
using Steps = std::map<std::string, std::pair<double, double>>;
Steps ScrapeSteps(launcher::LauncherClient& client) {
  Steps out;
  for (const auto& line : Split(Check(client.Metrics()), '\n')) {
    for (const char* kind : {"_sum{", "_count{"}) {
      const std::string prefix = StrCat("strata_sandbox_step_seconds", kind);
      if (!line.starts_with(prefix)) continue;
      const size_t close = line.rfind("} ");
      if (close == std::string::npos) continue;
      // {path="P",step="S"}
      std::string labels = line.substr(prefix.size(), close - prefix.size());
      const size_t comma = labels.find("\",step=\"");
      if (!labels.starts_with("path=\"") || comma == std::string::npos) continue;
      const std::string key = StrCat(labels.substr(6, comma - 6), ": ", labels.substr(comma + 8, labels.size() - comma - 9));
      (kind[1] == 's' ? out[key].first : out[key].second) = std::stod(line.substr(close + 2));
    }
  }
  return out;
}

// Each step's mean (ms) between two scrapes; steps taken fewer than `min` times are left out.
std::map<std::string, double> StepMeans(const Steps& before, const Steps& after, double min) {
  std::map<std::string, double> out;
  for (const auto& [key, value] : after) {
    auto it = before.find(key);
    const double n = value.second - (it == before.end() ? 0 : it->second.second);
    if (n >= min) out[key] = (value.first - (it == before.end() ? 0 : it->second.first)) / n * 1000;
  }
  return out;
}

int Body(int argc, char** argv) {
  const int idle = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int pool_size = argc > 2 ? std::atoi(argv[2]) : 64;
  constexpr int kInFlight = 8;
  BusyboxLayer layer = PublishBusybox();
  const TempDir& dir = layer.dir;
  BenchDaemon daemon(layer);
  launcher::LauncherClient client(dir.Sub("launcher.sock"));
  // No limits, as crun's default spec has none.
  const json spec = {{"layers", {"bench:1"}}, {"store", layer.store}};
  const json true_cmd = {{"argv", {"true"}}};
  auto exec_ok = [&](const std::string& id) { ExecOk(client, id, true_cmd); };
  auto cycle = [&](int) {
    std::string id = Check(client.Create(spec))["id"];
    exec_ok(id);
    Check(client.Destroy(id));
  };
  auto pool_ready = [&](int want) {
    for (int i = 0; i < 6000; ++i) {
      json pools = Check(client.WarmPools());
      int ready = 0;
      for (const auto& p : pools) ready += p.value("ready", 0);
      if (want == 0 ? pools.empty() : ready >= want) return;
      ::usleep(20000);
    }
    Check(Error(ETIMEDOUT, "the warm pool did not reach its size"));
  };
  for (int i = 0; i < 3; ++i) cycle(i);  // layer mounted, binaries cached

  // A burst of creates (to the first exec's end), from the pool and cold.
  std::vector<std::string> ids(static_cast<size_t>(pool_size));
  auto burst = [&] {
    Figures f = Measure(pool_size, kInFlight, [&](int i) {
      std::string id = Check(client.Create(spec))["id"];
      exec_ok(id);
      ids[static_cast<size_t>(i)] = id;
    });
    Measure(pool_size, kInFlight, [&](int i) { Check(client.Destroy(ids[static_cast<size_t>(i)])); });
    return f;
  };
  std::fprintf(stderr, "density_bench: a burst of %d from a warm pool...\n", pool_size);
  Check(client.SetWarmPool(spec, pool_size).status());
  pool_ready(pool_size);
  Figures warm_burst = burst();
  pool_ready(pool_size);
  // One at a time: the latency of a take.
  auto one_by_one = [&] {
    Figures f = Measure(pool_size, 1, [&](int i) {
      std::string id = Check(client.Create(spec))["id"];
      exec_ok(id);
      ids[static_cast<size_t>(i)] = id;
    });
    Measure(pool_size, kInFlight, [&](int i) { Check(client.Destroy(ids[static_cast<size_t>(i)])); });
    return f;
  };
  Figures warm_single = one_by_one();
  pool_ready(pool_size);
  std::fprintf(stderr, "density_bench: cycles with a pool refilling...\n");
  Figures warm_cycles = Measure(4 * pool_size, kInFlight, cycle);
  Check(client.SetWarmPool(spec, 0).status());
  pool_ready(0);
  std::fprintf(stderr, "density_bench: the same cold...\n");
  Figures cold_burst = burst();
  Figures cold_single = one_by_one();
  Figures cold_cycles = Measure(4 * pool_size, kInFlight, cycle);

  // Idle sandboxes, in three steps, with at each: the creation rate and
  // each step's time, exec latency, and a warm pool's takes.
  std::fprintf(stderr, "density_bench: %d idle sandboxes...\n", idle);
  const int rate_cycles = 64;
  std::vector<Figures> rates, execs, takes, bursts;
  std::vector<Cpu> cycle_cpu;           // by name, cores, during the cycles
  std::vector<double> cycle_busy;       // the machine's, cores
  Cpu quiet_cpu;                        // with IDLE idle and nothing asked, cores
  double quiet_busy = 0;
  std::vector<std::map<std::string, double>> step_means;
  std::vector<double> pid1_cores;  // PID 1's CPU during each, in cores
  std::vector<int> at;
  std::vector<std::string> held(static_cast<size_t>(idle));
  const Snapshot before_snap = TakeSnapshot();
  const uint64_t before = static_cast<uint64_t>(before_snap.at("meminfo MemAvailable"));
  const double memcg_kib_before = NewMemoryCgroupKiB();
  Figures fill{};
  int made = 0;
  for (int target : {0, idle / 3, idle}) {
    const int from = made;
    if (target > made) {
      fill = Measure(target - from, kInFlight, [&](int i) { held[static_cast<size_t>(from + i)] = Check(client.Create(spec))["id"]; });
      made = target;
    }
    at.push_back(made);
    std::fprintf(stderr, "density_bench: with %d idle: cycles, execs, a warm pool...\n", made);
    if (made == idle) {
      // What the node spends with them idle and nothing asked of it.
      const CpuByPid a = SampleCpu();
      const double busy0 = BusySeconds();
      const auto q0 = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(std::chrono::seconds(10));
      const double q = std::chrono::duration<double>(std::chrono::steady_clock::now() - q0).count();
      quiet_busy = (BusySeconds() - busy0) / q;
      for (auto& [name, s] : CpuBetween(a, SampleCpu())) quiet_cpu[name] = s / q;
    }
    const Steps steps0 = ScrapeSteps(client);
    const double cpu0 = Pid1Seconds();
    const CpuByPid sample0 = SampleCpu();
    const double busy0 = BusySeconds();
    const auto t0 = std::chrono::steady_clock::now();
    rates.push_back(Measure(rate_cycles, kInFlight, cycle));
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    pid1_cores.push_back(wall > 0 ? (Pid1Seconds() - cpu0) / wall : 0);
    cycle_busy.push_back((BusySeconds() - busy0) / wall);
    cycle_cpu.emplace_back();
    for (auto& [name, s] : CpuBetween(sample0, SampleCpu())) cycle_cpu.back()[name] = s / wall;
    step_means.push_back(StepMeans(steps0, ScrapeSteps(client), rate_cycles / 2.0));
    // Exec latency in a sandbox made now (the newest, as a caller's would be).
    const std::string probe = Check(client.Create(spec))["id"];
    for (int i = 0; i < 3; ++i) exec_ok(probe);
    execs.push_back(Measure(4 * rate_cycles, 1, [&](int) { exec_ok(probe); }));
    Check(client.Destroy(probe));
    Check(client.SetWarmPool(spec, pool_size).status());
    pool_ready(pool_size);
    takes.push_back(one_by_one());
    pool_ready(pool_size);
    bursts.push_back(burst());
    Check(client.SetWarmPool(spec, 0).status());
    pool_ready(0);
  }
  const Snapshot idle_snap = TakeSnapshot();
  const uint64_t with_idle = static_cast<uint64_t>(idle_snap.at("meminfo MemAvailable"));
  const double memcg_kib_idle = NewMemoryCgroupKiB();
  const int own_sb = idle >= 2 ? OwnSuperblocks(FirstPid(StrCat("/sys/fs/cgroup/pids/strata-bench/", held[0], "/cgroup.procs")),
                                                FirstPid(StrCat("/sys/fs/cgroup/pids/strata-bench/", held[1], "/cgroup.procs")))
                               : -1;
  // The agents' own share: their resident private memory.
  double agent_private_kib = 0;
  {
    int counted = 0;
    for (int i = 0; i < idle && counted < 50; ++i) {
      std::ifstream procs(StrCat("/sys/fs/cgroup/pids/strata-bench/", held[static_cast<size_t>(i)], "/cgroup.procs"));
      std::string pid;
      if (!(procs >> pid)) continue;
      std::ifstream rollup("/proc/" + pid + "/smaps_rollup");
      std::string k, rest;
      double v;
      std::getline(rollup, rest);  // (the header line)
      while (rollup >> k >> v) {
        std::getline(rollup, rest);
        if (k == "Private_Clean:" || k == "Private_Dirty:") agent_private_kib += v;
      }
      ++counted;
    }
    if (counted > 0) agent_private_kib /= counted;
  }
  // Every one of them answers.
  Figures answer = Measure(idle, kInFlight, [&](int i) { exec_ok(held[static_cast<size_t>(i)]); });
  Measure(idle, kInFlight, [&](int i) { Check(client.Destroy(held[static_cast<size_t>(i)])); });

  // crun's default spec on the same root, running sleep.
  std::fprintf(stderr, "density_bench: %d idle crun containers...\n", idle);
  const std::string bundle = dir.Sub("crun-default");
  Check(MakeDirs(bundle));
  Check(RunChecked({.argv = {"crun", "spec", "-b", bundle}}, "crun spec").status());
  json config = json::parse(Check(ReadFileToString(bundle + "/config.json")));
  config["root"]["path"] = layer.tree;
  config["process"]["terminal"] = false;
  config["process"]["args"] = {"sleep", "100000"};
  Check(WriteFileAtomic(bundle + "/config.json", config.dump()));
  const std::string tag = StrCat("density-", ::getpid(), "-");
  const Snapshot before_crun_snap = TakeSnapshot();
  const double memcg_kib_before_crun = NewMemoryCgroupKiB();
  const uint64_t before_crun = static_cast<uint64_t>(before_crun_snap.at("meminfo MemAvailable"));
  Measure(idle, kInFlight, [&](int i) {
    auto r = RunCommand({.argv = {"crun", "run", "--detach", "--bundle", bundle, StrCat(tag, i)},
                         .stdout_mode = StdStream::kNull, .stderr_mode = StdStream::kNull});
    if (!r.ok() || !r->success()) Check(Error(EIO, "crun run --detach failed"));
  });
  const Snapshot crun_snap = TakeSnapshot();
  const uint64_t with_crun = static_cast<uint64_t>(crun_snap.at("meminfo MemAvailable"));
  const double memcg_kib_crun = NewMemoryCgroupKiB();
  const int crun_own_sb = idle >= 2 ? OwnSuperblocks(FirstPid(StrCat("/sys/fs/cgroup/pids/", tag, 0, "/cgroup.procs")),
                                                     FirstPid(StrCat("/sys/fs/cgroup/pids/", tag, 1, "/cgroup.procs")))
                                    : -1;
  // The same cycles beside IDLE idle processes that are not strata's: what
  // a node with that many processes costs strata anyway.
  std::fprintf(stderr, "density_bench: cycles beside %d idle crun containers...\n", idle);
  const double crun_cpu0 = Pid1Seconds();
  const auto crun_t0 = std::chrono::steady_clock::now();
  const Figures beside_crun = Measure(rate_cycles, kInFlight, cycle);
  const double crun_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - crun_t0).count();
  const double crun_pid1 = crun_wall > 0 ? (Pid1Seconds() - crun_cpu0) / crun_wall : 0;
  Measure(idle, kInFlight, [&](int i) { RunCommand({.argv = {"crun", "delete", "--force", StrCat(tag, i)}}).status().IgnoreError(); });
  daemon.Stop();

  auto kib_each = [&](uint64_t a, uint64_t b) { return a > b ? static_cast<double>(a - b) / idle : 0.0; };
  const double ours_kib = kib_each(before, with_idle), crun_kib = kib_each(before_crun, with_crun);
  std::printf("node density: warm pool of %d; %d idle sandboxes; %d in flight\n", pool_size, idle, kInFlight);
  Table t({"measure", "p50 ms", "p99 ms", "per s", "baseline", "baseline p50 ms", "baseline per s", "ratio"});
  t.Add({StrCat("burst of ", pool_size, ": create -> first exec, warm pool"), Fixed(warm_burst.p50_ms, 2), Fixed(warm_burst.p99_ms, 2),
         Fixed(warm_burst.per_second, 1), "same, cold", Fixed(cold_burst.p50_ms, 2), Fixed(cold_burst.per_second, 1),
         Fixed(warm_burst.per_second / cold_burst.per_second, 2) + " (rate)"});
  t.Add({StrCat(pool_size, " one at a time: create -> first exec, warm pool"), Fixed(warm_single.p50_ms, 2), Fixed(warm_single.p99_ms, 2),
         Fixed(warm_single.per_second, 1), "same, cold", Fixed(cold_single.p50_ms, 2), Fixed(cold_single.per_second, 1),
         Fixed(warm_single.p50_ms / cold_single.p50_ms, 2) + " (p50)"});
  t.Add({StrCat(4 * pool_size, " create -> exec -> destroy, pool refilling"), Fixed(warm_cycles.p50_ms, 2), Fixed(warm_cycles.p99_ms, 2),
         Fixed(warm_cycles.per_second, 1), "same, cold", Fixed(cold_cycles.p50_ms, 2), Fixed(cold_cycles.per_second, 1),
         Fixed(warm_cycles.per_second / cold_cycles.per_second, 2) + " (rate)"});
  for (size_t i = 1; i < rates.size(); ++i) {
    t.Add({StrCat("create -> exec -> destroy, ", at[i], " idle running"), Fixed(rates[i].p50_ms, 1), Fixed(rates[i].p99_ms, 1),
           Fixed(rates[i].per_second, 1), "same, none running", Fixed(rates[0].p50_ms, 1), Fixed(rates[0].per_second, 1),
           Fixed(rates[i].per_second / rates[0].per_second, 2) + " (rate)"});
  }
  // The same per core that PID 1 left to everything else.
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  auto per_core = [&](size_t i) { return rates[i].per_second / std::max(0.1, cores - pid1_cores[i]); };
  for (size_t i = 1; i < rates.size(); ++i) {
    t.Add({StrCat("the same per core PID 1 (", Pid1Name(), ") left: ", Fixed(cores - pid1_cores[i], 2), " of ", Fixed(cores, 0)),
           "", "", Fixed(per_core(i), 1), StrCat("same, none running: ", Fixed(cores - pid1_cores[0], 2), " left"), "",
           Fixed(per_core(0), 1), Fixed(per_core(i) / per_core(0), 2) + " (rate)"});
  }
  t.Add({StrCat("exec true in each of ", idle, " idle"), Fixed(answer.p50_ms, 2), Fixed(answer.p99_ms, 2), Fixed(answer.per_second, 1), "", "", "", ""});
  t.Add({StrCat("create the last ", idle - idle / 3, " idle"), Fixed(fill.p50_ms, 1), Fixed(fill.p99_ms, 1), Fixed(fill.per_second, 1), "", "", "", ""});
  t.Add({"memory per idle sandbox (KiB, MemAvailable drop / N)", Fixed(ours_kib, 0), "", "", "idle crun container, `crun spec` default",
         Fixed(crun_kib, 0), "", Fixed(crun_kib > 0 ? ours_kib / crun_kib : 0, 2)});
  // What each would cost on a node of its own: the shrinker slots a memory
  // cgroup gets follow the most superblocks the node ever held at once (the
  // kernel never shrinks them), so whichever ran first on this boot pays
  // less. Each one's memory cgroups paid `memcg_kib_*` per cgroup here; on
  // its own node it would pay its own superblocks x N / 64 KiB (plus the
  // node's own, a few hundred shrinkers, left out for both).
  if (own_sb > 0 && crun_own_sb > 0) {
    const double ours_memcgs = (idle_snap.at("count: memory cgroups (live and dying)") - before_snap.at("count: memory cgroups (live and dying)")) / idle;
    const double crun_memcgs = (crun_snap.at("count: memory cgroups (live and dying)") - before_crun_snap.at("count: memory cgroups (live and dying)")) / idle;
    const double ours_own = ours_kib + ours_memcgs * (own_sb * idle / 64.0 - memcg_kib_idle);
    const double crun_own = crun_kib + crun_memcgs * (crun_own_sb * idle / 64.0 - memcg_kib_crun);
    t.Add({"the same, shrinker slots at its own peak (KiB, see below)", Fixed(ours_own, 0), "", "", "the same for crun", Fixed(crun_own, 0), "",
           Fixed(crun_own > 0 ? ours_own / crun_own : 0, 2)});
  }
  t.Print();

  // A full node against an empty one, and where a cycle's time goes.
  const size_t full = rates.size() - 1;
  std::printf("\nwith %d idle against none (the same daemon, the same run)\n", at[full]);
  Table f({"measure", "none p50 ms", "none p99 ms", "none per s", StrCat(at[full], " idle p50 ms"), StrCat(at[full], " idle p99 ms"),
           StrCat(at[full], " idle per s"), "ratio"});
  auto row = [&](const std::string& what, const std::vector<Figures>& v, bool by_rate) {
    const Figures& a = v[0];
    const Figures& b = v[full];
    f.Add({what, Fixed(a.p50_ms, 2), Fixed(a.p99_ms, 2), Fixed(a.per_second, 1), Fixed(b.p50_ms, 2), Fixed(b.p99_ms, 2), Fixed(b.per_second, 1),
           by_rate ? Fixed(b.per_second / a.per_second, 2) + " (rate)" : Fixed(a.p50_ms / b.p50_ms, 2) + " (p50, none / full)"});
  };
  row(StrCat("create -> exec -> destroy, ", kInFlight, " in flight"), rates, true);
  f.Add({StrCat("the same beside ", idle, " idle crun containers instead (PID 1 left ", Fixed(cores - crun_pid1, 2), " cores)"), "", "", "",
         Fixed(beside_crun.p50_ms, 2), Fixed(beside_crun.p99_ms, 2), Fixed(beside_crun.per_second, 1),
         Fixed(beside_crun.per_second / rates[0].per_second, 2) + " (rate)"});
  row("exec true in a live sandbox, one at a time", execs, false);
  row(StrCat("warm pool: ", pool_size, " takes one at a time, create -> first exec"), takes, false);
  row(StrCat("warm pool: a burst of ", pool_size, ", create -> first exec"), bursts, true);
  f.Print();
  std::printf("\neach step's mean during the cycles above, ms\n");
  Table s({"path: step", "none", StrCat(at[full], " idle"), "ratio (none / full)"});
  for (const auto& [key, none] : step_means[0]) {
    auto it = step_means[full].find(key);
    if (it == step_means[full].end()) continue;
    s.Add({key, Fixed(none, 2), Fixed(it->second, 2), Fixed(it->second > 0 ? none / it->second : 0, 2)});
  }
  s.Print();
  std::printf("\nCPU by process, cores: during the cycles with none and with %d idle; with %d idle and nothing asked (10 s)\n", at[full], at[full]);
  Table c({"process", "cycles, none", StrCat("cycles, ", at[full], " idle"), StrCat(at[full], " idle, quiet")});
  std::set<std::string> names;
  for (const Cpu* m : {&cycle_cpu[0], &cycle_cpu[full], &quiet_cpu}) {
    std::vector<std::pair<double, std::string>> top;
    for (const auto& [name, v] : *m) top.push_back({v, name});
    std::sort(top.rbegin(), top.rend());
    for (size_t i = 0; i < top.size() && i < 8; ++i) names.insert(top[i].second);
  }
  auto get = [](const Cpu& m, const std::string& name) { auto it = m.find(name); return it == m.end() ? 0.0 : it->second; };
  std::vector<std::pair<double, std::string>> by_use;
  for (const auto& name : names) by_use.push_back({get(cycle_cpu[full], name) + get(quiet_cpu, name), name});
  std::sort(by_use.rbegin(), by_use.rend());
  for (const auto& [_, name] : by_use) {
    c.Add({name, Fixed(get(cycle_cpu[0], name), 3), Fixed(get(cycle_cpu[full], name), 3), Fixed(get(quiet_cpu, name), 3)});
  }
  c.Add({"the machine (/proc/stat, all but idle)", Fixed(cycle_busy[0], 3), Fixed(cycle_busy[full], 3), Fixed(quiet_busy, 3)});
  c.Print();

  // Where it goes, per sandbox and per crun container (KiB).
  std::printf("\nper idle sandbox / crun container, KiB (the largest slab caches of either)\n");
  auto ours_growth = Growth(before_snap, idle_snap, idle, 14);
  auto crun_growth = Growth(before_crun_snap, crun_snap, idle, 14);
  std::map<std::string, std::pair<double, double>> rows;
  std::vector<std::string> order;
  for (auto* g : {&ours_growth, &crun_growth}) {
    for (auto& [k, v] : *g) {
      if (!rows.count(k)) order.push_back(k);
      rows[k] = {0, 0};
    }
  }
  for (auto& [k, v] : Growth(before_snap, idle_snap, idle, 100000)) if (rows.count(k)) rows[k].first = v;
  for (auto& [k, v] : Growth(before_crun_snap, crun_snap, idle, 100000)) if (rows.count(k)) rows[k].second = v;
  Table w({"what", "strata sandbox", "crun default container", "difference"});
  for (const auto& k : order) {
    w.Add({k, Fixed(rows[k].first, 1), Fixed(rows[k].second, 1), Fixed(rows[k].first - rows[k].second, 1)});
  }
  w.Add({"agent private resident (smaps_rollup, mean of 50)", Fixed(agent_private_kib, 1), "", ""});
  w.Add({"superblocks of its own (mount tables of two compared)", StrCat(own_sb), StrCat(crun_own_sb), StrCat(own_sb - crun_own_sb)});
  w.Add({"kmalloc-1k of one more memory cgroup, KiB: before -> with all idle", StrCat(Fixed(memcg_kib_before, 0), " -> ", Fixed(memcg_kib_idle, 0)),
         StrCat(Fixed(memcg_kib_before_crun, 0), " -> ", Fixed(memcg_kib_crun, 0)), ""});
  w.Print();
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return strata::bench::Body(argc, argv); });
}
