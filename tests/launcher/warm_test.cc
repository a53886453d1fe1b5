// System tests of warm pools: sandboxes made ahead of time for a layer
// stack and limits, taken by the creates that match, refilled in the
// background, kept across a daemon's kill -9, and given up under memory
// pressure.
#include <signal.h>

#include <filesystem>
#include <set>
#include <thread>

#include "common/fs.h"
#include "tests/launcher/fixture.h"

namespace strata::launcher {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class WarmPoolTest : public DaemonFixture {
 protected:
  json Pool(const std::string& name) {
    for (const auto& p : client_->WarmPools().value_or(json::array())) {
      if (p.value("name", "") == name) return p;
    }
    return json();
  }
  // Waits until `pred` holds for the pool (60 s at most).
  bool WaitPool(const std::string& name, const std::function<bool(const json&)>& pred) {
    for (int i = 0; i < 600; ++i) {
      json p = Pool(name);
      if (!p.is_null() && pred(p)) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  json Info(const std::string& id) { return client_->Info(id).value_or(json()); }
  SubprocessResult Sh(const std::string& id, const std::string& script) {
    auto r = Cli({"exec", id, "--", "sh", "-c", script});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }
};

TEST_F(WarmPoolTest, CreatesThatMatchTakeReadySandboxesAndThePoolRefills) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(auto set, Cli({"warm", "--layer", "busybox:1", "--size", "3", "--memory", "64M", "--pids", "256"}));
  ASSERT_EQ(set.exit_code, 0) << set.err;
  const json pool = json::parse(set.out);
  const std::string name = pool.value("name", "");
  ASSERT_TRUE(name.starts_with("wp-")) << set.out;
  ASSERT_TRUE(WaitPool(name, [](const json& p) { return p.value("ready", 0) == 3; })) << Pool(name).dump();

  // Two creates that match: each gets a ready sandbox under an id of its
  // own, with its own env and file rules.
  const std::string a = Create({"--memory", "64M", "--pids", "256", "--env", "WHO=a", "--read-only", "/etc"});
  const std::string b = Create({"--memory", "64M", "--pids", "256", "--env", "WHO=b", "--workdir", "/tmp"});
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  for (const auto& id : {a, b}) {
    json info = Info(id);
    EXPECT_EQ(info.value("id", ""), id);
    EXPECT_EQ(info.value("warm_pool", ""), name) << info.dump();
    EXPECT_TRUE(info.value("internal_id", "").starts_with("sb-"));
    EXPECT_NE(info.value("internal_id", ""), id);
  }
  EXPECT_EQ(Sh(a, "echo $WHO; pwd; touch /etc/x 2>/dev/null || echo refused").out, "a\n/\nrefused\n");
  EXPECT_EQ(Sh(b, "echo $WHO; pwd; ls -a /tmp | wc -l").out, "b\n/tmp\n2\n");  // (a fresh upper: /tmp is empty)
  // One that does not match is made cold.
  const std::string cold = Create({"--memory", "32M"});
  EXPECT_FALSE(Info(cold).contains("warm_pool"));
  EXPECT_TRUE(WaitPool(name, [](const json& p) { return p.value("ready", 0) == 3 && p.value("taken", 0) == 2; })) << Pool(name).dump();
  ASSERT_OK_AND_ASSIGN(auto metrics, client_->Metrics());
  EXPECT_NE(metrics.find(StrCat("strata_warm_taken_total{pool=\"", name, "\"} 2")), std::string::npos) << metrics;

  // A kill -9 of the daemon: the next one adopts the taken sandboxes under
  // their ids and the ready ones into the pool (the same ones: none made
  // again, none removed).
  auto run_dirs = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_.Sub("run"))) {
      if (e.path().filename().string().starts_with("sb-")) names.insert(e.path().filename().string());
    }
    return names;
  };
  const std::set<std::string> before = run_dirs();
  EXPECT_EQ(before.size(), 6u);  // 3 ready, 2 taken, 1 cold
  StopDaemon(SIGKILL);
  StartDaemon();
  EXPECT_EQ(run_dirs(), before);
  EXPECT_EQ(Pool(name).value("ready", 0), 3) << Pool(name).dump();
  json list = client_->List().value_or(json::array());
  EXPECT_EQ(list.size(), 3u) << list.dump();
  EXPECT_EQ(Info(a).value("warm_pool", ""), name);
  EXPECT_EQ(Sh(a, "echo $WHO; touch /etc/x 2>/dev/null || echo refused").out, "a\nrefused\n");
  EXPECT_EQ(Sh(b, "echo $WHO; pwd").out, "b\n/tmp\n");
  EXPECT_TRUE(WaitPool(name, [](const json& p) { return p.value("ready", 0) == 3; })) << Pool(name).dump();

  // Destroying a taken one removes what its internal id named.
  const std::string internal = Info(a).value("internal_id", "");
  ASSERT_OK_AND_ASSIGN(auto destroyed, Cli({"destroy", a}));
  EXPECT_EQ(destroyed.exit_code, 0) << destroyed.err;
  EXPECT_NE(::access(dir_.Sub("run/" + internal).c_str(), F_OK), 0);
  // Size 0 removes the pool and its ready sandboxes.
  ASSERT_OK(client_->SetWarmPool({{"layers", {"busybox:1"}}, {"memory", 64 << 20}, {"pids", 256}}, 0).status());
  for (int i = 0; i < 300 && !client_->WarmPools().value_or(json::array()).empty(); ++i) std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(client_->WarmPools().value_or(json::array()).empty());
  for (const auto& id : {b, cold}) EXPECT_OK(client_->Destroy(id));
  StopDaemon(SIGTERM);
  ExpectHostClean();
}

TEST_F(WarmPoolTest, ATakeSkipsAReadySandboxWhoseAgentDied) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(json pool, client_->SetWarmPool({{"layers", {"busybox:1"}}}, 1));
  const std::string name = pool.value("name", "");
  ASSERT_TRUE(WaitPool(name, [](const json& p) { return p.value("ready", 0) == 1; })) << Pool(name).dump();
  // Its agent killed while it waits (the OOM killer would do the same).
  const std::string parent = StrCat("/sys/fs/cgroup/pids/", cgroup_parent_);
  std::vector<std::string> ready;
  for (const auto& e : std::filesystem::directory_iterator(parent)) {
    if (e.path().filename().string().starts_with("sb-")) ready.push_back(e.path().filename().string());
  }
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_OK_AND_ASSIGN(auto procs, ReadFileToString(StrCat(parent, "/", ready[0], "/cgroup.procs")));
  for (const auto& pid : Split(procs, '\n')) {
    if (!pid.empty()) ::kill(std::stoi(pid), SIGKILL);
  }
  for (int i = 0; i < 100; ++i) {
    auto left = ReadFileToString(StrCat(parent, "/", ready[0], "/cgroup.procs"));
    if (!left.ok() || left->empty()) break;
    std::this_thread::sleep_for(20ms);
  }
  // The create that would have taken it gets a sandbox that answers, and
  // the dead one is removed.
  const std::string id = Create({});
  ASSERT_FALSE(id.empty());
  EXPECT_NE(Info(id).value("internal_id", ""), ready[0]);
  EXPECT_EQ(Sh(id, "echo ok").out, "ok\n");
  EXPECT_NE(::access(dir_.Sub("run/" + ready[0]).c_str(), F_OK), 0);
  EXPECT_TRUE(WaitPool(name, [](const json& p) { return p.value("ready", 0) == 1; })) << Pool(name).dump();
  EXPECT_OK(client_->Destroy(id));
  ASSERT_OK(client_->SetWarmPool({{"layers", {"busybox:1"}}}, 0).status());
  for (int i = 0; i < 300 && !client_->WarmPools().value_or(json::array()).empty(); ++i) std::this_thread::sleep_for(100ms);
  StopDaemon(SIGTERM);
  ExpectHostClean();
}

TEST_F(WarmPoolTest, PoolsGiveWayWhenMemoryIsShort) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(json pool, client_->SetWarmPool({{"layers", {"busybox:1"}}}, 2));
  const std::string name = pool.value("name", "");
  ASSERT_TRUE(WaitPool(name, [](const json& p) { return p.value("ready", 0) == 2; })) << Pool(name).dump();
  // The same node, now with a reserve it can never keep: the ready
  // sandboxes go, and none is made.
  StopDaemon(SIGTERM);
  StartDaemon({"--memory-reserve", "100T"});
  EXPECT_TRUE(WaitPool(name, [](const json& p) { return p.value("ready", 1) == 0 && p.value("shed", 0) == 2; })) << Pool(name).dump();
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(Pool(name).value("ready", -1), 0);
  EXPECT_EQ(Pool(name).value("made", -1), 0);
  ASSERT_OK(client_->SetWarmPool({{"layers", {"busybox:1"}}}, 0).status());
  StopDaemon(SIGTERM);
  ExpectHostClean();
}

TEST_F(WarmPoolTest, BadPoolsAreRefusedByName) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(auto missing, Cli({"warm", "--layer", "nosuch:1", "--size", "2"}));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("nosuch"), std::string::npos) << missing.err;
  ASSERT_OK_AND_ASSIGN(auto negative, Cli({"warm", "--layer", "busybox:1", "--size", "-1"}));
  EXPECT_NE(negative.exit_code, 0);
  auto call = client_->SetWarmPool({{"layers", {"busybox:1"}}, {"backend", "fncall"}}, 1);
  EXPECT_FALSE(call.ok());
  EXPECT_NE(call.status().message().find("container"), std::string::npos) << call.status().ToString();
  ASSERT_OK_AND_ASSIGN(auto host, Cli({"warm", "--layer", "busybox:1", "--size", "1", "--net", "host"}));
  EXPECT_NE(host.exit_code, 0);
  EXPECT_TRUE(client_->WarmPools().value_or(json::array({1})).empty());
}

}  // namespace
}  // namespace strata::launcher
