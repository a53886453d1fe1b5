// The slow hostile test: a million short-lived children (label slow; about
// four minutes here). Afterwards exec, the grader's exec, cp and destroy
// work, and nothing is left: no process, no zombie, no thread of the agent.
#include <fstream>

#include "common/fs.h"
#include "tests/launcher/fixture.h"

namespace strata::launcher {
namespace {

class HostileSlowTest : public DaemonFixture {};

TEST_F(HostileSlowTest, AMillionShortLivedChildrenLeaveNothing) {
  StartDaemon();
  const std::string id = Create({"--pids", "64", "--memory", "64M", "--deny", "/grader"});
  ASSERT_FALSE(id.empty());
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"exec", id});
    auto r = RunCommand({.argv = [&] {
                           std::vector<std::string> a = {Tool()};
                           a.insert(a.end(), args.begin(), args.end());
                           a.insert(a.begin() + 2, {"--socket", socket_});
                           return a;
                         }(),
                         .env = env_,
                         .timeout = std::chrono::seconds(1100)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  };
  // Each child forks one that outlives it: a million orphans for the agent to reap.
  auto made = run({"--", "sh", "-c", "i=0; while [ $i -lt 1000000 ]; do (true &); i=$((i+1)); done; echo made"});
  EXPECT_EQ(made.out, "made\n") << made.err;
  auto pids = [&](const std::string& file) {
    std::ifstream in(StrCat("/sys/fs/cgroup/pids/", cgroup_parent_, "/", id, "/", file));
    int64_t v = -1;
    in >> v;
    return v;
  };
  for (int i = 0; i < 500 && pids("commands/pids.current") > 0; ++i) ::usleep(20000);
  EXPECT_EQ(pids("commands/pids.current"), 0) << "zombies or stragglers left";
  EXPECT_LE(pids("pids.current"), 16) << "the agent's threads";
  auto after = run({"--", "sh", "-c", "echo alive; ls /proc | grep -c '^[0-9]'"});
  EXPECT_EQ(after.out.substr(0, 6), "alive\n") << after.err;
  EXPECT_LE(std::stoi(after.out.substr(6)), 5) << after.out;  // the agent, sh, ls, grep
  auto grader = run({"--role", "grader", "--", "sh", "-c", "ls /grader | wc -l"});
  EXPECT_EQ(grader.out, "0\n") << grader.err;
  ASSERT_OK(WriteFileAtomic(dir_.Sub("probe"), "probe\n"));
  ASSERT_OK_AND_ASSIGN(auto put, Cli({"cp", dir_.Sub("probe"), id + ":/tmp/probe"}));
  EXPECT_EQ(put.exit_code, 0) << put.err;
  ASSERT_OK_AND_ASSIGN(auto destroyed, Cli({"destroy", id}));
  EXPECT_EQ(destroyed.exit_code, 0) << destroyed.err;
  ExpectHostClean();
}

}  // namespace
}  // namespace strata::launcher
