// System tests of a sandbox whose agent misbehaves on purpose: a fork
// bomb, a memory hog, signals to PID 1 and to everything, zombies by the
// thousand. Afterwards exec, cp, the grader's exec, snapshot and destroy
// must still work, and nothing may leak.
#include <algorithm>
#include <fstream>
#include <future>

#include "common/fs.h"
#include "launcher/container/oci_config.h"
#include "launcher/node/node_cgroup.h"
#include "lazyfs/client.h"
#include "tests/launcher/fixture.h"

namespace strata::launcher {
namespace {

using nlohmann::json;

class HostileTest : public DaemonFixture {
 protected:
  SubprocessResult Sh(const std::string& id, const std::string& script, std::vector<std::string> flags = {}) {
    std::vector<std::string> args = {"exec", id};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--", "sh", "-c", script});
    auto r = Cli(args);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }
  int64_t CgroupValue(const std::string& controller, const std::string& id, const std::string& file) {
    std::ifstream in(StrCat("/sys/fs/cgroup/", controller, "/", cgroup_parent_, "/", id, "/", file));
    int64_t v = -1;
    in >> v;
    return v;
  }
  // Forks the commands' cgroup has refused (pids.events, "max N").
  int64_t RefusedForks(const std::string& id) {
    std::ifstream in(StrCat("/sys/fs/cgroup/pids/", cgroup_parent_, "/", id, "/commands/pids.events"));
    std::string key;
    int64_t v = -1;
    in >> key >> v;
    return key == "max" ? v : -1;
  }
  // What the trainer needs from a sandbox, whatever its agent did.
  void ExpectControllable(const std::string& id, const std::string& what) {
    auto exec = Sh(id, "echo alive");
    EXPECT_EQ(exec.out, "alive\n") << what << ": " << exec.err;
    auto grader = Sh(id, "echo grader; ls /grader | wc -l", {"--role", "grader"});
    EXPECT_EQ(grader.out, "grader\n0\n") << what << ": " << grader.err;
    ASSERT_OK(WriteFileAtomic(dir_.Sub("probe"), "probe\n"));
    auto put = Cli({"cp", dir_.Sub("probe"), id + ":/tmp/probe"});
    ASSERT_TRUE(put.ok());
    EXPECT_EQ(put->exit_code, 0) << what << ": " << put->err;
    auto get = Cli({"cp", id + ":/tmp/probe", dir_.Sub("probe.back")});
    ASSERT_TRUE(get.ok());
    EXPECT_EQ(get->exit_code, 0) << what << ": " << get->err;
  }
};

TEST_F(HostileTest, ForkBombsMemoryHogsAndSignalsLeaveTheSandboxControllable) {
  StartDaemon();
  const std::string id = Create({"--pids", "64", "--memory", "64M", "--deny", "/grader"});
  ASSERT_FALSE(id.empty());
  // The commands' cgroup has the caller's limits, the sandbox's the reserve on top.
  EXPECT_EQ(CgroupValue("pids", id, "commands/pids.max"), 64);
  EXPECT_EQ(CgroupValue("pids", id, "pids.max"), 64 + kAgentReservePids);
  EXPECT_EQ(CgroupValue("memory", id, "commands/memory.limit_in_bytes"), 64 << 20);

  // A fork bomb, left running: it forks for ever, so every pid the
  // commands may have stays taken.
  auto bomb = Sh(id, "(while :; do sleep 1000 & done) >/dev/null 2>&1 & echo started");
  EXPECT_EQ(bomb.out, "started\n") << bomb.err;
  // Until the bomb has filled the commands' cgroup (a fork refused): the
  // check below that a command cannot fork must not race a bomb still
  // filling it, which on a loaded machine takes seconds.
  for (int i = 0; i < 1500 && (CgroupValue("pids", id, "commands/pids.current") < 60 || RefusedForks(id) < 1); ++i) {
    ::usleep(20000);
  }
  EXPECT_GE(CgroupValue("pids", id, "commands/pids.current"), 60);
  EXPECT_GE(RefusedForks(id), 1);
  ExpectControllable(id, "fork bomb");
  // A command cannot fork past the limit either. The bomb's shell may have
  // died at its first refused fork (ash exits on "can't fork") and the
  // commands run since have freed their pids, so the command first takes
  // whatever is left (8 at most), then tries once more.
  const int64_t refused = RefusedForks(id);
  auto fork_fails = Sh(id, "for i in 1 2 3 4 5 6 7 8; do sleep 1000 & done; sleep 0 && echo forked || echo no-fork");
  EXPECT_EQ(fork_fails.out.find("forked"), std::string::npos) << fork_fails.out << fork_fails.err;
  EXPECT_GT(RefusedForks(id), refused) << fork_fails.out << fork_fails.err;
  // A shepherd (kill_leftovers) forks in the reserve; its command joins the full cgroup.
  auto shepherded = Sh(id, "echo shepherded", {"--kill-leftovers"});
  EXPECT_EQ(shepherded.out, "shepherded\n") << shepherded.err;

  // kill -9 1, kill -STOP -1 and kill -9 -1 from inside: the agent is PID 1.
  auto signals = Sh(id, "kill -9 1; kill -STOP -1; kill -9 -1; echo after");
  EXPECT_EQ(signals.out, "after\n") << signals.err;
  for (int i = 0; i < 750 && CgroupValue("pids", id, "commands/pids.current") > 0; ++i) ::usleep(20000);
  EXPECT_EQ(CgroupValue("pids", id, "commands/pids.current"), 0);
  ExpectControllable(id, "kill -9 1, kill -STOP -1, kill -9 -1");

  // A memory hog is killed in the commands' cgroup, not the agent.
  auto hog = Sh(id, "dd if=/dev/zero of=/dev/null bs=200M count=1");
  EXPECT_EQ(hog.exit_code, 137) << hog.err;
  EXPECT_NE(hog.err.find("out of memory"), std::string::npos) << hog.err;
  ExpectControllable(id, "memory hog");

  // Thousands of short-lived orphans: the agent reaps them all.
  auto zombies = Sh(id, "i=0; while [ $i -lt 3000 ]; do (true &); i=$((i+1)); done; echo made");
  EXPECT_EQ(zombies.out, "made\n") << zombies.err;
  for (int i = 0; i < 750 && CgroupValue("pids", id, "commands/pids.current") > 0; ++i) ::usleep(20000);
  EXPECT_EQ(CgroupValue("pids", id, "commands/pids.current"), 0) << "zombies left";
  for (int i = 0; i < 750 && CgroupValue("pids", id, "pids.current") > 16; ++i) ::usleep(20000);
  EXPECT_LE(CgroupValue("pids", id, "pids.current"), 16) << "the agent's threads";
  ExpectControllable(id, "zombies");

  // Snapshot and destroy still work; nothing of the sandbox is left.
  ASSERT_OK_AND_ASSIGN(json snap, client_->Snapshot(id, "hostile:1"));
  EXPECT_FALSE(snap.value("digest", "").empty());
  ASSERT_OK_AND_ASSIGN(auto destroyed, Cli({"destroy", id}));
  EXPECT_EQ(destroyed.exit_code, 0) << destroyed.err;
  ExpectHostClean();
}

TEST_F(HostileTest, KillLeftoversTakesTheWholeTree) {
  StartDaemon();
  const std::string id = Create({"--kill-leftovers"});
  ASSERT_FALSE(id.empty());
  auto running = [&](const std::string& pattern) {
    auto r = Sh(id, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '" + pattern + "'");
    return r.out;
  };
  // The sandbox's default: what the command left goes when it ends, also
  // what left its session (setsid, a daemon's double fork).
  auto left = Sh(id, "sleep 301 & setsid sleep 302 & (setsid sh -c 'sleep 303 & sleep 304' &); sleep 0.3; echo started");
  EXPECT_EQ(left.out, "started\n") << left.err;
  EXPECT_EQ(running("^sleep 30[1-4]"), "0\n");
  // A timeout takes the whole tree too.
  auto slow = Sh(id, "setsid sleep 305 & sleep 100", {"--timeout", "1s"});
  EXPECT_EQ(slow.exit_code, 124) << slow.err;
  for (int i = 0; i < 50 && running("^sleep 305") != "0\n"; ++i) ::usleep(20000);
  EXPECT_EQ(running("^sleep 305"), "0\n");
  // An exec may keep its leftovers; the exit code comes through either way.
  auto kept = Sh(id, "setsid sleep 306 & exit 3", {"--keep-leftovers"});
  EXPECT_EQ(kept.exit_code, 3) << kept.err;
  EXPECT_EQ(running("^sleep 306"), "1\n");
  auto code = Sh(id, "kill -TERM $$");
  EXPECT_EQ(code.exit_code, 128 + SIGTERM) << code.err;
  // Stdin reaches its end under a shepherd.
  ASSERT_OK_AND_ASSIGN(auto in, Cli({"exec", id, "-i", "--", "cat"}, "piped in\n"));
  EXPECT_EQ(in.out, "piped in\n") << in.err;
  // A command that stops its shepherd: the timeout continues it, and the tree goes.
  auto stopped = Sh(id, "setsid sleep 307 & kill -STOP $PPID; sleep 100", {"--timeout", "1s"});
  EXPECT_EQ(stopped.exit_code, 124) << stopped.err;
  for (int i = 0; i < 100 && running("^sleep 307") != "0\n"; ++i) ::usleep(20000);
  EXPECT_EQ(running("^sleep 307"), "0\n");
  ASSERT_OK_AND_ASSIGN(auto destroyed, Cli({"destroy", id}));
  EXPECT_EQ(destroyed.exit_code, 0) << destroyed.err;
  ExpectHostClean();
}

TEST_F(HostileTest, DestroyWorksDuringAForkBomb) {
  StartDaemon();
  const std::string id = Create({"--pids", "128"});
  ASSERT_FALSE(id.empty());
  // The daemon sits beside the sandboxes with a larger CPU weight and out
  // of the OOM killer's way; the sandbox's processes do not inherit that.
  auto read = [](const std::string& path) { return ReadFileToString(path).value_or(""); };
  const std::string daemon = StrCat("/proc/", daemon_->pid());
  EXPECT_NE(read(daemon + "/cgroup").find(StrCat(":/", cgroup_parent_, "-node\n")), std::string::npos) << read(daemon + "/cgroup");
  const std::string status = read("/proc/self/status");
  const size_t eff = status.find("CapEff:\t");
  const uint64_t caps = eff == std::string::npos ? 0 : std::stoull(status.substr(eff + 8, 16), nullptr, 16);
  if (caps & (uint64_t{1} << 24)) {  // CAP_SYS_RESOURCE (some hosts withhold it from root)
    EXPECT_EQ(read(daemon + "/oom_score_adj"), StrCat(kNodeOomScoreAdj, "\n"));
  }
  EXPECT_EQ(read(StrCat("/sys/fs/cgroup/cpu/", cgroup_parent_, "-node/cpu.shares")), StrCat(kNodeCpuShares, "\n"));
  const std::string procs = read(StrCat("/sys/fs/cgroup/pids/", cgroup_parent_, "/", id, "/cgroup.procs"));
  ASSERT_FALSE(procs.empty());
  EXPECT_EQ(read(StrCat("/proc/", std::stoi(procs), "/oom_score_adj")), "0\n");
  auto bomb = Sh(id, "(while :; do sleep 1000 & done) >/dev/null 2>&1 & sleep 1; echo started");
  EXPECT_EQ(bomb.out, "started\n") << bomb.err;
  ASSERT_OK_AND_ASSIGN(auto destroyed, Cli({"destroy", id}));
  EXPECT_EQ(destroyed.exit_code, 0) << destroyed.err;
  ExpectHostClean();
}

// Memory pressure inside a capacity of 1 GiB (so the test never endangers
// the machine): while sandboxes hold most of it, creations are refused;
// when they want more than there is, the kernel kills an offender's
// command in the sandboxes' cgroup, never the daemon or lazyfs; a quiet
// neighbour keeps answering.
TEST_F(HostileTest, MemoryPressureKillsOffendersOnlyAndTheNodeRefusesMore) {
  StartDaemon({"--memory-capacity", "1G", "--memory-reserve", "256M"});
  const std::string quiet = Create();
  const std::string hog = Create();
  const std::string hog2 = Create();
  ASSERT_FALSE(quiet.empty() || hog.empty() || hog2.empty());
  lazyfs::Client lazyfs(dir_.Sub("lazyfs.sock"));
  ASSERT_OK_AND_ASSIGN(json stats, lazyfs.Call("stats"));
  const pid_t lazyfs_pid = stats["pid"].get<pid_t>();
  auto exec_ms = [&](int n) {
    std::vector<double> ms;
    for (int i = 0; i < n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = client_->Exec(quiet, {{"argv", {"true"}}}, [](int, std::string_view) {});
      EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? "" : r.status().ToString());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms;
  };
  const std::vector<double> calm = exec_ms(30);
  // The hog holds 800 MiB (dd's buffer, while sleep never reads the pipe).
  auto held = std::async(std::launch::async, [&] { return Sh(hog, "dd if=/dev/zero bs=800M count=1 2>/dev/null | sleep 10", {"--timeout", "60s"}); });
  const std::string usage = StrCat("/sys/fs/cgroup/memory/", cgroup_parent_, "/memory.usage_in_bytes");
  auto used = [&] { return std::strtoull(ReadFileToString(usage).value_or("0").c_str(), nullptr, 10); };
  for (int i = 0; i < 600 && used() < (uint64_t{780} << 20); ++i) ::usleep(20000);
  ASSERT_GE(used(), uint64_t{780} << 20);
  // Less than the reserve is left to sandboxes: no more are made.
  ASSERT_OK_AND_ASSIGN(auto refused, client_->Raw("POST", "/v1/sandboxes", R"({"layers":["busybox:1"]})"));
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("--memory-reserve"), std::string::npos) << refused.body;
  // Another wants 400 MiB more than there is: the kernel kills within the
  // sandboxes' cgroup (the largest, the first hog's dd), not the node.
  auto more = Sh(hog2, "dd if=/dev/zero of=/dev/null bs=400M count=1 2>/dev/null; echo $?");
  const std::vector<double> pressed = exec_ms(30);
  auto first = held.get();
  // (The pipeline ends as sleep does; the shell reports its dd "Killed".)
  const bool first_killed = first.exit_code == 137 || first.err.find("Killed") != std::string::npos;
  const bool second_killed = more.out != "0\n";
  EXPECT_TRUE(first_killed || second_killed) << first.exit_code << " " << first.err << " / " << more.out;
  EXPECT_TRUE(daemon_->Running());
  EXPECT_EQ(::kill(lazyfs_pid, 0), 0) << "lazyfs was killed";
  ASSERT_OK_AND_ASSIGN(json after, lazyfs.Call("stats"));
  EXPECT_EQ(after["pid"].get<pid_t>(), lazyfs_pid);
  for (const auto& id : {quiet, hog, hog2}) {
    auto alive = Sh(id, "echo alive");
    EXPECT_EQ(alive.out, "alive\n") << id << ": " << alive.err;
  }
  // The quiet neighbour's execs: p99 during the pressure against calm.
  const double calm_p99 = calm[calm.size() * 99 / 100], pressed_p99 = pressed[pressed.size() * 99 / 100];
  std::fprintf(stderr, "quiet neighbour exec p99: calm %.1f ms, under pressure %.1f ms\n", calm_p99, pressed_p99);
  EXPECT_LT(pressed_p99, std::max(20 * calm_p99, 500.0));
  // Memory back: creations are admitted again.
  for (int i = 0; i < 500 && used() > (uint64_t{700} << 20); ++i) ::usleep(20000);
  const std::string later = Create();
  EXPECT_FALSE(later.empty());
  for (const auto& id : {quiet, hog, hog2, later}) EXPECT_OK(client_->Destroy(id));
  StopDaemon(SIGTERM);
  ExpectHostClean();
}

}  // namespace
}  // namespace strata::launcher
