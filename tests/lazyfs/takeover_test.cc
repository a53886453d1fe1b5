// The serving process dies or is replaced under readers: nobody notices.
// These run the real `lazyfs daemon` (its supervisor and serving process)
// and kill -9 the serving process while 16 readers read cold layers.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <set>
#include <thread>

#include <fcntl.h>

#include <cstring>

#include "common/strings.h"
#include "common/subprocess.h"
#include "lazyfs/client.h"
#include "tests/lazyfs/lazyfs_fixture.h"

#ifndef STRATA_TAKEOVER_ROUNDS
#define STRATA_TAKEOVER_ROUNDS 3
#endif

namespace strata::lazyfs {
namespace {

using nlohmann::json;
using testing::RandomBytes;

constexpr int kReaders = 16;
constexpr size_t kFileBytes = 3 << 20;

class TakeoverTest : public LazyfsTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void TearDown() override {
    StopSupervised();
    LazyfsTest::TearDown();
  }

  void StopSupervised() {
    if (supervisor_ <= 0) return;
    ::kill(supervisor_, SIGTERM);
    for (int i = 0; i < 500 && ::kill(supervisor_, 0) == 0; ++i) std::this_thread::sleep_for(20ms);
    if (::kill(supervisor_, 0) == 0) {
      ADD_FAILURE() << "the supervisor did not stop on SIGTERM";
      ::kill(supervisor_, SIGKILL);
    }
    supervisor_ = -1;
  }

  Result<SubprocessResult> Lazyfs(std::vector<std::string> args) {
    args.insert(args.begin(), {Tool(), "--socket", socket_});
    return RunCommand({.argv = args, .env = {"STRATA_STORE=" + store_url_, "STRATA_CACHE=" + dir_.Sub("cache")}});
  }

  void StartSupervised() {
    ASSERT_OK_AND_ASSIGN(auto started, Lazyfs({"daemon", "--cache", dir_.Sub("cache"), "--grace", "0s"}));
    ASSERT_EQ(started.exit_code, 0) << started.err;
    ASSERT_OK_AND_ASSIGN(json health, client_.Call("health"));
    ASSERT_TRUE(health["supervisor"].is_object()) << health.dump();
    supervisor_ = health["supervisor"]["pid"].get<pid_t>();
  }

  pid_t ServingPid() {
    auto health = client_.Call("health");
    return health.ok() ? (*health)["pid"].get<pid_t>() : -1;
  }

  // Publishes a layer of kReaders files (random bytes, seeded by `round`).
  std::string PublishRound(int round) {
    const std::string src = dir_.Sub("src" + std::to_string(round));
    EXPECT_OK(MakeDirs(src + "/d"));
    for (int f = 0; f < kReaders; ++f) {
      EXPECT_OK(WriteFileAtomic(StrCat(src, "/d/f", f), RandomBytes(kFileBytes, round * 100 + f)));
    }
    Publish(src, "round" + std::to_string(round));
    return src;
  }

  // 16 readers read every file of `mp` in 64 KiB reads; what each got.
  struct Readers {
    std::vector<std::thread> threads;
    std::vector<std::string> got = std::vector<std::string>(kReaders);
    std::vector<std::string> errors = std::vector<std::string>(kReaders);
    std::atomic<int> started{0};
    void Start(const std::string& mp) {
      for (int f = 0; f < kReaders; ++f) {
        threads.emplace_back([this, mp, f] {
          UniqueFd fd(::open(StrCat(mp, "/d/f", f).c_str(), O_RDONLY | O_CLOEXEC));
          if (!fd) {
            errors[f] = StrCat("open: ", std::strerror(errno));
            return;
          }
          char buf[64 << 10];
          while (true) {
            ssize_t n = ::read(fd.get(), buf, sizeof buf);
            if (n < 0) {
              errors[f] = StrCat("read at ", got[f].size(), ": ", std::strerror(errno));
              return;
            }
            if (n == 0) return;
            got[f].append(buf, static_cast<size_t>(n));
            if (got[f].size() == static_cast<size_t>(n)) ++started;
          }
        });
      }
    }
    void Join() {
      for (auto& t : threads) t.join();
    }
  };

  const std::string socket_ = dir_.Sub("sup.sock");
  Client client_{socket_};
  pid_t supervisor_ = -1;
};

TEST_P(TakeoverTest, KillingTheServingProcessUnderColdReadersLosesNothing) {
  const std::string mode = GetParam();
  StartSupervised();
  for (int round = 0; round < STRATA_TAKEOVER_ROUNDS; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    PublishRound(round);
    const std::string mp = dir_.Sub("mnt" + std::to_string(round));
    ASSERT_OK_AND_ASSIGN(auto mounted,
                         Lazyfs({"mount", StrCat("round", round, ":1"), mp, "--record", "--mode", mode}));
    ASSERT_EQ(mounted.exit_code, 0) << mounted.err;
    const pid_t before = ServingPid();
    ASSERT_GT(before, 0);

    Readers readers;
    readers.Start(mp);
    // Kill it once every reader is under way (and most fetches are not done).
    for (int i = 0; i < 500 && readers.started < kReaders; ++i) std::this_thread::sleep_for(2ms);
    ASSERT_EQ(::kill(before, SIGKILL), 0);
    const auto killed = std::chrono::steady_clock::now();
    readers.Join();
    const auto stalled = std::chrono::steady_clock::now() - killed;

    for (int f = 0; f < kReaders; ++f) {
      EXPECT_EQ(readers.errors[f], "") << "reader " << f;
      EXPECT_TRUE(readers.got[f] == RandomBytes(kFileBytes, round * 100 + f))
          << "reader " << f << " got " << readers.got[f].size() << " bytes that differ from the source";
    }
    // A new serving process took over, without a command from anyone.
    const pid_t after = ServingPid();
    EXPECT_GT(after, 0);
    EXPECT_NE(after, before);
    EXPECT_LT(stalled, 10s);
    EXPECT_TRUE(IsMountPoint(mp));
    ASSERT_OK_AND_ASSIGN(json stats, client_.Call("stats", {{"mountpoint", mp}}));
    ASSERT_EQ(stats["layers"].size(), 1u) << stats.dump();
    EXPECT_EQ(stats["layers"][0]["read_errors"], 0);
    EXPECT_EQ(stats["supervisor"]["restarts"], round + 1);

    // The recording went on across the crash: every extent, each once.
    ASSERT_OK_AND_ASSIGN(auto unmounted, Lazyfs({"umount", mp}));
    ASSERT_EQ(unmounted.exit_code, 0) << unmounted.err;
    ASSERT_OK_AND_ASSIGN(Digest128 digest, catalog_->Resolve(StrCat("round", round, ":1")));
    ASSERT_OK_AND_ASSIGN(cache::Manifest manifest, catalog_->GetManifest(digest));
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> list, catalog_->GetAccessList(digest));
    std::set<uint32_t> distinct(list.begin(), list.end());
    EXPECT_EQ(list.size(), distinct.size()) << "an extent listed twice";
    EXPECT_EQ(distinct.size(), manifest.extents.size()) << "extents read but not recorded";
  }
  // Chunks were being fetched and written to the cache at every kill: what
  // the cache holds is whole and what it names.
  StopSupervised();
  cache::ChunkCacheOptions options;
  options.dir = dir_.Sub("cache");
  ASSERT_OK_AND_ASSIGN(auto cache, cache::ChunkCache::Open(options));
  ASSERT_OK_AND_ASSIGN(cache::VerifyReport report, cache->Verify());
  EXPECT_GT(report.checked, 0u);
  EXPECT_EQ(report.corrupt, 0u);
  EXPECT_EQ(report.missing, 0u);
}

TEST_P(TakeoverTest, AnUpgradeReplacesTheServingProcessUnderReaders) {
  const std::string mode = GetParam();
  StartSupervised();
  PublishRound(7);
  const std::string mp = dir_.Sub("mnt");
  ASSERT_OK_AND_ASSIGN(auto mounted, Lazyfs({"mount", "round7:1", mp, "--mode", mode}));
  ASSERT_EQ(mounted.exit_code, 0) << mounted.err;
  const pid_t before = ServingPid();
  Readers readers;
  readers.Start(mp);
  for (int i = 0; i < 500 && readers.started < kReaders; ++i) std::this_thread::sleep_for(2ms);
  ASSERT_OK_AND_ASSIGN(auto upgraded, Lazyfs({"upgrade"}));
  EXPECT_EQ(upgraded.exit_code, 0) << upgraded.err;
  EXPECT_NE(upgraded.out.find("replaced by"), std::string::npos) << upgraded.out;
  readers.Join();
  for (int f = 0; f < kReaders; ++f) {
    EXPECT_EQ(readers.errors[f], "") << "reader " << f;
    EXPECT_TRUE(readers.got[f] == RandomBytes(kFileBytes, 700 + f)) << "reader " << f;
  }
  EXPECT_NE(ServingPid(), before);

  // A binary that cannot serve: the old one comes back, and the upgrade
  // says why it failed.
  const pid_t second = ServingPid();
  ASSERT_OK_AND_ASSIGN(auto refused, Lazyfs({"upgrade", "--binary", "/bin/false"}));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("/bin/false"), std::string::npos) << refused.err;
  EXPECT_NE(ServingPid(), second);
  ASSERT_OK_AND_ASSIGN(std::string again, ReadFileToString(mp + "/d/f3"));
  EXPECT_TRUE(again == RandomBytes(kFileBytes, 703));
  ASSERT_OK_AND_ASSIGN(auto unmounted, Lazyfs({"umount", mp}));
  EXPECT_EQ(unmounted.exit_code, 0) << unmounted.err;
}

INSTANTIATE_TEST_SUITE_P(Modes, TakeoverTest, ::testing::Values("kernel", "fuse"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param == "kernel" ? "Kernel" : "Fuse"; });

TEST_F(LazyfsTest, KillingTheSupervisorCutsItsMountsAndTheNextDaemonCleansUp) {
  std::string src = dir_.Sub("src");
  ASSERT_OK(MakeDirs(src));
  ASSERT_OK(WriteFileAtomic(src + "/hello", "hello\n"));
  ASSERT_OK(WriteFileAtomic(src + "/later", RandomBytes(1 << 20, 5)));
  Publish(src, "cli");
  const std::string socket = dir_.Sub("cli.sock");
  auto lazyfs = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {Tool(), "--socket", socket});
    return RunCommand({.argv = args, .env = {"STRATA_STORE=" + store_url_, "STRATA_CACHE=" + dir_.Sub("cli-cache")}});
  };
  ASSERT_OK_AND_ASSIGN(auto mounted, lazyfs({"mount", "cli:1", dir_.Sub("m1")}));
  ASSERT_EQ(mounted.exit_code, 0) << mounted.err;
  ASSERT_OK_AND_ASSIGN(std::string hello, ReadFileToString(dir_.Sub("m1/hello")));
  EXPECT_EQ(hello, "hello\n");
  ASSERT_OK_AND_ASSIGN(auto stats, lazyfs({"stats", dir_.Sub("m1"), "--json"}));
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  auto j = nlohmann::json::parse(stats.out);
  const pid_t serving = j["pid"].get<pid_t>(), supervisor = j["supervisor"]["pid"].get<pid_t>();
  EXPECT_NE(serving, supervisor);

  // The supervisor goes: its serving process goes with it, the connections
  // are cut, reads fail at once instead of hanging, umount cleans up, and
  // the next mount starts a new daemon.
  ASSERT_EQ(::kill(supervisor, SIGKILL), 0);
  for (int i = 0; i < 200 && (::kill(supervisor, 0) == 0 || ::kill(serving, 0) == 0); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_NE(::kill(serving, 0), 0) << "the serving process outlived its supervisor";
  auto start = std::chrono::steady_clock::now();
  auto dead = ReadFileToString(dir_.Sub("m1/later"));
  EXPECT_FALSE(dead.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  ASSERT_OK_AND_ASSIGN(auto cleaned, lazyfs({"umount", dir_.Sub("m1")}));
  EXPECT_EQ(cleaned.exit_code, 0) << cleaned.err;
  EXPECT_FALSE(IsMountPoint(dir_.Sub("m1")));
  ASSERT_OK_AND_ASSIGN(auto again, lazyfs({"mount", "cli:1", dir_.Sub("m2")}));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  ASSERT_OK_AND_ASSIGN(std::string later, ReadFileToString(dir_.Sub("m2/later")));
  EXPECT_EQ(later, RandomBytes(1 << 20, 5));

  // SIGTERM to the supervisor: everything is unmounted and both exit.
  ASSERT_OK_AND_ASSIGN(auto s2, lazyfs({"stats", "--json"}));
  const pid_t sup2 = nlohmann::json::parse(s2.out)["supervisor"]["pid"].get<pid_t>();
  ASSERT_EQ(::kill(sup2, SIGTERM), 0);
  for (int i = 0; i < 300 && ::kill(sup2, 0) == 0; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_NE(::kill(sup2, 0), 0);
  EXPECT_FALSE(IsMountPoint(dir_.Sub("m2")));
  EXPECT_TRUE(MountsBelow(dir_.path()).empty());
}

}  // namespace
}  // namespace strata::lazyfs
