// What the launcher's system tests share: a store with a busybox layer, a
// lazyfs daemon, a run directory and a cgroup parent of the test's own, and
// the check that nothing a sandbox made outlives it.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launcher/backends/node_backends.h"
#include "launcher/api/client.h"
#include "launcher/sandbox/sandbox.h"
#include "launcher/sandbox/upper_store.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "lazyfs/client.h"
#include "tests/testing/test_util.h"
#include "tests/testing/tree.h"

namespace strata::launcher {

using namespace std::chrono_literals;
using testing::MakeTempDir;

inline std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    Status uppers = CheckUpperFilesystem(kDefaultUppers);
    if (!uppers.ok()) GTEST_SKIP() << "run `launcher doctor --fix` first (scripts/setup does): " << uppers.ToString();
    store_url_ = "file://" + dir_.Sub("store");
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0711), 0);  // the sandbox's root must reach its rootfs
    cgroup_parent_ = "strata-test-" + Basename(dir_.path());
    // Upper volumes in a directory of the test's own on the node's btrfs
    // (a dot name: the node's store does not list it), so tests running at
    // once do not see each other's.
    uppers_ = StrCat(kDefaultUppers, "/.test-", Basename(dir_.path()));
    ASSERT_OK(MakeDirs(uppers_, 0700));
    env_ = {"STRATA_STORE=" + store_url_, "STRATA_LAZYFS_SOCKET=" + dir_.Sub("lazyfs.sock"),
            "STRATA_CACHE=" + dir_.Sub("cache"), "STRATA_RUN_DIR=" + dir_.Sub("run"),
            "STRATA_CGROUP_PARENT=" + cgroup_parent_, "STRATA_LAUNCHER_SOCKET=" + dir_.Sub("launcher.sock"), "STRATA_UPPERS=" + uppers_};
    ASSERT_OK_AND_ASSIGN(auto store, cache::OpenStore(store_url_));
    catalog_ = std::make_unique<cache::Catalog>(store);
    ASSERT_OK(testing::MakeBusyboxRoot(dir_.Sub("busybox")));
    Publish(dir_.Sub("busybox"), "busybox", cache::LayerKind::kBase);
  }

  void TearDown() override {
    if (store_url_.empty()) return;  // skipped
    ExpectHostClean();
    // Whatever a failed test left (a launcher it killed) is swept before the
    // lazyfs daemon goes, so no mount outlives the test.
    NodeConfig node = Node();
    SweepStaleSandboxes(node).IgnoreError();
    node.managed = true;  // the daemon's too
    SweepStaleSandboxes(node).IgnoreError();
    // Stop the lazyfs daemon the launcher started for this test.
    lazyfs::Client client(dir_.Sub("lazyfs.sock"));
    if (client.Alive()) {
      auto stats = client.Call("stats");
      if (stats.ok()) {
        // The supervisor stops its serving process (which unmounts) and exits.
        const nlohmann::json& sup = (*stats)["supervisor"];
        pid_t pid = sup.is_object() ? sup["pid"].get<pid_t>() : (*stats)["pid"].get<pid_t>();
        ::kill(pid, SIGTERM);
        for (int i = 0; i < 500 && ::kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(10ms);
      }
    }
    for (const char* c : kControllers) ::rmdir(StrCat("/sys/fs/cgroup/", c, "/", cgroup_parent_).c_str());
    // The daemon's own (launcher/node/node_cgroup.h), empty once it and its lazyfs are gone.
    const std::string node_cgroup = StrCat("/sys/fs/cgroup/cpu/", cgroup_parent_, "-node");
    const int removed = ::rmdir(node_cgroup.c_str()) == 0 ? 0 : errno;
    EXPECT_TRUE(removed == 0 || removed == ENOENT) << node_cgroup << ": " << std::strerror(removed);
    ::rmdir((uppers_ + "/.snapshots").c_str());  // (made by the first snapshot; empty once each is packed)
    RemoveTree(uppers_ + "/.vm-templates").IgnoreError();  // (microVMs' upper disk templates, kept by design)
    EXPECT_EQ(::rmdir(uppers_.c_str()), 0) << uppers_ << ": " << std::strerror(errno);
  }

  NodeConfig Node() const {
    NodeConfig node = NodeConfig::FromEnvironment();
    node.backends = NodeBackends();
    node.run_dir = dir_.Sub("run");
    node.lazyfs_socket = dir_.Sub("lazyfs.sock");
    node.cache_dir = dir_.Sub("cache");
    node.cgroup_parent = cgroup_parent_;
    node.uppers = uppers_;
    return node;
  }

  Digest128 Publish(const std::string& src, const std::string& name, cache::LayerKind kind) {
    auto built = layerctl::BuildLayer({.source = src, .output_dir = dir_.Sub("build-" + name), .kind = kind, .name = name});
    if (!built.ok()) {
      ADD_FAILURE() << "build " << name << ": " << built.status().ToString();
      return {};
    }
    EXPECT_OK(layerctl::Push(*built, *catalog_, cache::LayerRef{name, "1"}).status());
    return built->digest;
  }

  std::string Tool() const { return testing::TestBinaryDir() + "/../../launcher/launcher"; }

  Result<SubprocessResult> Run(std::vector<std::string> args, Duration timeout = 120s) {
    args.insert(args.begin(), {Tool(), "run"});
    return RunCommand({.argv = args, .env = env_, .timeout = timeout});
  }

  std::set<std::string> UpperNames() const {
    std::set<std::string> names;
    if (auto store = UpperStore::Open(uppers_); store.ok()) {
      for (auto& name : store->List().value_or({})) names.insert(std::move(name));
    }
    return names;
  }

  // Nothing a sandbox made may outlive it: mounts, cgroups (and so
  // processes), subvolumes and their quotas, runtime state, directories.
  void ExpectHostClean() {
    for (const auto& line : Lines("/proc/self/mountinfo")) {
      EXPECT_EQ(line.find(dir_.Sub("run")), std::string::npos) << "mount left: " << line;
    }
    for (const char* c : kControllers) {
      DIR* d = ::opendir(StrCat("/sys/fs/cgroup/", c, "/", cgroup_parent_).c_str());
      if (!d) continue;
      while (dirent* e = ::readdir(d)) {
        EXPECT_FALSE(std::string_view(e->d_name).starts_with("sb-")) << "cgroup left: " << c << "/" << cgroup_parent_ << "/" << e->d_name;
      }
      ::closedir(d);
    }
    for (const auto& name : UpperNames()) ADD_FAILURE() << "subvolume left: " << name;
    DIR* run = ::opendir(dir_.Sub("run").c_str());
    if (run) {
      while (dirent* e = ::readdir(run)) EXPECT_FALSE(std::string(e->d_name).starts_with("sb-")) << "sandbox dir left: " << e->d_name;
      ::closedir(run);
    }
    auto procs = RunCommand({.argv = {"pgrep", "-f", dir_.Sub("run")}});
    EXPECT_TRUE(procs.ok() && procs->out.empty()) << "processes left: " << (procs.ok() ? procs->out : "");
  }

  static constexpr const char* kControllers[] = {"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "hugetlb", "memory", "pids", "systemd", "unified"};

  TempDir dir_ = MakeTempDir();
  std::string store_url_, cgroup_parent_, uppers_;
  std::vector<std::string> env_;
  std::unique_ptr<cache::Catalog> catalog_;
};

// A launcher daemon of the test's own (its socket, state and log in the
// test's directory), stopped and emptied at the end.
class DaemonFixture : public SandboxTest {
 protected:
  void SetUp() override {
    SandboxTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    socket_ = dir_.Sub("launcher.sock");
    client_ = std::make_unique<LauncherClient>(socket_);
  }

  void TearDown() override {
    if (daemon_) {
      if (client_->Alive()) {
        for (const auto& s : client_->List().value_or(nlohmann::json::array())) {
          client_->Destroy(s["id"].get<std::string>()).IgnoreError();
        }
        // Warm pools' ready sandboxes (a test that failed before removing its pools).
        for (const auto& p : client_->WarmPools().value_or(nlohmann::json::array())) {
          client_->SetWarmPool(p, 0).status().IgnoreError();
        }
        for (int i = 0; i < 600 && !client_->WarmPools().value_or(nlohmann::json::array()).empty(); ++i) std::this_thread::sleep_for(100ms);
      }
      StopDaemon(SIGTERM);
    }
    if (HasFailure()) {
      // What the daemon said (every start's, appended) tells why.
      std::string log = ReadFileToString(dir_.Sub("daemon.log")).value_or("");
      if (log.size() > 20000) log = "...\n" + log.substr(log.size() - 20000);
      std::fprintf(stderr, "--- daemon.log ---\n%s--- end of daemon.log ---\n", log.c_str());
    }
    SandboxTest::TearDown();
  }

  void StartDaemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {Tool(), "serve", "--socket", socket_, "--state", dir_.Sub("state")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = Subprocess::Start({.argv = argv, .env = env_, .stdout_mode = StdStream::kNull,
                                .stderr_mode = StdStream::kFile, .stderr_file = dir_.Sub("daemon.log")});
    ASSERT_OK(d.status());
    daemon_.emplace(std::move(*d));
    // (Up to 30 s: a restarted daemon re-adopts every sandbox before it
    // listens, and a microVM answers its ping through an emulated guest.)
    for (int i = 0; i < 3000 && !client_->Alive(); ++i) {
      ASSERT_TRUE(daemon_->Running()) << "the daemon exited: " << ReadFileToString(dir_.Sub("daemon.log")).value_or("");
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(client_->Alive());
  }

  void StopDaemon(int sig) {
    if (!daemon_) return;
    daemon_->Kill(sig);
    daemon_->Wait().status().IgnoreError();
    daemon_.reset();
  }

  Result<SubprocessResult> Cli(std::vector<std::string> args, std::optional<std::string> in = std::nullopt) {
    args.insert(args.begin(), Tool());
    args.insert(args.begin() + 2, {"--socket", socket_});
    return RunCommand({.argv = args, .env = env_, .stdin_data = std::move(in), .timeout = 120s});
  }

  std::string Create(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"create", "--layer", "busybox:1"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = Cli(args);
    EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.status().ToString());
    if (!r.ok()) return "";
    std::string id = r->out;
    while (!id.empty() && id.back() == '\n') id.pop_back();
    return id;
  }

  std::string socket_;
  std::unique_ptr<LauncherClient> client_;
  std::optional<Subprocess> daemon_;
};

}  // namespace strata::launcher
