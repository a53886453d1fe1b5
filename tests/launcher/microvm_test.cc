// System tests of the microVM back end: real QEMU (TCG here, KVM where it
// works) booting the guest kernel of scripts/guest-kernel, through the
// launcher daemon. A microVM must look like a container of the same stack
// and clean up like one.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "launcher/vm/microvm.h"
#include "tests/launcher/file_attack.h"
#include "tests/launcher/fixture.h"
#include "vmm/guest_files.h"

namespace strata::launcher {
namespace {

using nlohmann::json;

class MicroVmTest : public DaemonFixture {
 protected:
  void SetUp() override {
    DaemonFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // The kernel is built by scripts/setup (scripts/guest-kernel): a missing
    // one is a failure, not a skip.
    kernel_ = NodeConfig::FromEnvironment().vm_kernel;
    ASSERT_EQ(::access(kernel_.c_str(), R_OK), 0) << "no guest kernel at " << kernel_ << ": run scripts/guest-kernel";
    ASSERT_EQ(::access("/usr/bin/qemu-system-x86_64", X_OK), 0) << "qemu-system-x86 is not installed";
  }

  std::string CreateVm(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--backend", "microvm"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Create(args);
  }

  // QEMU's pid (the jail's waiter holds it as its only child).
  pid_t QemuWaiter(const std::string& id) {
    auto text = ReadFileToString(StrCat(dir_.Sub("run"), "/", id, "/vm/vm.json"));
    if (!text.ok()) return -1;
    return json::parse(*text).value("pid", -1);
  }

  // Every path of the layers' tree with type, mode, owner, size (not of
  // directories: that is the upper filesystem's, btrfs or ext4) and mtime,
  // and every file's checksum, sorted: the same command in both back ends.
  // Left out: /.strata (each back end's own plumbing), what is mounted at
  // /proc, /sys and /dev, and the owners outside the container's id range
  // (a container's user namespace shows them as 65534; a microVM, having
  // no user namespace, as they are).
  static constexpr const char* kListTree =
      "set -f; cd / && P=\"! -path ./.strata ! -path ./.strata/* ! -path ./proc ! -path ./proc/* ! -path ./sys ! -path ./sys/* "
      "! -path ./dev ! -path ./dev/* ! -path ./owners/100000-165535\"; "
      "find . -xdev -mindepth 1 $P ! -type d -print0 | xargs -0 stat -c '%n|%f|%u|%g|%s|%Y' | sort; "
      "find . -xdev -mindepth 1 $P -type d -print0 | xargs -0 stat -c '%n|%f|%u|%g|%Y' | sort; "
      "find . -xdev -type f $P -print0 | xargs -0 md5sum | sort";

  std::string kernel_;
};

TEST_F(MicroVmTest, SeesExactlyWhatAContainerOfTheSameStackSees) {
  StartDaemon();
  // A second layer with awkward entries (hardlinks, symlinks, devices,
  // modes, owners, xattrs, odd names) over busybox.
  ASSERT_OK(MakeDirs(dir_.Sub("rich"), 0755));
  ASSERT_OK(testing::MakeRichTree(dir_.Sub("rich"), {.large_sparse_file = false, .wide_directory = false}));
  Publish(dir_.Sub("rich"), "rich", cache::LayerKind::kWorkspace);
  std::string vm = CreateVm({"--layer", "rich:1"});
  std::string ct = Create({"--layer", "rich:1"});
  ASSERT_FALSE(vm.empty());
  ASSERT_FALSE(ct.empty());
  ASSERT_OK_AND_ASSIGN(auto in_vm, Cli({"exec", vm, "--", "sh", "-c", kListTree}));
  ASSERT_OK_AND_ASSIGN(auto in_ct, Cli({"exec", ct, "--", "sh", "-c", kListTree}));
  EXPECT_EQ(in_vm.exit_code, 0) << in_vm.err;
  EXPECT_EQ(in_ct.exit_code, 0) << in_ct.err;
  EXPECT_GT(std::count(in_vm.out.begin(), in_vm.out.end(), '\n'), 100) << in_vm.out;
  // (Only the lines that differ, not two listings of 400 lines.)
  std::vector<std::string> vm_lines = Split(in_vm.out, '\n'), ct_lines = Split(in_ct.out, '\n'), only_vm, only_ct;
  std::sort(vm_lines.begin(), vm_lines.end());
  std::sort(ct_lines.begin(), ct_lines.end());
  std::set_difference(vm_lines.begin(), vm_lines.end(), ct_lines.begin(), ct_lines.end(), std::back_inserter(only_vm));
  std::set_difference(ct_lines.begin(), ct_lines.end(), vm_lines.begin(), vm_lines.end(), std::back_inserter(only_ct));
  EXPECT_TRUE(only_vm.empty() && only_ct.empty()) << "only in the microVM:\n" << Join(only_vm, "\n")
                                                  << "\nonly in the container:\n" << Join(only_ct, "\n");
  // Its own kernel: not the node's.
  ASSERT_OK_AND_ASSIGN(auto uname, Cli({"exec", vm, "--", "uname", "-r"}));
  struct utsname host{};
  ::uname(&host);
  EXPECT_NE(uname.out, std::string(host.release) + "\n");
  ASSERT_OK_AND_ASSIGN(auto info, client_->Info(vm));
  EXPECT_EQ(info["backend"], "microvm");
}

TEST_F(MicroVmTest, QemuRunsJailedAndGuestsSeeNothingOfTheNodeOrEachOther) {
  StartDaemon();
  std::string a = CreateVm(), b = CreateVm();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  // QEMU: the waiter's one child, as its own uid, in namespaces of its own,
  // under seccomp, with only its files in its root.
  pid_t waiter = QemuWaiter(a);
  ASSERT_GT(waiter, 0);
  auto children = ReadFileToString(StrCat("/proc/", waiter, "/task/", waiter, "/children"));
  ASSERT_TRUE(children.ok() && !children->empty());
  const pid_t qemu = std::atoi(children->c_str());
  std::map<std::string, std::string> status;
  for (const auto& line : Lines(StrCat("/proc/", qemu, "/status"))) {
    size_t colon = line.find(':');
    if (colon != std::string::npos) status[line.substr(0, colon)] = line.substr(colon + 1);
  }
  EXPECT_GE(std::stoul(Split(status["Uid"], '\t')[1]), 400000u) << status["Uid"];
  EXPECT_EQ(Split(status["Seccomp"], '\t').back(), "2") << status["Seccomp"];
  EXPECT_EQ(Split(status["NoNewPrivs"], '\t').back(), "1");
  for (const char* ns : {"mnt", "pid", "net", "ipc", "uts"}) {
    char mine[64] = {}, its[64] = {};
    ASSERT_GT(::readlink(StrCat("/proc/self/ns/", ns).c_str(), mine, sizeof mine - 1), 0);
    ASSERT_GT(::readlink(StrCat("/proc/", qemu, "/ns/", ns).c_str(), its, sizeof its - 1), 0);
    EXPECT_STRNE(mine, its) << ns;
  }
  std::set<std::string> root;
  DIR* d = ::opendir(StrCat("/proc/", qemu, "/root").c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) root.insert(e->d_name);
  ::closedir(d);
  for (const auto& name : root) {
    EXPECT_TRUE(name == "." || name == ".." || name == "usr" || name == "vm" || name == "dev" || name == "proc" ||
                name == "etc" || name.starts_with("lib") || name == "bin" || name == "sbin")
        << "QEMU's root holds " << name;
  }
  EXPECT_EQ(root.count("home") + root.count("var") + root.count("run") + root.count("tmp"), 0u);
  // The guest sees its own processes only, and its own kernel's.
  ASSERT_OK_AND_ASSIGN(auto ps, Cli({"exec", a, "--", "sh", "-c", "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline"}));
  EXPECT_LT(std::stoi(ps.out), 40) << ps.out;
  EXPECT_NE(ps.out.find("/init"), std::string::npos) << ps.out;
  // /bin/sh overwritten in one guest stays there.
  ASSERT_OK_AND_ASSIGN(auto clobber, Cli({"exec", a, "--", "/bin/busybox", "sh", "-c", "rm /bin/sh && echo broken > /bin/sh"}));
  ASSERT_EQ(clobber.exit_code, 0) << clobber.err;
  ASSERT_OK_AND_ASSIGN(auto other, Cli({"exec", b, "--", "sh", "-c", "echo fine"}));
  EXPECT_EQ(other.out, "fine\n") << other.err;
  std::string c = CreateVm();
  ASSERT_OK_AND_ASSIGN(auto fresh, Cli({"exec", c, "--", "sh", "-c", "echo fine"}));
  EXPECT_EQ(fresh.out, "fine\n") << fresh.err;
}

TEST_F(MicroVmTest, LaterMicroVmsOfAStackResumeFromItsTemplateEachAsItsOwnMachine) {
  StartDaemon();
  auto template_of = [&](const std::string& id) {
    auto text = ReadFileToString(StrCat(dir_.Sub("run"), "/", id, "/state.json"));
    return text.ok() ? json::parse(*text, nullptr, false)["vm"].value("template", "?") : std::string("?");
  };
  // The first boots and leaves its stack's template; the next resume from it.
  const std::string a = CreateVm();
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(template_of(a), "");
  const std::string b = CreateVm(), c = CreateVm();
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(template_of(b).size(), 32u) << template_of(b);
  EXPECT_EQ(template_of(c), template_of(b));
  // Each is itself: its name, the node's time, its own random numbers, its
  // own disk.
  std::set<std::string> randoms;
  for (const auto& id : {a, b, c}) {
    ASSERT_OK_AND_ASSIGN(auto r, Cli({"exec", id, "--", "sh", "-c",
                                      "hostname; date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; "
                                      "echo " + id + " > /mine; ls /mine*"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto lines = Split(r.out, '\n');
    ASSERT_GE(lines.size(), 4u) << r.out;
    EXPECT_EQ(lines[0], id);
    EXPECT_LT(std::abs(std::atoll(lines[1].c_str()) - static_cast<long long>(::time(nullptr))), 30) << r.out;
    randoms.insert(lines[2]);
    EXPECT_EQ(lines[3], "/mine");
  }
  EXPECT_EQ(randoms.size(), 3u);
  for (const auto& id : {a, b, c}) {
    ASSERT_OK_AND_ASSIGN(auto r, Cli({"exec", id, "--", "cat", "/mine"}));
    EXPECT_EQ(r.out, id + "\n");
  }
  // A template whose state QEMU refuses is dropped, and the create boots.
  const std::string saved = StrCat(uppers_, "/.vm-templates/saved/", template_of(b), "/state");
  ASSERT_OK(WriteFileAtomic(saved, "not a migration stream", false));
  const std::string d = CreateVm();
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(template_of(d), "");
  ASSERT_OK_AND_ASSIGN(auto r, Cli({"exec", d, "--", "hostname"}));
  EXPECT_EQ(r.out, d + "\n");
  for (const auto& id : {a, b, c, d}) ASSERT_OK(client_->Destroy(id));
  StopDaemon(SIGTERM);
  ExpectHostClean();
}

TEST_F(MicroVmTest, ExecStreamsExitCodesTimeoutsAndCaps) {
  StartDaemon();
  std::string id = CreateVm({"--memory", "192M"});
  ASSERT_FALSE(id.empty());
  ASSERT_OK_AND_ASSIGN(auto r, Cli({"exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3"}));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_EQ(r.out, "out\n");
  EXPECT_NE(r.err.find("err\n"), std::string::npos);
  ASSERT_OK_AND_ASSIGN(auto in, Cli({"exec", id, "-i", "--", "cat"}, "piped in\n"));
  EXPECT_EQ(in.out, "piped in\n") << in.err;
  ASSERT_OK_AND_ASSIGN(auto killed, Cli({"exec", id, "--", "sh", "-c", "kill -9 $$"}));
  EXPECT_EQ(killed.exit_code, 137) << killed.err;
  ASSERT_OK_AND_ASSIGN(auto slow, Cli({"exec", id, "--timeout", "1s", "--", "sleep", "30"}));
  EXPECT_EQ(slow.exit_code, 124) << slow.err;
  ASSERT_OK_AND_ASSIGN(auto big, Cli({"exec", id, "--output-cap", "1000", "--", "sh", "-c", "yes | head -c 100000"}));
  EXPECT_EQ(big.out.size(), 1000u);
  EXPECT_NE(big.err.find("stdout cut at 1000 B"), std::string::npos) << big.err;
  // The guest's OOM killer: 137 and the notice.
  ASSERT_OK_AND_ASSIGN(auto oom, Cli({"exec", id, "--", "awk", "BEGIN { s = \"x\"; while (1) s = s s }"}));
  EXPECT_EQ(oom.exit_code, 137) << oom.err;
  EXPECT_NE(oom.err.find("out of memory"), std::string::npos) << oom.err;
  // State stays between commands.
  ASSERT_OK_AND_ASSIGN(auto write, Cli({"exec", id, "--", "sh", "-c", "echo kept > /root/state"}));
  EXPECT_EQ(write.exit_code, 0) << write.err;
  ASSERT_OK_AND_ASSIGN(auto read, Cli({"exec", id, "--", "cat", "/root/state"}));
  EXPECT_EQ(read.out, "kept\n");
}

TEST_F(MicroVmTest, CopiesBothWaysAndConcurrentCalls) {
  StartDaemon();
  std::string id = CreateVm();
  ASSERT_FALSE(id.empty());
  std::string data;
  std::mt19937 rng(7);
  for (int i = 0; i < (3 << 20); ++i) data.push_back(static_cast<char>(rng()));
  ASSERT_OK(WriteFileAtomic(dir_.Sub("in.bin"), data));
  ASSERT_OK_AND_ASSIGN(auto put, Cli({"cp", dir_.Sub("in.bin"), id + ":/root/in.bin"}));
  EXPECT_EQ(put.exit_code, 0) << put.err;
  ASSERT_OK_AND_ASSIGN(auto get, Cli({"cp", id + ":/root/in.bin", dir_.Sub("out.bin")}));
  EXPECT_EQ(get.exit_code, 0) << get.err;
  EXPECT_TRUE(ReadFileToString(dir_.Sub("out.bin")).value_or("") == data);
  // Several calls at once share the one channel.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      auto r = Cli({"exec", id, "--", "sh", "-c", StrCat("sleep 1; head -c 200000 /root/in.bin | md5sum; echo ", i)});
      if (r.ok() && r->exit_code == 0 && r->out.ends_with(StrCat(i, "\n"))) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 6);
}

TEST_F(MicroVmTest, PauseStopsTheWholeMachineAndResumeContinuesIt) {
  StartDaemon();
  std::string id = CreateVm();
  ASSERT_FALSE(id.empty());
  ASSERT_OK_AND_ASSIGN(auto bg, Cli({"exec", id, "--", "sh", "-c", "(while :; do date +%s%N >> /root/ticks; sleep 0.1; done) >/dev/null 2>&1 &"}));
  ASSERT_EQ(bg.exit_code, 0) << bg.err;
  std::this_thread::sleep_for(1s);
  ASSERT_OK(client_->Pause(id));
  ASSERT_OK_AND_ASSIGN(auto info, client_->Info(id));
  EXPECT_EQ(info["state"], "paused");
  auto refused = Cli({"exec", id, "--", "true"});
  ASSERT_TRUE(refused.ok());
  EXPECT_NE(refused->exit_code, 0);
  std::this_thread::sleep_for(2s);
  ASSERT_OK(client_->Resume(id));
  ASSERT_OK_AND_ASSIGN(auto ticks, Cli({"exec", id, "--", "sh", "-c", "wc -l < /root/ticks"}));
  EXPECT_EQ(ticks.exit_code, 0) << ticks.err;
}

TEST_F(MicroVmTest, SnapshotRestoresIntoAContainerAndAMicroVm) {
  StartDaemon();
  std::string id = CreateVm();
  ASSERT_FALSE(id.empty());
  ASSERT_OK_AND_ASSIGN(auto write, Cli({"exec", id, "--", "sh", "-c",
                                        "mkdir -p /work && echo from-the-vm > /work/made && chmod 640 /work/made && rm /bin/ls"}));
  ASSERT_EQ(write.exit_code, 0) << write.err;
  ASSERT_OK_AND_ASSIGN(auto snap, client_->Snapshot(id, "vmsnap:1"));
  EXPECT_EQ(snap["parents"].size(), 1u) << snap.dump();
  // The VM runs on after its snapshot.
  ASSERT_OK_AND_ASSIGN(auto after, Cli({"exec", id, "--", "cat", "/work/made"}));
  EXPECT_EQ(after.out, "from-the-vm\n");
  for (const char* backend : {"container", "microvm"}) {
    std::string restored = Create({"--backend", backend, "--layer", "vmsnap:1"});
    ASSERT_FALSE(restored.empty()) << backend;
    ASSERT_OK_AND_ASSIGN(auto cat, Cli({"exec", restored, "--", "sh", "-c", "stat -c %a /work/made; cat /work/made; ls /bin/ls || echo gone"}));
    EXPECT_EQ(cat.out, "640\nfrom-the-vm\ngone\n") << backend << ": " << cat.err;
  }
}

TEST_F(MicroVmTest, AKilledDaemonsMicroVmsAreAdoptedAgain) {
  StartDaemon();
  std::string id = CreateVm();
  ASSERT_FALSE(id.empty());
  ASSERT_OK_AND_ASSIGN(auto write, Cli({"exec", id, "--", "sh", "-c", "echo before > /root/f"}));
  ASSERT_EQ(write.exit_code, 0);
  StopDaemon(SIGKILL);
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(auto read, Cli({"exec", id, "--", "cat", "/root/f"}));
  EXPECT_EQ(read.out, "before\n") << read.err;
  ASSERT_OK(client_->Destroy(id));
}

TEST_F(MicroVmTest, AWarmPoolKeepsBootedMicroVmsForTheCreatesThatMatch) {
  // Each microVM commits its guest's 256 MiB and 160 MiB for QEMU: a
  // capacity of 1 GiB holds two, so the pool's second guest fits, a third
  // would not, and a create that takes a ready one must not count it twice.
  const std::vector<std::string> flags = {"--memory-capacity", "1G"};
  StartDaemon(flags);
  ASSERT_OK_AND_ASSIGN(json set, client_->SetWarmPool({{"layers", {"busybox:1"}}, {"backend", "microvm"}}, 2));
  const std::string name = set.value("name", "");
  EXPECT_EQ(set.value("backend", ""), "microvm") << set.dump();
  auto pool = [&] {
    for (const auto& p : client_->WarmPools().value_or(json::array())) {
      if (p.value("name", "") == name) return p;
    }
    return json::object();
  };
  auto wait_ready = [&](int n) {
    for (int i = 0; i < 900 && pool().value("ready", -1) != n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return pool().value("ready", -1) == n;
  };
  ASSERT_TRUE(wait_ready(2)) << pool().dump();
  // A container of the same stack is not the pool's.
  const std::string container = Create({});
  ASSERT_FALSE(container.empty());
  ASSERT_OK_AND_ASSIGN(json cinfo, client_->Info(container));
  EXPECT_FALSE(cinfo.contains("warm_pool")) << cinfo.dump();
  // A microVM create takes a booted guest, under its own id, env and workdir.
  const auto start = std::chrono::steady_clock::now();
  const std::string id = CreateVm({"--env", "WHO=a", "--workdir", "/tmp"});
  ASSERT_FALSE(id.empty());
  ASSERT_OK_AND_ASSIGN(auto first, Cli({"exec", id, "--", "sh", "-c", "echo $WHO; pwd; ls -A /tmp | wc -l"}));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(first.out, "a\n/tmp\n0\n") << first.err;
  ASSERT_OK_AND_ASSIGN(json info, client_->Info(id));
  EXPECT_EQ(info.value("warm_pool", ""), name) << info.dump();
  EXPECT_EQ(info.value("backend", ""), "microvm");
  const std::string internal = info.value("internal_id", "");
  EXPECT_TRUE(internal.starts_with("sb-") && internal != id) << info.dump();
  std::fprintf(stderr, "create -> first exec from the pool (CLI processes included): %.0f ms\n",
               std::chrono::duration<double, std::milli>(took).count());
  // A refill would pass the capacity (the taken guest and the ready one
  // commit 832 MiB): none is made.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(pool().value("ready", -1), 1) << pool().dump();
  EXPECT_EQ(pool().value("made", -1), 2) << pool().dump();
  // A kill -9 of the daemon keeps the taken guest and the ready one.
  StopDaemon(SIGKILL);
  StartDaemon(flags);
  ASSERT_OK_AND_ASSIGN(auto again, Cli({"exec", id, "--", "sh", "-c", "echo $WHO"}));
  EXPECT_EQ(again.out, "a\n") << again.err;
  ASSERT_TRUE(wait_ready(1)) << pool().dump();
  ASSERT_OK(client_->Destroy(id));
  EXPECT_NE(::access(dir_.Sub("run/" + internal).c_str(), F_OK), 0);
  ASSERT_OK(client_->Destroy(container));
  // With room again the pool refills; size 0 stops its guests.
  EXPECT_TRUE(wait_ready(2)) << pool().dump();
  ASSERT_OK(client_->SetWarmPool({{"layers", {"busybox:1"}}, {"backend", "microvm"}}, 0).status());
  for (int i = 0; i < 300 && !client_->WarmPools().value_or(json::array()).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(client_->WarmPools().value_or(json::array()).empty());
  StopDaemon(SIGTERM);
  ExpectHostClean();
}

TEST_F(MicroVmTest, AKilledQemuFailsCallsClearlyAndDestroyCleansUp) {
  StartDaemon();
  std::string id = CreateVm();
  ASSERT_FALSE(id.empty());
  pid_t waiter = QemuWaiter(id);
  ASSERT_GT(waiter, 0);
  ASSERT_EQ(::kill(waiter, SIGKILL), 0);
  std::this_thread::sleep_for(500ms);
  ASSERT_OK_AND_ASSIGN(auto r, Cli({"exec", id, "--", "true"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("microVM is gone"), std::string::npos) << r.err;
  ASSERT_OK(client_->Destroy(id));
  // A guest kernel panic ends QEMU the same way (panic=-1, -no-reboot).
  std::string panicking = CreateVm();
  ASSERT_FALSE(panicking.empty());
  Cli({"exec", panicking, "--", "sh", "-c", "echo c > /proc/sysrq-trigger"}).status().IgnoreError();
  auto after = Cli({"exec", panicking, "--", "true"});
  ASSERT_TRUE(after.ok());
  EXPECT_NE(after->exit_code, 0);
  ASSERT_OK(client_->Destroy(panicking));
}

TEST_F(MicroVmTest, BadInputFailsClearlyWithinADeadline) {
  // A corrupt kernel, then a missing one.
  ASSERT_OK(WriteFileAtomic(dir_.Sub("bad-vmlinux"), std::string(1 << 20, 'x')));
  env_.push_back("STRATA_VM_KERNEL=" + dir_.Sub("bad-vmlinux"));
  StartDaemon();
  auto start = std::chrono::steady_clock::now();
  auto corrupt = Cli({"create", "--backend", "microvm", "--layer", "busybox:1"});
  ASSERT_TRUE(corrupt.ok());
  EXPECT_NE(corrupt->exit_code, 0);
  EXPECT_NE(corrupt->err.find("QEMU"), std::string::npos) << corrupt->err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 100s);
  StopDaemon(SIGTERM);
  env_.back() = "STRATA_VM_KERNEL=" + dir_.Sub("no-such-vmlinux");
  StartDaemon();
  auto missing = Cli({"create", "--backend", "microvm", "--layer", "busybox:1"});
  ASSERT_TRUE(missing.ok());
  EXPECT_NE(missing->exit_code, 0);
  EXPECT_NE(missing->err.find("guest kernel"), std::string::npos) << missing->err;
  // Too many layers for the machine's slots.
  StopDaemon(SIGTERM);
  env_.pop_back();
  StartDaemon();
  std::vector<std::string> args = {"create", "--backend", "microvm"};
  for (int i = 0; i < 11; ++i) {
    const std::string src = dir_.Sub(StrCat("l", i));
    ASSERT_OK(MakeDirs(src, 0755));
    ASSERT_OK(WriteFileAtomic(src + StrCat("/f", i), "x"));
    Publish(src, StrCat("l", i), cache::LayerKind::kToolkit);
    args.insert(args.end(), {"--layer", StrCat("l", i, ":1")});
  }
  args.insert(args.end(), {"--layer", "busybox:1"});
  auto many = Cli(args);
  ASSERT_TRUE(many.ok());
  EXPECT_NE(many->exit_code, 0);
  EXPECT_NE(many->err.find("at most 10"), std::string::npos) << many->err;
}

TEST_F(MicroVmTest, AGuestThatNeverAnswersFailsAtTheBootDeadline) {
  // An initramfs whose /init is not the agent (busybox's init: it runs on
  // and never answers the channel).
  ASSERT_EQ(::access("/bin/busybox", X_OK), 0) << "busybox-static is not installed";
  ASSERT_OK_AND_ASSIGN(std::string busybox, ReadFileToString("/bin/busybox"));
  ASSERT_OK(WriteFileAtomic(dir_.Sub("not-an-agent"), busybox, false, 0755));
  env_.push_back("STRATA_AGENT=" + dir_.Sub("not-an-agent"));
  env_.push_back("STRATA_VM_BOOT_TIMEOUT=8");
  StartDaemon();
  const auto start = std::chrono::steady_clock::now();
  auto silent = Cli({"create", "--backend", "microvm", "--layer", "busybox:1"});
  ASSERT_TRUE(silent.ok());
  EXPECT_NE(silent->exit_code, 0);
  EXPECT_NE(silent->err.find("did not answer within 8 s (boot)"), std::string::npos) << silent->err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 40s);
  ExpectHostClean();
}

// Below the daemon: a guest given a layer disk that is no EROFS image
// stops at that step, says so on its console, and powers off.
TEST_F(MicroVmTest, ALayerThatDoesNotMountInTheGuestStopsItsBoot) {
  const NodeConfig node = NodeConfig::FromEnvironment();
  const std::string build = testing::TestBinaryDir() + "/../..";
  MicroVmSpec spec;
  spec.id = "sb-badlayer";
  spec.dir = dir_.Sub("run/sb-badlayer");
  ASSERT_OK(MakeDirs(spec.dir, 0700));
  spec.agent_socket = spec.dir + "/agent.sock";
  ASSERT_OK(WriteFileAtomic(dir_.Sub("zeros.meta"), std::string(1 << 20, '\0')));
  ASSERT_OK(WriteFileAtomic(dir_.Sub("zeros.blob"), std::string(1 << 20, '\0')));
  spec.layers = {{dir_.Sub("zeros.meta"), dir_.Sub("zeros.blob")}};
  ASSERT_OK_AND_ASSIGN(spec.upper_disk, vmm::EnsureExt4Template(dir_.Sub("templates"), uint64_t{64} << 20));
  spec.console_log = spec.dir + "/console.log";
  spec.kernel = kernel_;
  ASSERT_OK_AND_ASSIGN(spec.initramfs, vmm::EnsureInitramfs(build + "/launcher/strata-agent", {}, dir_.Sub("vm-cache")));
  spec.jail_binary = build + "/vmm/strata-jail";
  spec.accel = node.vm_accel;
  spec.memory = uint64_t{128} << 20;
  spec.cgroup = cgroup_parent_ + "/" + spec.id;
  ASSERT_OK_AND_ASSIGN(auto vm, MicroVm::Start(spec));
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (vm->Running() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(vm->Running()) << "the guest did not stop within 60 s";
  const std::string why = vm->Why();
  EXPECT_NE(why.find("boot: layer 0"), std::string::npos) << why;
  EXPECT_NE(why.find("erofs"), std::string::npos) << why;
  EXPECT_OK(vm->Stop());
  vm.reset();
  for (const char* c : kControllers) ::rmdir(StrCat("/sys/fs/cgroup/", c, "/", spec.cgroup).c_str());
  ::rmdir(StrCat("/sys/fs/cgroup/", spec.cgroup).c_str());
  ASSERT_OK(RemoveTree(spec.dir));
  ExpectHostClean();
}

// File rules hold in a guest as in a container: its commands get a
// container's capabilities and seccomp profile, though the agent is the
// guest's real root (tests/launcher/file_rules_test.cc has the container's).
TEST_F(MicroVmTest, FileRulesHoldInAGuest) {
  StartDaemon();
  const std::string id = CreateVm({"--deny", "/grader", "--read-only", "/opt/harness"});
  ASSERT_FALSE(id.empty());
  const std::string container = Create({"--deny", "/grader"});
  ASSERT_FALSE(container.empty());
  auto put = [&](const std::string& content, const std::string& path, mode_t mode) {
    const std::string local = dir_.Sub("put" + std::to_string(std::hash<std::string>{}(path)));
    ASSERT_OK(WriteFileAtomic(local, content, false, mode));
    ASSERT_OK_AND_ASSIGN(auto r, Cli({"cp", local, id + ":" + path}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  };
  ASSERT_OK_AND_ASSIGN(std::string prober, ReadFileToString(testing::TestBinaryDir() + "/strata-test-prober"));
  put(prober, "/usr/bin/prober", 0755);
  put("#!/bin/sh\necho harness ran\n", "/opt/harness/run.sh", 0755);
  // The guest's agent runs under no seccomp program; its commands load
  // the whole default profile (a container's load a small one on top of
  // their agent's: file_rules_test.cc).
  ASSERT_OK_AND_ASSIGN(auto syscalls, Cli({"exec", id, "--", "prober", "syscalls"}));
  for (const char* line : kRefusedSyscalls) {
    EXPECT_NE(syscalls.out.find(std::string(line) + "\n"), std::string::npos) << line << ":\n" << syscalls.out << syscalls.err;
  }
  for (const char* call : {"mount32", "unshare32"}) {  // (where the guest's kernel has the 32-bit entry)
    EXPECT_TRUE(syscalls.out.find(StrCat(call, ": err EPERM\n")) != std::string::npos ||
                syscalls.out.find(StrCat(call, ": no 32-bit entry\n")) != std::string::npos)
        << call << ":\n" << syscalls.out << syscalls.err;
  }
  ASSERT_OK_AND_ASSIGN(auto hold, Cli({"exec", id, "--", "sh", "-c",
                                       "prober hold /tmp/fds /grader / > /tmp/hold.log 2>&1 & "
                                       "for i in $(seq 100); do grep -q holding /tmp/hold.log 2>/dev/null && exit 0; sleep 0.1; done; exit 1"}));
  ASSERT_EQ(hold.exit_code, 0) << hold.err;
  put(std::string(kSecret) + "\n", "/grader/secret", 0644);
  ASSERT_OK_AND_ASSIGN(auto grader, Cli({"exec", id, "--role", "grader", "--", "cat", "/grader/secret"}));
  EXPECT_EQ(grader.out, std::string(kSecret) + "\n") << grader.err;
  // Every route a container's command has, and the guest's own: its raw
  // upper disk (a device node made for it) and its kernel's interfaces.
  const std::string guest_routes = R"sh(
echo rawdisk; sync; for b in /sys/block/vd*; do [ "$(cat $b/serial)" = upper ] && mknod /dev/upper-disk b $(tr : ' ' < $b/dev); done
head -c 268435456 /dev/upper-disk | grep -a -o 'answer is 4.'; mkdir -p /tmp/m; mount -t ext4 /dev/upper-disk /tmp/m && cat /tmp/m/upper/grader/secret
echo unmount; umount /grader && cat /grader/secret; mount -t tmpfs none /grader && ls -A /grader
echo upper; ls -A /.strata; cat /.strata/upper/upper/grader/secret; find / -xdev -path '*/upper/grader/secret' 2>/dev/null
echo cgroup; echo $$ > /sys/fs/cgroup/cgroup.procs || echo no-cgroup-move; echo max > /sys/fs/cgroup/commands/memory.max || echo no-limit-change
echo end-of-guest-routes
)sh";
  ASSERT_OK_AND_ASSIGN(auto attack, Cli({"exec", id, "--", "sh", "-c", std::string(kAttack) + guest_routes}));
  EXPECT_EQ(attack.out.find(kLeakMark), std::string::npos) << "leaked:\n" << attack.out << attack.err;
  EXPECT_EQ(attack.err.find(kLeakMark), std::string::npos) << "leaked:\n" << attack.err;
  EXPECT_NE(attack.out.find("\nend\n"), std::string::npos) << attack.out << attack.err;
  EXPECT_NE(attack.out.find("received 4"), std::string::npos) << attack.out << attack.err;
  EXPECT_NE(attack.out.find("end-of-guest-routes"), std::string::npos) << attack.out << attack.err;
  EXPECT_NE(attack.out.find("no-cgroup-move\nno-limit-change\n"), std::string::npos) << attack.out << attack.err;
  ASSERT_OK_AND_ASSIGN(auto control, Cli({"exec", id, "--role", "grader", "--", "sh", "-c", kAttack}));
  EXPECT_NE(control.out.find(kSecret), std::string::npos) << control.out << control.err;
  ASSERT_OK_AND_ASSIGN(auto tamper, Cli({"exec", id, "--", "sh", "-c",
                                         "echo evil >> /opt/harness/run.sh || echo no-write; mv /opt /opt2 || echo no-mv; "
                                         "/opt/harness/run.sh"}));
  EXPECT_EQ(tamper.out, "no-write\nno-mv\nharness ran\n") << tamper.err;
  // The same capabilities as a container's command.
  const char* caps = "grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status; grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status";
  ASSERT_OK_AND_ASSIGN(auto in_vm, Cli({"exec", id, "--", "sh", "-c", caps}));
  ASSERT_OK_AND_ASSIGN(auto in_ct, Cli({"exec", container, "--", "sh", "-c", caps}));
  EXPECT_EQ(in_vm.out, in_ct.out) << in_vm.err << in_ct.err;
  EXPECT_NE(in_vm.out.find("Seccomp:\t2"), std::string::npos) << in_vm.out;
}

TEST_F(MicroVmTest, ManyMicroVmsWithRandomKillsLeaveNothing) {
  StartDaemon();
  std::mt19937 rng(17);
  std::vector<std::string> ids;
  for (int i = 0; i < 16; ++i) {
    std::string id = CreateVm({"--memory", "128M"});
    ASSERT_FALSE(id.empty());
    ids.push_back(id);
  }
  std::shuffle(ids.begin(), ids.end(), rng);
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool killed = rng() % 4 == 0;
    if (killed) {
      pid_t waiter = QemuWaiter(ids[i]);
      if (waiter > 0) ::kill(waiter, SIGKILL);
    }
    if (i == 5 || i == 11) {
      StopDaemon(SIGKILL);
      StartDaemon();
    }
    // A restarted daemon's recovery removes a microVM whose QEMU is gone
    // itself; every live one it adopts.
    Status destroyed = client_->Destroy(ids[i]);
    if (killed) EXPECT_TRUE(destroyed.ok() || destroyed.ToString().find("no such sandbox") != std::string::npos) << destroyed.ToString();
    else EXPECT_OK(destroyed);
  }
}

}  // namespace
}  // namespace strata::launcher
