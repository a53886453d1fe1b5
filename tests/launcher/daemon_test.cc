// System tests of the launcher daemon: its API and CLI verbs, access
// control, and recovery after the daemon is killed.
#include <dirent.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "launcher/front/http_server.h"
#include "common/lmdb.h"
#include "common/mount.h"
#include "launcher/api/client.h"
#include "launcher/api/server.h"
#include "launcher/container/oci_config.h"
#include "tests/launcher/fixture.h"

namespace strata::launcher {
namespace {

using nlohmann::json;

class DaemonTest : public DaemonFixture {
 protected:
  // Kills every process of a sandbox (its agent dies: the sandbox is dead).
  void KillSandboxProcesses(const std::string& id) {
    for (const auto& line : Lines(StrCat("/sys/fs/cgroup/pids/", cgroup_parent_, "/", id, "/cgroup.procs"))) {
      ::kill(std::stoi(line), SIGKILL);
    }
  }

  uint64_t Metric(const std::string& name) {
    auto text = client_->Metrics();
    if (!text.ok()) return ~uint64_t{0};
    for (const auto& line : Split(*text, '\n')) {
      if (line.starts_with(name + " ")) return std::stoull(line.substr(name.size() + 1));
    }
    return ~uint64_t{0};
  }

};

TEST_F(DaemonTest, ASandboxLivesThroughManyCommands) {
  StartDaemon();
  std::string id = Create({"--memory", "64M"});
  ASSERT_TRUE(id.starts_with("sb-")) << id;
  // Its root is the container's alone: the node's mount table, which each
  // create's runtime copies, holds none of it.
  for (const auto& line : Lines("/proc/self/mountinfo")) EXPECT_EQ(line.find(id), std::string::npos) << line;

  ASSERT_OK_AND_ASSIGN(auto r, Cli({"exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3"}));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_EQ(r.out, "out\n");
  EXPECT_NE(r.err.find("err\n"), std::string::npos);
  ASSERT_OK_AND_ASSIGN(auto env, Cli({"exec", id, "--env", "A=b", "--workdir", "/etc", "--", "sh", "-c", "echo $A $(pwd)"}));
  EXPECT_EQ(env.out, "b /etc\n") << env.err;
  // A sandbox's workdir is the default; an explicit "/" is still honoured.
  std::string in_tmp = Create({"--workdir", "/tmp"});
  ASSERT_OK_AND_ASSIGN(auto dflt, Cli({"exec", in_tmp, "--", "pwd"}));
  EXPECT_EQ(dflt.out, "/tmp\n") << dflt.err;
  ASSERT_OK_AND_ASSIGN(auto root, Cli({"exec", in_tmp, "--workdir", "/", "--", "pwd"}));
  EXPECT_EQ(root.out, "/\n") << root.err;
  ASSERT_OK_AND_ASSIGN(auto destroyed, Cli({"destroy", in_tmp}));
  EXPECT_EQ(destroyed.exit_code, 0) << destroyed.err;
  ASSERT_OK_AND_ASSIGN(auto in, Cli({"exec", id, "-i", "--", "cat"}, "piped in\n"));
  EXPECT_EQ(in.out, "piped in\n") << in.err;

  // State stays between commands.
  ASSERT_OK_AND_ASSIGN(auto write, Cli({"exec", id, "--", "sh", "-c", "echo kept > /root/state"}));
  EXPECT_EQ(write.exit_code, 0) << write.err;
  ASSERT_OK_AND_ASSIGN(auto read, Cli({"exec", id, "--", "cat", "/root/state"}));
  EXPECT_EQ(read.out, "kept\n");

  // Files in and out.
  ASSERT_OK(WriteFileAtomic(dir_.Sub("in.sh"), "#!/bin/sh\necho script ran\n"));
  ASSERT_EQ(::chmod(dir_.Sub("in.sh").c_str(), 0755), 0);
  ASSERT_OK_AND_ASSIGN(auto put, Cli({"cp", dir_.Sub("in.sh"), id + ":/usr/bin/in.sh"}));
  EXPECT_EQ(put.exit_code, 0) << put.err;
  ASSERT_OK_AND_ASSIGN(auto ran, Cli({"exec", id, "--", "in.sh"}));
  EXPECT_EQ(ran.out, "script ran\n") << ran.err;
  ASSERT_OK_AND_ASSIGN(auto get, Cli({"cp", id + ":/root/state", dir_.Sub("out.txt")}));
  EXPECT_EQ(get.exit_code, 0) << get.err;
  EXPECT_EQ(ReadFileToString(dir_.Sub("out.txt")).value_or(""), "kept\n");
  ASSERT_OK_AND_ASSIGN(auto missing, Cli({"cp", id + ":/no/such/file", dir_.Sub("x")}));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/no/such/file"), std::string::npos) << missing.err;

  // Timeouts, OOM kills and output caps as with `run`.
  ASSERT_OK_AND_ASSIGN(auto slow, Cli({"exec", id, "--timeout", "1s", "--", "sh", "-c", "sleep 60 & sleep 60"}));
  EXPECT_EQ(slow.exit_code, 124) << slow.err;
  ASSERT_OK_AND_ASSIGN(auto hog, Cli({"exec", id, "--", "dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1"}));
  EXPECT_EQ(hog.exit_code, 137) << hog.err;
  EXPECT_NE(hog.err.find("out of memory"), std::string::npos) << hog.err;
  ASSERT_OK_AND_ASSIGN(auto big, Cli({"exec", id, "--output-cap", "4K", "--", "head", "-c", "100000", "/dev/zero"}));
  EXPECT_EQ(big.out.size(), 4096u);
  EXPECT_NE(big.err.find("stdout cut at 4.0 KiB"), std::string::npos) << big.err;

  // Pause freezes it: commands wait for a resume.
  ASSERT_OK_AND_ASSIGN(auto pause, Cli({"pause", id}));
  EXPECT_EQ(pause.exit_code, 0) << pause.err;
  ASSERT_OK_AND_ASSIGN(auto frozen, Cli({"exec", id, "--", "true"}));
  EXPECT_NE(frozen.exit_code, 0);
  EXPECT_NE(frozen.err.find("paused"), std::string::npos) << frozen.err;
  ASSERT_OK_AND_ASSIGN(auto ls, Cli({"ls", "--json"}));
  json list = json::parse(ls.out);
  ASSERT_EQ(list.size(), 1u) << ls.out;
  EXPECT_EQ(list[0]["id"], id);
  EXPECT_EQ(list[0]["state"], "paused");
  EXPECT_EQ(list[0]["layers"][0]["name"], "busybox");
  ASSERT_OK_AND_ASSIGN(auto resume, Cli({"resume", id}));
  EXPECT_EQ(resume.exit_code, 0) << resume.err;
  ASSERT_OK_AND_ASSIGN(auto thawed, Cli({"exec", id, "--", "cat", "/root/state"}));
  EXPECT_EQ(thawed.out, "kept\n") << thawed.err;

  ASSERT_OK_AND_ASSIGN(auto destroy, Cli({"destroy", id}));
  EXPECT_EQ(destroy.exit_code, 0) << destroy.err;
  ASSERT_OK_AND_ASSIGN(auto gone, Cli({"exec", id, "--", "true"}));
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_NE(gone.err.find("no such sandbox"), std::string::npos) << gone.err;
  ExpectHostClean();

  // `launcher run` goes through the daemon when one listens.
  ASSERT_OK_AND_ASSIGN(auto run, Run({"--layer", "busybox:1", "--", "sh", "-c", "echo through the daemon; exit 4"}));
  EXPECT_EQ(run.exit_code, 4) << run.err;
  EXPECT_EQ(run.out, "through the daemon\n");
  EXPECT_EQ(Metric("strata_sandbox_creations_total"), 3u);
  EXPECT_EQ(Metric("strata_sandbox_destructions_total"), 3u);
  EXPECT_EQ(Metric("strata_exec_duration_seconds_count"), 13u);
  EXPECT_EQ(Metric("strata_sandboxes{state=\"running\"}"), 0u);
  EXPECT_EQ(Metric("strata_layer_mounts"), 1u);
}

// Each sandbox's root is mounted in a mount namespace of its own
// (strata-nsexec): the node's namespace, which every runtime's starts as a
// copy of, holds none, not even while creates are in flight; and a
// sandbox's namespace holds no other sandbox's root.
TEST_F(DaemonTest, NoNamespaceButItsOwnHoldsASandboxsRootEvenWhileItStarts) {
  StartDaemon();
  const std::string run_dir = dir_.Sub("run");
  std::atomic<bool> done = false;
  std::atomic<int> scans = 0;
  std::vector<std::string> seen;
  std::thread watcher([&] {
    while (!done) {
      for (const auto& line : Lines("/proc/self/mountinfo")) {
        if (line.find(run_dir) != std::string::npos && seen.size() < 10) seen.push_back(line);
      }
      ++scans;
    }
  });
  std::vector<std::string> ids(12);
  {
    std::vector<std::thread> creators;
    for (int t = 0; t < 4; ++t) {
      creators.emplace_back([&, t] {
        for (int i = t; i < 12; i += 4) ids[static_cast<size_t>(i)] = Create(i % 4 == 3 ? std::vector<std::string>{"--backend", "fncall"} : std::vector<std::string>{});
      });
    }
    for (auto& c : creators) c.join();
  }
  done = true;
  watcher.join();
  EXPECT_GT(scans.load(), 12);
  EXPECT_TRUE(seen.empty()) << "the node's mount table held a sandbox's root: " << Join(seen, "\n");
  for (const auto& id : ids) ASSERT_FALSE(id.empty());
  // Inside one: its own root, nothing of the others'.
  ASSERT_OK_AND_ASSIGN(auto table, Cli({"exec", ids[0], "--", "cat", "/proc/self/mountinfo"}));
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find(ids[0]), std::string::npos) << table.out;  // (its upper, in its root's options)
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(table.out.find(ids[i]), std::string::npos) << ids[i] << " in\n" << table.out;
  for (const auto& id : ids) {
    ASSERT_OK_AND_ASSIGN(auto r, Cli({"exec", id, "--", "sh", "-c", "echo ok > /tmp/f && cat /tmp/f"}));
    EXPECT_EQ(r.out, "ok\n") << id << ": " << r.err;
  }
}

// Each create runs the OCI runtime it names (issue 55: `--runtime runc` was
// accepted and crun ran), with the spec's own means where crun's tricks do
// not carry over (runc refuses the masks crun binds inside /proc), and a
// runtime the node does not offer is refused by name.
TEST_F(DaemonTest, EachCreateRunsTheRuntimeItNamesOrIsRefused) {
  if (FindProgram("runc").empty()) GTEST_SKIP() << "runc is not installed (apt-get install runc)";
  StartDaemon();
  const std::string by_runc = Create({"--runtime", "runc"});
  const std::string by_crun = Create();
  ASSERT_FALSE(by_runc.empty());
  ASSERT_FALSE(by_crun.empty());
  EXPECT_EQ(::access(("/run/runc/" + by_runc).c_str(), F_OK), 0) << "runc holds no state for " << by_runc;
  EXPECT_NE(::access(("/run/crun/" + by_runc).c_str(), F_OK), 0) << "crun runs " << by_runc;
  EXPECT_EQ(::access(("/run/crun/" + by_crun).c_str(), F_OK), 0);
  ASSERT_OK_AND_ASSIGN(json info, client_->Info(by_runc));
  EXPECT_EQ(info.value("runtime", ""), "runc") << info.dump();
  ASSERT_OK_AND_ASSIGN(json crun_info, client_->Info(by_crun));
  EXPECT_EQ(crun_info.value("runtime", ""), "crun") << crun_info.dump();
  for (const auto& id : {by_runc, by_crun}) {
    // The same sandbox either way: masked kernel paths, the default
    // seccomp filter on commands, pause and resume.
    ASSERT_OK_AND_ASSIGN(auto r, Cli({"exec", id, "--", "sh", "-c",
                                      "ls -A /proc/acpi /sys/firmware | wc -l; wc -c < /proc/keys; "
                                      "grep '^Seccomp:' /proc/self/status; echo x 2>/dev/null > /proc/sys/kernel/hostname || echo ro"}));
    EXPECT_EQ(r.out, "3\n0\nSeccomp:\t2\nro\n") << id << ": " << r.err;
    ASSERT_OK_AND_ASSIGN(auto pause, Cli({"pause", id}));
    EXPECT_EQ(pause.exit_code, 0) << id << ": " << pause.err;
    ASSERT_OK_AND_ASSIGN(auto resume, Cli({"resume", id}));
    EXPECT_EQ(resume.exit_code, 0) << id << ": " << resume.err;
    ASSERT_OK_AND_ASSIGN(auto after, Cli({"exec", id, "--", "echo", "thawed"}));
    EXPECT_EQ(after.out, "thawed\n") << id << ": " << after.err;
  }
  // Only names the node offers: never a program of the caller's choosing.
  for (const std::string bad : {"/bin/sh", "kata"}) {
    ASSERT_OK_AND_ASSIGN(auto refused, Cli({"create", "--layer", "busybox:1", "--runtime", bad}));
    EXPECT_NE(refused.exit_code, 0) << bad;
    EXPECT_NE(refused.err.find("runtime " + bad + ": this node offers crun or runc"), std::string::npos) << refused.err;
  }
  for (const auto& id : {by_runc, by_crun}) {
    ASSERT_OK_AND_ASSIGN(auto destroy, Cli({"destroy", id}));
    EXPECT_EQ(destroy.exit_code, 0) << destroy.err;
  }
  EXPECT_NE(::access(("/run/runc/" + by_runc).c_str(), F_OK), 0);
  ExpectHostClean();
}

TEST_F(DaemonTest, ExecStreamsOutputAsItComes) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(json info, client_->Create({{"layers", {"busybox:1"}}, {"store", store_url_}}));
  std::string id = info["id"];
  EXPECT_EQ(info["layers"].size(), 1u);
  auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::duration> first;
  std::string out;
  ASSERT_OK_AND_ASSIGN(auto r, client_->Exec(id, {{"argv", {"sh", "-c", "echo first; sleep 2; echo second"}}},
                                            [&](int, std::string_view b) {
                                              if (!first) first = std::chrono::steady_clock::now() - start;
                                              out.append(b);
                                            }));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(out, "first\nsecond\n");
  ASSERT_TRUE(first.has_value());
  EXPECT_LT(*first, 1500ms);  // before the command ended (2 s later)
  EXPECT_GE(std::chrono::steady_clock::now() - start, 2s);

  // Unstreamed: one JSON answer with base64 output.
  auto curl = RunCommand({.argv = {"curl", "-sS", "--unix-socket", socket_, "-X", "POST", "-d",
                                   R"({"argv":["sh","-c","printf 'a\\0b'; echo e >&2; exit 5"],"stream":false})",
                                   "http://launcher/v1/sandboxes/" + id + "/exec"}});
  ASSERT_OK(curl.status());
  json j = json::parse(curl->out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << curl->out << curl->err;
  EXPECT_EQ(j["exit_code"], 5);
  EXPECT_EQ(Base64Decode(j["stdout"].get<std::string>()).value_or("?"), std::string("a\0b", 3));
  EXPECT_EQ(Base64Decode(j["stderr"].get<std::string>()).value_or("?"), "e\n");

  // A client that goes away abandons its command: the agent kills it, for
  // a streamed exec and an unstreamed one.
  for (const char* stream : {"true", "false"}) {
    auto gone = RunCommand({.argv = {"curl", "-sS", "--max-time", "1", "--unix-socket", socket_, "-X", "POST", "-d",
                                     StrCat(R"({"argv":["sleep","1000"],"stream":)", stream, "}"),
                                     "http://launcher/v1/sandboxes/" + id + "/exec"}});
    ASSERT_OK(gone.status());
    EXPECT_NE(gone->exit_code, 0);  // curl timed out
    std::string left = "?";
    for (int i = 0; i < 100 && left != "0\n"; ++i) {
      std::this_thread::sleep_for(50ms);
      left.clear();
      ASSERT_OK(client_->Exec(id, {{"argv", {"sh", "-c", "ps | grep -c '[s]leep 1000'"}}},
                              [&](int, std::string_view b) { left.append(b); }).status());
    }
    EXPECT_EQ(left, "0\n") << "stream " << stream << ": the abandoned command still runs";
  }

  // Bad requests name what is wrong.
  auto bad = client_->Create({{"layers", json::array()}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("layers"), std::string::npos) << bad.status().ToString();
  auto unknown = client_->Create({{"layers", {"nope:1"}}, {"store", store_url_}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().ToString().find("nope:1"), std::string::npos) << unknown.status().ToString();
  auto wrong_type = RunCommand({.argv = {"curl", "-sS", "--unix-socket", socket_, "-X", "POST", "-d", R"({"argv":["true"],"stream":"yes"})",
                                         "http://launcher/v1/sandboxes/" + id + "/exec"}});
  ASSERT_OK(wrong_type.status());
  EXPECT_NE(wrong_type->out.find("\"errno\":22"), std::string::npos) << wrong_type->out;
  auto bad_mode = RunCommand({.argv = {"curl", "-sS", "--unix-socket", socket_, "-X", "PUT", "--data-binary", "x",
                                       "http://launcher/v1/sandboxes/" + id + "/files?path=/tmp/x&mode=rw"}});
  ASSERT_OK(bad_mode.status());
  EXPECT_NE(bad_mode->out.find("\"errno\":22"), std::string::npos) << bad_mode->out;
  auto noargv = client_->Exec(id, {{"argv", json::array()}}, [](int, std::string_view) {});
  ASSERT_FALSE(noargv.ok());
  EXPECT_NE(noargv.status().ToString().find("argv"), std::string::npos);
  EXPECT_OK(client_->Destroy(id));
}

TEST_F(DaemonTest, EveryCallChecksAccess) {
  // Root only by default: the socket is 0600.
  StartDaemon();
  struct stat st;
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  StopDaemon(SIGTERM);

  // With a token, anyone may connect but only the token opens the API.
  ASSERT_OK(WriteFileAtomic(dir_.Sub("token"), "s3cret-token\n", true, 0600));
  StartDaemon({"--token-file", dir_.Sub("token")});
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  auto as_nobody = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "curl", "-s",
                                     "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", socket_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("http://launcher/v1/sandboxes");
    auto r = RunCommand({.argv = argv});
    return r.ok() ? r->out : r.status().ToString();
  };
  EXPECT_EQ(as_nobody({}), "401");
  EXPECT_EQ(as_nobody({"-H", "Authorization: Bearer wrong-token!"}), "401");
  EXPECT_EQ(as_nobody({"-H", "Authorization: Bearer s3cret-token"}), "200");
  EXPECT_EQ(as_nobody({"-X", "POST", "-d", R"({"layers":["busybox:1"]})"}), "401");  // every call, not just reads
  LauncherClient with_token(socket_, "s3cret-token");
  EXPECT_OK(with_token.List().status());
  StopDaemon(SIGTERM);
  // The old single-token file is read as the tenant "default", with a warning.
  EXPECT_NE(ReadFileToString(dir_.Sub("daemon.log")).value_or("").find("--token-file is replaced by --tokens"), std::string::npos);

  // Members of --allow-group are the operator (from the peer's credentials;
  // "nobody" is in "nogroup").
  StartDaemon({"--allow-group", "nogroup"});
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(as_nobody({}), "200");
}

TEST_F(DaemonTest, ARestartedDaemonReadoptsLiveSandboxesAndRemovesDeadOnes) {
  StartDaemon();
  std::string live = Create(), paused = Create(), dead = Create();
  ASSERT_OK_AND_ASSIGN(auto mark, Cli({"exec", live, "--", "sh", "-c", "echo before > /root/mark"}));
  ASSERT_EQ(mark.exit_code, 0) << mark.err;
  ASSERT_OK_AND_ASSIGN(auto pause, Cli({"pause", paused}));
  ASSERT_EQ(pause.exit_code, 0) << pause.err;

  StopDaemon(SIGKILL);
  KillSandboxProcesses(dead);
  // A root left mounted on the host, as daemons before 2026-12-03 kept
  // them, is unmounted when its sandbox is adopted; the sandbox runs on.
  const std::string live_root = dir_.Sub("run/" + live + "/rootfs");
  ASSERT_OK_AND_ASSIGN(MountPoint left, MountPoint::Mount(live_root, live_root, "", MS_BIND, ""));
  left.Release();
  StartDaemon();
  EXPECT_FALSE(IsMountPoint(live_root));

  ASSERT_OK_AND_ASSIGN(auto ls, Cli({"ls", "--json"}));
  std::map<std::string, std::string> states;
  for (const auto& s : json::parse(ls.out)) states[s["id"]] = s["state"];
  EXPECT_EQ(states, (std::map<std::string, std::string>{{live, "running"}, {paused, "paused"}})) << ls.out;
  ASSERT_OK_AND_ASSIGN(auto read, Cli({"exec", live, "--", "cat", "/root/mark"}));
  EXPECT_EQ(read.out, "before\n") << read.err;
  ASSERT_OK_AND_ASSIGN(auto resume, Cli({"resume", paused}));
  EXPECT_EQ(resume.exit_code, 0) << resume.err;
  ASSERT_OK_AND_ASSIGN(auto after, Cli({"exec", paused, "--", "echo", "thawed"}));
  EXPECT_EQ(after.out, "thawed\n") << after.err;
  // Nothing of the dead one is left.
  EXPECT_NE(::access(dir_.Sub("run/" + dead).c_str(), F_OK), 0);
  EXPECT_FALSE(UpperNames().count(dead));
  EXPECT_NE(::access(StrCat("/sys/fs/cgroup/memory/", cgroup_parent_, "/", dead).c_str(), F_OK), 0);
  auto log = ReadFileToString(dir_.Sub("daemon.log")).value_or("");
  EXPECT_NE(log.find("re-adopted 2 sandboxes, removed 1"), std::string::npos) << log;
}

// Sandboxes are recorded in a registry of this boot (not synced: they die
// with the machine); warm pools in the lasting one.
TEST_F(DaemonTest, TheRegistryOfAnEarlierBootIsRemovedAndAnOlderDaemonsRecordsMoveOver) {
  StartDaemon();
  const std::string id = Create({"--env", "WHO=kept"});
  ASSERT_OK(client_->SetWarmPool({{"layers", {"busybox:1"}}}, 1).status());
  auto ready = [&] {
    json pools = client_->WarmPools().value_or(json::array());
    return pools.size() == 1 ? pools[0].value("ready", 0) : -1;
  };
  for (int i = 0; i < 600 && ready() != 1; ++i) std::this_thread::sleep_for(100ms);
  ASSERT_EQ(ready(), 1);
  StopDaemon(SIGKILL);
  const std::string boot_dir = dir_.Sub("state/boot/" + BootId());
  ASSERT_EQ(::access((boot_dir + "/data.mdb").c_str(), F_OK), 0);

  // The layout of a daemon before this one: every record in the lasting
  // registry. Here: this boot's records (the sandbox's and the pool's ready
  // one's) moved there by hand, this boot's registry removed.
  std::vector<std::pair<std::string, std::string>> records;
  {
    LmdbEnv::Options o;
    o.map_size = size_t{256} << 20;
    ASSERT_OK_AND_ASSIGN(LmdbEnv boot, LmdbEnv::Open(boot_dir, o));
    ASSERT_OK_AND_ASSIGN(LmdbTxn txn, LmdbTxn::Begin(boot, true));
    ASSERT_OK_AND_ASSIGN(MDB_dbi db, txn.OpenDb("sandboxes", 0));
    ASSERT_OK_AND_ASSIGN(LmdbCursor cursor, LmdbCursor::Open(txn, db));
    std::string_view k, v;
    for (;;) {
      ASSERT_OK_AND_ASSIGN(bool more, cursor.Next(&k, &v));
      if (!more) break;
      records.emplace_back(k, v);
    }
  }
  ASSERT_EQ(records.size(), 2u);
  {
    LmdbEnv::Options o;
    o.map_size = size_t{256} << 20;
    ASSERT_OK_AND_ASSIGN(LmdbEnv lasting, LmdbEnv::Open(dir_.Sub("state"), o));
    ASSERT_OK_AND_ASSIGN(LmdbTxn txn, LmdbTxn::Begin(lasting, false));
    ASSERT_OK_AND_ASSIGN(MDB_dbi db, txn.OpenDb("sandboxes", 0));
    for (const auto& [k, v] : records) ASSERT_OK(txn.Put(db, k, v).status());
    ASSERT_OK(txn.Commit());
  }
  ASSERT_OK(RemoveTree(boot_dir));
  // And an earlier boot's registry, torn as a crash of the machine may
  // leave one: removed without being read.
  const std::string earlier = dir_.Sub("state/boot/00000000-0000-0000-0000-000000000000");
  ASSERT_OK(MakeDirs(earlier));
  ASSERT_OK(WriteFileAtomic(earlier + "/data.mdb", std::string(100000, 'x')));
  // A snapshot a daemon of that boot was packing when the machine went.
  ASSERT_OK(MakeDirs(uppers_ + "/.snapshots", 0700));
  ASSERT_OK_AND_ASSIGN(auto made, RunCommand({.argv = {"btrfs", "subvolume", "create", uppers_ + "/.snapshots/sb-0123456789ab-1"}}));
  ASSERT_TRUE(made.success()) << made.err;

  StartDaemon();
  EXPECT_NE(::access(earlier.c_str(), F_OK), 0);
  EXPECT_NE(::access((uppers_ + "/.snapshots/sb-0123456789ab-1").c_str(), F_OK), 0);
  ASSERT_OK_AND_ASSIGN(auto who, Cli({"exec", id, "--", "sh", "-c", "echo $WHO"}));
  EXPECT_EQ(who.out, "kept\n") << who.err;
  json pools = client_->WarmPools().value_or(json::array());
  ASSERT_EQ(pools.size(), 1u) << pools.dump();
  EXPECT_EQ(pools[0].value("size", 0), 1);
  auto log = ReadFileToString(dir_.Sub("daemon.log")).value_or("");
  EXPECT_NE(log.find("moved 2 records of an older daemon"), std::string::npos) << log;
  const size_t adopted = log.rfind("re-adopted ");
  ASSERT_NE(adopted, std::string::npos) << log;
  EXPECT_EQ(log.substr(adopted, log.find('\n', adopted) - adopted), "re-adopted 1 sandboxes, removed 0") << log;
  EXPECT_EQ(ready(), 1);  // the pool's ready one, re-adopted as ready (not removed above)
  {
    // The lasting registry keeps the warm pool only.
    LmdbEnv::Options o;
    o.map_size = size_t{256} << 20;
    ASSERT_OK_AND_ASSIGN(LmdbEnv lasting, LmdbEnv::Open(dir_.Sub("state"), o));
    ASSERT_OK_AND_ASSIGN(LmdbTxn txn, LmdbTxn::Begin(lasting, true));
    ASSERT_OK_AND_ASSIGN(MDB_dbi db, txn.OpenDb("sandboxes", 0));
    ASSERT_OK_AND_ASSIGN(LmdbCursor cursor, LmdbCursor::Open(txn, db));
    std::vector<std::string> keys;
    std::string_view k, v;
    for (;;) {
      ASSERT_OK_AND_ASSIGN(bool more, cursor.Next(&k, &v));
      if (!more) break;
      keys.emplace_back(k);
    }
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_TRUE(keys[0].starts_with("warm:")) << keys[0];
  }

  // A start in this boot that died before its sweep leaves it to the next;
  // once one has swept, a later start leaves what its registry does not
  // name (another daemon's on the same uppers).
  ASSERT_EQ(::access((boot_dir + "/swept").c_str(), F_OK), 0);
  StopDaemon(SIGKILL);
  ASSERT_OK(RemoveTree(boot_dir + "/swept"));
  ASSERT_OK_AND_ASSIGN(made, RunCommand({.argv = {"btrfs", "subvolume", "create", uppers_ + "/.snapshots/sb-0123456789ab-2"}}));
  ASSERT_TRUE(made.success()) << made.err;
  StartDaemon();
  EXPECT_NE(::access((uppers_ + "/.snapshots/sb-0123456789ab-2").c_str(), F_OK), 0);
  StopDaemon(SIGKILL);
  ASSERT_OK_AND_ASSIGN(made, RunCommand({.argv = {"btrfs", "subvolume", "create", uppers_ + "/.snapshots/sb-0123456789ab-3"}}));
  ASSERT_TRUE(made.success()) << made.err;
  StartDaemon();
  EXPECT_EQ(::access((uppers_ + "/.snapshots/sb-0123456789ab-3").c_str(), F_OK), 0);
  ASSERT_OK_AND_ASSIGN(made, RunCommand({.argv = {"btrfs", "subvolume", "delete", uppers_ + "/.snapshots/sb-0123456789ab-3"}}));
  EXPECT_TRUE(made.success()) << made.err;
  ASSERT_OK_AND_ASSIGN(who, Cli({"exec", id, "--", "sh", "-c", "echo $WHO"}));
  EXPECT_EQ(who.out, "kept\n") << who.err;
  EXPECT_OK(client_->Destroy(id));
  ASSERT_OK(client_->SetWarmPool({{"layers", {"busybox:1"}}}, 0).status());
  for (int i = 0; i < 300 && !client_->WarmPools().value_or(json::array()).empty(); ++i) std::this_thread::sleep_for(100ms);
  StopDaemon(SIGTERM);
}

TEST_F(DaemonTest, RandomKillsOfSandboxesAndTheDaemonLeaveTheHostClean) {
  StartDaemon();
  std::atomic<bool> stop{false};
  std::atomic<int> cycles{0};
  std::mutex ids_mu;
  std::vector<std::string> ids;  // sandboxes that were created (some still live)
  auto worker = [&](int seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    LauncherClient client(socket_);
    while (!stop) {
      auto info = client.Create({{"layers", {"busybox:1"}}, {"store", store_url_}});
      if (!info.ok()) {
        std::this_thread::sleep_for(50ms);
        continue;
      }
      std::string id = (*info)["id"];
      {
        std::lock_guard lock(ids_mu);
        ids.push_back(id);
      }
      client.Exec(id, {{"argv", {"sh", "-c", "echo x > /tmp/x; sleep 0.$((RANDOM % 3))"}}}, [](int, std::string_view) {}).status().IgnoreError();
      if (rng() % 4 != 0) client.Destroy(id).IgnoreError();  // some are left for the daemon to recover
      ++cycles;
    }
  };
  std::thread a(worker, 1), b(worker, 2);
  std::mt19937 rng(7);
  for (int round = 0; round < 8; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 700));
    if (round % 2 == 0) {
      StopDaemon(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 200));
      StartDaemon();
    } else {
      std::lock_guard lock(ids_mu);
      if (!ids.empty()) KillSandboxProcesses(ids[rng() % ids.size()]);
    }
  }
  stop = true;
  a.join();
  b.join();
  EXPECT_GT(cycles.load(), 4);
  // One last restart recovers what the last round left; then every sandbox
  // is destroyed and the host must be as before.
  StopDaemon(SIGKILL);
  StartDaemon();
  for (const auto& s : client_->List().value_or(json::array())) EXPECT_OK(client_->Destroy(s["id"].get<std::string>()));
  StopDaemon(SIGTERM);
  ExpectHostClean();
  for (const auto& id : ids) {
    EXPECT_NE(::access(StrCat("/run/crun/", id).c_str(), F_OK), 0) << "runtime state left: " << id;
    EXPECT_NE(::access(StrCat(kSandboxDevs, "/", id).c_str(), F_OK), 0) << "its /dev left: " << id;
  }
}

TEST_F(DaemonTest, FunctionCallsShareOnlyTheReadOnlyLayers) {
  StartDaemon();
  std::string a = Create({"--backend", "fncall", "--env", "WHO=a"});
  std::string b = Create({"--backend", "fncall"});
  ASSERT_OK_AND_ASSIGN(json info_a, client_->Info(a));
  ASSERT_OK_AND_ASSIGN(json info_b, client_->Info(b));
  EXPECT_EQ(info_a["backend"], "fncall");
  EXPECT_EQ(info_a["pool"], info_b["pool"]);  // one warm sandbox per stack
  EXPECT_EQ(Metric("strata_fncall_pools"), 1u);

  // Each call: its own PID namespace (the command is PID 2 under the
  // call's init), a private /tmp, a read-only root, no mount privilege.
  ASSERT_OK_AND_ASSIGN(auto first, Cli({"exec", a, "--", "sh", "-c",
                                        "echo $WHO $$; echo x > /tmp/mine; ls /tmp; set -- /proc/[0-9]*; echo $#"}));
  EXPECT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(first.out, "a 2\nmine\n2\n");  // init and sh (counted by sh itself: a pipeline's ls could run before its grep)
  ASSERT_OK_AND_ASSIGN(auto second, Cli({"exec", a, "--", "ls", "-A", "/tmp"}));
  EXPECT_EQ(second.out, "") << "a call saw another's /tmp";
  ASSERT_OK_AND_ASSIGN(auto root, Cli({"exec", b, "--", "touch", "/etc/x"}));
  EXPECT_NE(root.exit_code, 0);
  EXPECT_NE(root.err.find("Read-only file system"), std::string::npos) << root.err;
  ASSERT_OK_AND_ASSIGN(auto mount, Cli({"exec", b, "--", "mount", "-t", "tmpfs", "none", "/mnt"}));
  EXPECT_NE(mount.exit_code, 0);
  ASSERT_OK_AND_ASSIGN(auto caps, Cli({"exec", b, "--", "grep", "CapEff", "/proc/self/status"}));
  ASSERT_EQ(caps.exit_code, 0) << caps.err;
  const uint64_t eff = std::stoull(caps.out.substr(caps.out.find(':') + 1), nullptr, 16);
  EXPECT_EQ(eff & (uint64_t{1} << 21), 0u) << "CAP_SYS_ADMIN: " << caps.out;
  EXPECT_EQ(eff & (uint64_t{1} << 12), 0u) << "CAP_NET_ADMIN: " << caps.out;
  ASSERT_OK_AND_ASSIGN(auto masked, Cli({"exec", b, "--", "sh", "-c", "wc -c < /proc/timer_list; echo 1 > /proc/sys/vm/drop_caches"}));
  EXPECT_EQ(masked.out, "0\n");
  EXPECT_NE(masked.err.find("Read-only"), std::string::npos) << masked.err;

  // Exit codes, signals and timeouts come through; what a call starts in
  // the background ends with it.
  ASSERT_OK_AND_ASSIGN(auto code, Cli({"exec", a, "--", "sh", "-c", "exit 7"}));
  EXPECT_EQ(code.exit_code, 7);
  ASSERT_OK_AND_ASSIGN(auto sig, Cli({"exec", a, "--", "sh", "-c", "kill -TERM $$"}));
  EXPECT_EQ(sig.exit_code, 128 + SIGTERM);
  ASSERT_OK_AND_ASSIGN(auto slow, Cli({"exec", a, "--timeout", "1s", "--", "sleep", "30"}));
  EXPECT_EQ(slow.exit_code, 124);
  auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(auto bg, Cli({"exec", a, "--", "sh", "-c", "sleep 60 & echo started"}));
  EXPECT_EQ(bg.out, "started\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  std::string pool_cgroup = StrCat("/sys/fs/cgroup/pids/", cgroup_parent_, "/", info_a["pool"].get<std::string>(), "/cgroup.procs");
  EXPECT_EQ(Lines(pool_cgroup).size(), 1u) << "only the warm agent stays";

  // No writable state: files, pause and snapshot are refused by name.
  ASSERT_OK(WriteFileAtomic(dir_.Sub("f"), "x"));
  ASSERT_OK_AND_ASSIGN(auto put, Cli({"cp", dir_.Sub("f"), a + ":/tmp/f"}));
  EXPECT_NE(put.err.find("function-call sandbox"), std::string::npos) << put.err;
  ASSERT_OK_AND_ASSIGN(auto pause, Cli({"pause", a}));
  EXPECT_NE(pause.err.find("function-call sandbox"), std::string::npos) << pause.err;

  // A restarted daemon keeps them; destroying them keeps the pool warm for
  // the next one, and the daemon's shutdown removes the idle pool.
  StopDaemon(SIGKILL);
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(auto after, Cli({"exec", a, "--", "sh", "-c", "echo $WHO"}));
  EXPECT_EQ(after.out, "a\n") << after.err;
  EXPECT_OK(client_->Destroy(a));
  EXPECT_OK(client_->Destroy(b));
  EXPECT_EQ(Metric("strata_fncall_pools"), 1u);
  ASSERT_OK_AND_ASSIGN(auto run, Run({"--backend", "fncall", "--layer", "busybox:1", "--", "echo", "warm"}));
  EXPECT_EQ(run.out, "warm\n") << run.err;
  EXPECT_EQ(Metric("strata_fncall_pools"), 1u);

  // A pool whose agent died is not joined again: the next sandbox gets a
  // new one, and the dead one is removed with the rest at shutdown.
  for (const auto& pid : Lines(pool_cgroup)) ::kill(std::stoi(pid), SIGKILL);
  ASSERT_OK_AND_ASSIGN(auto fresh, Run({"--backend", "fncall", "--layer", "busybox:1", "--", "echo", "again"}));
  EXPECT_EQ(fresh.out, "again\n") << fresh.err;
  EXPECT_EQ(Metric("strata_fncall_pools"), 1u);
}

TEST_F(DaemonTest, ASnapshotStartsNewSandboxesWhereTheAgentLeftOff) {
  StartDaemon();
  std::string id = Create();
  ASSERT_OK_AND_ASSIGN(auto work, Cli({"exec", id, "--", "sh", "-c",
                                       "mkdir -p /work/src && echo built > /work/src/out && chmod 0751 /work/src/out && "
                                       "chown 1000:1000 /work/src && ln -s out /work/src/link && rm /etc/passwd && "
                                       "rm -rf /mnt && mkdir /mnt && touch /mnt/fresh"}));
  ASSERT_EQ(work.exit_code, 0) << work.err;
  // A process keeps running across the snapshot: it is frozen only briefly.
  // The exec returns once it has written, so the snapshot holds its file.
  ASSERT_OK_AND_ASSIGN(auto bg, Cli({"exec", id, "--", "sh", "-c", "(while :; do date +%s%N > /tmp/tick; sleep 0.01; done) >/dev/null 2>&1 & "
                                     "while [ ! -s /tmp/tick ]; do sleep 0.01; done"}));
  ASSERT_EQ(bg.exit_code, 0) << bg.err;

  ASSERT_OK_AND_ASSIGN(json snap, client_->Snapshot(id, "env:1"));
  EXPECT_EQ(snap["tag"], "env:1");
  EXPECT_EQ(snap["parents"].size(), 1u);
  EXPECT_LT(snap["frozen_ms"].get<double>(), 5000);
  ASSERT_OK_AND_ASSIGN(auto still, Cli({"exec", id, "--", "cat", "/work/src/out"}));
  EXPECT_EQ(still.out, "built\n") << "the sandbox runs on after its snapshot: " << still.err;

  // A diff alone brings its parents: the new sandbox sees what the agent left.
  std::string next = Create({"--layer", "env:1"});
  ASSERT_OK_AND_ASSIGN(auto seen, Cli({"exec", next, "--", "sh", "-c",
                                       "cat /work/src/out; stat -c '%a %u' /work/src/out; stat -c '%u:%g' /work/src; readlink /work/src/link; "
                                       "test -e /etc/passwd || echo passwd gone; ls /mnt; test -e /tmp/tick && echo tick"}));
  EXPECT_EQ(seen.out, "built\n751 0\n1000:1000\nout\npasswd gone\nfresh\ntick\n") << seen.err;
  ASSERT_OK_AND_ASSIGN(auto ls, Cli({"ls", "--json"}));
  const json listed = json::parse(ls.out);
  auto found = std::find_if(listed.begin(), listed.end(), [&](const json& s) { return s["id"] == next; });
  ASSERT_NE(found, listed.end()) << ls.out;
  EXPECT_EQ((*found)["layers"].size(), 2u) << ls.out;  // the diff and its parent
  // The CLI verb; bad tags and function-call sandboxes are refused by name.
  ASSERT_OK_AND_ASSIGN(auto cli, Cli({"snapshot", next, "--tag", "env:2"}));
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_EQ(cli.out.size(), 33u) << cli.out;  // a digest and a newline
  ASSERT_OK_AND_ASSIGN(auto bad, Cli({"snapshot", next, "--tag", "no-version"}));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("no-version"), std::string::npos) << bad.err;
  std::string fn = Create({"--backend", "fncall"});
  ASSERT_OK_AND_ASSIGN(auto refused, Cli({"snapshot", fn, "--tag", "env:3"}));
  EXPECT_NE(refused.err.find("function-call sandbox"), std::string::npos) << refused.err;
  EXPECT_EQ(Metric("strata_snapshots_total"), 2u);
  // No snapshot subvolume is left behind.
  DIR* d = ::opendir((uppers_ + "/.snapshots").c_str());
  int snapshots = 0;
  while (d && ::readdir(d)) ++snapshots;
  if (d) ::closedir(d);
  EXPECT_LE(snapshots, 2) << "(. and ..)";
  ::rmdir((uppers_ + "/.snapshots").c_str());
}


// The node's lazyfs serving process is killed, then upgraded, under a
// sandbox that reads its whole tree in a loop (page caches dropped all the
// while, so the reads reach lazyfs): nothing inside notices.
TEST_F(DaemonTest, ASandboxReadsOnThroughALazyfsCrashAndAnUpgrade) {
  StartDaemon();
  std::string id = Create();
  auto reader = std::async(std::launch::async, [&] {
    return Cli({"exec", id, "--", "sh", "-c",
                "end=$(( $(date +%s) + 8 )); n=0; while [ $(date +%s) -lt $end ]; do "
                "find / -xdev -type f > /tmp/list 2>/tmp/err && xargs cat < /tmp/list > /dev/null 2>>/tmp/err "
                "|| { cat /tmp/err; echo FAIL; }; n=$((n+1)); done; echo passes $n"});
  });
  std::atomic<bool> done{false};
  std::thread dropper([&] {
    while (!done) {
      WriteFileAtomic("/proc/sys/vm/drop_caches", "3", false).IgnoreError();
      std::this_thread::sleep_for(50ms);
    }
  });
  lazyfs::Client lazyfs(dir_.Sub("lazyfs.sock"));
  auto serving = [&] {
    auto h = lazyfs.Call("health");
    return h.ok() ? (*h)["pid"].get<pid_t>() : -1;
  };
  std::this_thread::sleep_for(1500ms);
  const pid_t first = serving();
  ASSERT_GT(first, 0);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  for (int i = 0; i < 250 && (serving() == first || serving() < 0); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_NE(serving(), first);
  std::this_thread::sleep_for(1500ms);
  ASSERT_OK_AND_ASSIGN(auto upgraded, RunCommand({.argv = {testing::TestBinaryDir() + "/../../lazyfs/lazyfs", "--socket",
                                                           dir_.Sub("lazyfs.sock"), "upgrade"}}));
  EXPECT_EQ(upgraded.exit_code, 0) << upgraded.err;
  auto r = reader.get();
  done = true;
  dropper.join();
  ASSERT_OK(r.status());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(r->out.find("FAIL"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("passes"), std::string::npos) << r->out;
  ASSERT_OK_AND_ASSIGN(auto still, Cli({"exec", id, "--", "cat", "/etc/passwd"}));
  EXPECT_EQ(still.exit_code, 0) << still.err;
}

}  // namespace
}  // namespace strata::launcher
