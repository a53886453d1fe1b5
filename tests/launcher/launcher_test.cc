// System tests of `launcher run`: real crun, real overlay and EROFS mounts,
// a real btrfs for uppers (made by `launcher doctor --fix`).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "common/unique_fd.h"
#include "launcher/container/oci_config.h"
#include "tests/launcher/fixture.h"

namespace strata::launcher {
namespace {

class LauncherTest : public SandboxTest {};

TEST_F(LauncherTest, RunsACommandWithItsOutputAndExitCode) {
  ASSERT_OK_AND_ASSIGN(auto r, Run({"-v", "--layer", "busybox:1", "--", "sh", "-c", "echo out; echo err >&2; exit 3"}));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_EQ(r.out, "out\n");
  EXPECT_NE(r.err.find("err\n"), std::string::npos);
  EXPECT_NE(r.err.find("launcher: layer "), std::string::npos);  // -v: resolved digests
  ASSERT_OK_AND_ASSIGN(auto sig, Run({"--layer", "busybox:1", "--", "sh", "-c", "kill -TERM $$"}));
  EXPECT_EQ(sig.exit_code, 128 + SIGTERM);
  ASSERT_OK_AND_ASSIGN(auto killed, Run({"--layer", "busybox:1", "--", "sh", "-c", "kill -KILL $$"}));
  EXPECT_EQ(killed.exit_code, 137);
  EXPECT_EQ(killed.err.find("out of memory"), std::string::npos);
  ASSERT_OK_AND_ASSIGN(auto env, Run({"--layer", "busybox:1", "--env", "GREETING=hello", "--workdir", "/etc", "--", "sh", "-c", "echo $GREETING $(pwd)"}));
  EXPECT_EQ(env.out, "hello /etc\n");
  ASSERT_OK_AND_ASSIGN(auto missing, Run({"--layer", "busybox:1", "--", "/no/such/program"}));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/no/such/program"), std::string::npos) << missing.err;
}

TEST_F(LauncherTest, TimeoutKillsTheWholeTreeWith124) {
  auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(auto r, Run({"--timeout", "1s", "--layer", "busybox:1", "--", "sh", "-c", "sleep 60 & sleep 60"}));
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_NE(r.err.find("timed out"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

TEST_F(LauncherTest, StacksLayersAndADiffNeedsItsParents) {
  std::string tk = dir_.Sub("toolkit");
  ASSERT_OK(MakeDirs(tk + "/opt/tool"));
  ASSERT_OK(WriteFileAtomic(tk + "/opt/tool/hello", "from the toolkit\n"));
  Publish(tk, "toolkit", cache::LayerKind::kToolkit);
  ASSERT_OK_AND_ASSIGN(auto r, Run({"--layer", "busybox:1", "--layer", "toolkit:1", "--", "cat", "/opt/tool/hello"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "from the toolkit\n");
  ASSERT_OK_AND_ASSIGN(auto unknown, Run({"--layer", "nope:1", "--", "true"}));
  EXPECT_EQ(unknown.exit_code, 125);
  EXPECT_NE(unknown.err.find("nope:1"), std::string::npos);
}

TEST_F(LauncherTest, SandboxesAreIsolated) {
  // Overwriting /bin/sh changes only that sandbox.
  ASSERT_OK_AND_ASSIGN(auto vandal, Run({"--layer", "busybox:1", "--", "/bin/busybox", "sh", "-c", "rm /bin/sh && echo broken > /bin/sh && cat /bin/sh"}));
  EXPECT_EQ(vandal.out, "broken\n") << vandal.err;
  ASSERT_OK_AND_ASSIGN(auto next, Run({"--layer", "busybox:1", "--", "sh", "-c", "echo fine"}));
  EXPECT_EQ(next.out, "fine\n") << next.err;

  // Host processes are invisible.
  ASSERT_OK_AND_ASSIGN(auto ps, Run({"--layer", "busybox:1", "--", "sh", "-c", "ls /proc | grep -c '^[0-9]'"}));
  EXPECT_LE(std::stoi(ps.out), 4) << ps.out;

  // mount is not allowed.
  ASSERT_OK_AND_ASSIGN(auto mount, Run({"--layer", "busybox:1", "--", "mount", "-t", "tmpfs", "none", "/mnt"}));
  EXPECT_NE(mount.exit_code, 0);

  // Files are root's inside and the mapped id's outside.
  ASSERT_OK_AND_ASSIGN(Subprocess slow, Subprocess::Start({.argv = {Tool(), "run", "--layer", "busybox:1", "--", "sh", "-c",
                                                                    "touch /tmp/owned-marker && stat -c %u /tmp/owned-marker && sleep 5"},
                                                           .env = env_}));
  std::string outside;
  for (int i = 0; i < 200 && outside.empty(); ++i) {
    for (const auto& name : UpperNames()) {
      std::string path = StrCat(uppers_, "/", name, "/upper/tmp/owned-marker");
      if (::access(path.c_str(), F_OK) == 0) outside = path;
    }
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_FALSE(outside.empty());
  struct stat st;
  ASSERT_EQ(::stat(outside.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 100000u);
  ASSERT_OK_AND_ASSIGN(auto done, slow.Wait());
  EXPECT_EQ(done.out, "0\n");
}

// What a container sees (docs/security.md): superblocks of its own only
// where it needs one; /sys and the masks are the node's, shared read-only;
// /dev is its own directory of the node's tmpfs for them, gone with it.
TEST_F(LauncherTest, MountsAreSharedWhereASandboxNeedsNoneOfItsOwn) {
  ASSERT_OK_AND_ASSIGN(auto r, Run({"--layer", "busybox:1", "--", "sh", "-c",
                                    "cat /proc/self/mountinfo; echo ==; hostname; stat -c %a /dev/shm; echo x > /dev/shm/f && cat /dev/shm/f;"
                                    " touch /dev/made && stat -c %u /dev/made; cat /dev/null; head -c 3 /dev/zero | wc -c;"
                                    " rm -f /dev/null 2>/dev/null; mv /dev/zero /tmp/z 2>/dev/null; chmod 600 /dev/urandom 2>/dev/null;"
                                    " test -c /dev/null && test -c /dev/zero && stat -c %a /dev/urandom; head -c 5 /dev/urandom | wc -c;"
                                    " echo x > /dev/full || echo full; ls /dev/fd/ >/dev/null && readlink /dev/ptmx;"
                                    " ls /sys/class/net | wc -l; touch /sys/x 2>/dev/null || echo sys-ro;"
                                    " ls -A /sys/firmware 2>/dev/null | wc -l"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t split = r.out.find("==\n");
  ASSERT_NE(split, std::string::npos) << r.out;
  const std::string seen = r.out.substr(split + 3);
  const std::string sandbox = seen.substr(0, seen.find('\n'));
  EXPECT_EQ(seen, sandbox + "\n1777\nx\n0\n3\n666\n5\nfull\npts/ptmx\n0\nsys-ro\n0\n");
  EXPECT_EQ(::access(StrCat(kSandboxDevs, "/", sandbox).c_str(), F_OK), -1) << "its /dev outlived it";
  // The node's shared sysfs, masking directory and /dev tmpfs, as the host sees them.
  struct stat sysfs, empty, devs;
  ASSERT_EQ(::stat(kSandboxSysfs, &sysfs), 0);
  ASSERT_EQ(::stat(kMaskDir, &empty), 0);
  ASSERT_EQ(::stat(kSandboxDevs, &devs), 0);
  const std::string shared_sysfs = StrCat(major(sysfs.st_dev), ":", minor(sysfs.st_dev));
  const std::string shared_empty = StrCat(major(empty.st_dev), ":", minor(empty.st_dev));
  const std::string shared_devs = StrCat(major(devs.st_dev), ":", minor(devs.st_dev));
  std::map<std::string, std::string> fs_at;  // mount point -> "type dev"
  std::map<std::string, bool> read_only;     // mount point -> its mount is read-only
  std::map<std::string, std::string> root_of;  // mount point -> the root of its mount
  std::map<std::string, std::string> own;    // the sandbox's own superblocks: dev -> type
  std::istringstream in(r.out.substr(0, split));
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, options, field, type;
    f >> id >> parent >> dev >> root >> point >> options;
    while (f >> field && field != "-") {
    }
    f >> type;
    fs_at[point] = type + " " + dev;
    read_only[point] = options == "ro" || options.starts_with("ro,");
    root_of[point] = root;
    if (type != "devtmpfs" && dev != shared_empty && dev != shared_sysfs && dev != shared_devs && !point.starts_with("/.strata")) {
      own[dev] = type;
    }
  }
  EXPECT_EQ(fs_at["/sys"], "sysfs " + shared_sysfs);
  EXPECT_EQ(fs_at["/dev"], "tmpfs " + shared_devs);
  EXPECT_EQ(root_of["/dev"], "/" + sandbox + "/dev");
  EXPECT_FALSE(read_only["/dev"]);
  EXPECT_EQ(fs_at["/dev/shm"], "");  // a directory of /dev
  EXPECT_TRUE(read_only["/sys"]);
  // crun binds the node's empty directory over masked directories; other
  // runtimes (runc refuses binds inside /proc) mount the spec's read-only
  // tmpfs on each, superblocks of the sandbox's own.
  const char* runtime = std::getenv("STRATA_RUNTIME");
  const bool crun = !runtime || !*runtime || Basename(runtime) == "crun";
  std::multiset<std::string> expected = {"overlay", "proc", "devpts", "mqueue"};
  for (const char* p : kMaskedPaths) {
    struct stat st;
    if (::stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (crun) EXPECT_EQ(fs_at[p], "tmpfs " + shared_empty) << p;
    else EXPECT_TRUE(fs_at[p].starts_with("tmpfs ")) << p << ": " << fs_at[p];
    EXPECT_TRUE(read_only[p]) << p;
    if (!crun) expected.insert("tmpfs");
  }
  std::multiset<std::string> types;
  for (const auto& [dev, type] : own) types.insert(type);
  EXPECT_EQ(types, expected) << r.out;
}

TEST_F(LauncherTest, NoNetworkReachesNothingOnTheHost) {
  UniqueFd server(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(server.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(server.get(), 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(server.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  std::string port = std::to_string(ntohs(addr.sin_port));
  // Answers and hangs up, so a client that got through finishes; stopped
  // and joined however the test ends.
  struct Acceptor {
    std::atomic<bool> stop{false};
    std::thread thread;
    ~Acceptor() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } acceptor;
  acceptor.thread = std::thread([&] {
    while (!acceptor.stop) {
      pollfd p{server.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        UniqueFd c(::accept4(server.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (c) {
          ssize_t w = ::write(c.get(), "hi\n", 3);
          (void)w;
        }
      }
    }
  });
  ASSERT_OK_AND_ASSIGN(auto none, Run({"--layer", "busybox:1", "--", "sh", "-c", "nc -w 2 127.0.0.1 " + port + " </dev/null && echo reached"}));
  EXPECT_EQ(none.out.find("reached"), std::string::npos);
  ASSERT_OK_AND_ASSIGN(auto lo, Run({"--layer", "busybox:1", "--", "sh", "-c", "ip -o link | grep -c ."}));
  EXPECT_EQ(lo.out, "1\n");  // loopback only
  ASSERT_OK_AND_ASSIGN(auto host, Run({"--net", "host", "--layer", "busybox:1", "--", "sh", "-c", "nc -w 2 127.0.0.1 " + port + " </dev/null && echo reached"}));
  EXPECT_NE(host.out.find("reached"), std::string::npos) << host.err;
}

TEST_F(LauncherTest, LimitsHold) {
  // A fork bomb stops at the pids limit.
  ASSERT_OK_AND_ASSIGN(auto bomb, Run({"--pids", "32", "--timeout", "20s", "--layer", "busybox:1", "--", "sh", "-c",
                                       "i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done; echo $i"}));
  EXPECT_NE(bomb.err.find("fork"), std::string::npos) << bomb.out << bomb.err;
  // A memory hog is killed: 137 and the notice.
  ASSERT_OK_AND_ASSIGN(auto hog, Run({"--memory", "64M", "--layer", "busybox:1", "--", "dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1"}));
  EXPECT_EQ(hog.exit_code, 137) << hog.err;
  EXPECT_NE(hog.err.find("out of memory (limit 64.0 MiB)"), std::string::npos) << hog.err;
  // Output is capped outside the command's bytes.
  ASSERT_OK_AND_ASSIGN(auto yes, Run({"--output-cap", "64K", "--layer", "busybox:1", "--", "head", "-c", "10000000", "/dev/zero"}));
  EXPECT_EQ(yes.exit_code, 0);
  EXPECT_EQ(yes.out.size(), 65536u);
  EXPECT_NE(yes.err.find("stdout cut at 64.0 KiB (the command wrote 9.5 MiB)"), std::string::npos) << yes.err;
  // The disk cap holds.
  ASSERT_OK_AND_ASSIGN(auto disk, Run({"--disk", "20M", "--layer", "busybox:1", "--", "sh", "-c", "dd if=/dev/zero of=/big bs=1M count=100 2>&1; sync"}));
  EXPECT_TRUE(disk.out.find("Disk quota exceeded") != std::string::npos ||
              disk.out.find("No space left") != std::string::npos) << disk.out << disk.err;
}

// strata-nsexec, which every container's runtime starts through: the root
// it mounts is there for the program it runs and never in the node's
// namespace; a mount that fails says so and runs nothing.
TEST_F(LauncherTest, NsexecMountsTheRootForItsProgramAloneOrSaysWhyNot) {
  const std::string nsexec = testing::TestBinaryDir() + "/../../launcher/strata-nsexec";
  ASSERT_OK(MakeDirs(dir_.Sub("ns/a")));
  ASSERT_OK(MakeDirs(dir_.Sub("ns/b")));
  ASSERT_OK(MakeDirs(dir_.Sub("ns/root")));
  ASSERT_OK(WriteFileAtomic(dir_.Sub("ns/a/top"), "from a\n"));
  ASSERT_OK(WriteFileAtomic(dir_.Sub("ns/b/below"), "from b\n"));
  const std::string root = dir_.Sub("ns/root");
  const std::string lowers = StrCat("lowerdir=", dir_.Sub("ns/a"), ":", dir_.Sub("ns/b"));
  ASSERT_OK_AND_ASSIGN(auto r, RunCommand({.argv = {nsexec, "--overlay", root, lowers, "--read-only", "--", "sh", "-c",
                                                    StrCat("cat ", root, "/top ", root, "/below; touch ", root, "/new || echo read-only")}}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "from a\nfrom b\nread-only\n") << r.err;
  EXPECT_FALSE(IsMountPoint(root));
  for (const auto& line : Lines("/proc/self/mountinfo")) EXPECT_EQ(line.find(root), std::string::npos) << line;
  // Descriptors 3 and up reach the program.
  ASSERT_OK_AND_ASSIGN(auto fds, RunCommand({.argv = {"sh", "-c", StrCat("exec 3</dev/null; ", nsexec, " --overlay ", root, " ", lowers,
                                                                        " -- sh -c 'test -e /proc/self/fd/3 && echo passed'")}}));
  EXPECT_EQ(fds.out, "passed\n") << fds.err;

  ASSERT_OK_AND_ASSIGN(auto bad, RunCommand({.argv = {nsexec, "--overlay", root, "lowerdir=" + dir_.Sub("ns/missing"), "--", "echo", "ran"}}));
  EXPECT_EQ(bad.exit_code, 125);
  EXPECT_EQ(bad.out, "");
  EXPECT_NE(bad.err.find("strata-nsexec: mount the sandbox's root (overlay on " + root), std::string::npos) << bad.err;
  ASSERT_OK_AND_ASSIGN(auto usage, RunCommand({.argv = {nsexec, "--overlay", root}}));
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_NE(usage.err.find("usage: strata-nsexec"), std::string::npos) << usage.err;
}

TEST_F(LauncherTest, InterruptedAndFailedSandboxesLeaveNothing) {
  std::mt19937 rng(3);
  for (int i = 0; i < 12; ++i) {
    ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Start({.argv = {Tool(), "run", "--layer", "busybox:1", "--", "sh", "-c", "sleep 30"},
                                                          .env = env_, .stdout_mode = StdStream::kNull}));
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 400));
    int sig = (i % 3 == 0) ? SIGINT : SIGTERM;
    ::kill(p.pid(), sig);
    ASSERT_OK_AND_ASSIGN(auto r, p.Wait());
    EXPECT_TRUE(r.exit_code == 128 + sig || r.exit_code == 125) << r.exit_code << " " << r.err;
  }
  // A launcher killed outright: the next run sweeps up after it.
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Start({.argv = {Tool(), "run", "--layer", "busybox:1", "--", "sleep", "30"},
                                                        .env = env_, .stdout_mode = StdStream::kNull}));
  std::string killed;  // its sandbox
  for (int i = 0; i < 200; ++i) {
    DIR* d = ::opendir(dir_.Sub("run").c_str());
    bool started = false;
    while (d && !started) {
      dirent* e = ::readdir(d);
      if (!e) break;
      started = std::string(e->d_name).starts_with("sb-") && ::access(dir_.Sub(StrCat("run/", e->d_name, "/agent/agent.sock")).c_str(), F_OK) == 0;
      if (started) killed = e->d_name;
    }
    if (d) ::closedir(d);
    if (started) break;
    std::this_thread::sleep_for(20ms);
  }
  ::kill(p.pid(), SIGKILL);
  ASSERT_OK(p.Wait().status());
  // Setup failing half-way (a layer whose chunks are missing) undoes itself.
  std::string broken = dir_.Sub("broken");
  ASSERT_OK(MakeDirs(broken));
  ASSERT_OK(WriteFileAtomic(broken + "/f", "x"));
  Digest128 d = Publish(broken, "broken", cache::LayerKind::kToolkit);
  ASSERT_OK_AND_ASSIGN(cache::Manifest m, catalog_->GetManifest(d));
  ASSERT_OK(catalog_->store().Delete(cache::ChunkKey(m.meta_hash)));
  ASSERT_OK_AND_ASSIGN(auto failed, Run({"--layer", "busybox:1", "--layer", "broken:1", "--", "true"}));
  EXPECT_EQ(failed.exit_code, 125);
  EXPECT_NE(failed.err.find("mount layer"), std::string::npos) << failed.err;
  // The sweep in this run cleans up after the killed launcher.
  ASSERT_OK_AND_ASSIGN(auto after, Run({"--layer", "busybox:1", "--", "true"}));
  EXPECT_EQ(after.exit_code, 0) << after.err;
  ExpectHostClean();
  ASSERT_FALSE(killed.empty());
  EXPECT_NE(::access(StrCat(kSandboxDevs, "/", killed).c_str(), F_OK), 0) << "the killed launcher's sandbox kept its /dev";
}

}  // namespace
}  // namespace strata::launcher
