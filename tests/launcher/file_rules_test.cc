// System tests of file rules: hidden grader files and a read-only harness,
// attacked as root from inside a sandbox by every route we know of.
#include <sys/stat.h>

#include "common/fs.h"
#include "launcher/protocol/file_rules.h"
#include "tests/launcher/file_attack.h"
#include "tests/launcher/fixture.h"

namespace strata::launcher {
namespace {

using nlohmann::json;

class FileRulesTest : public DaemonFixture {
 protected:
  std::string Prober() const { return testing::TestBinaryDir() + "/strata-test-prober"; }

  SubprocessResult Exec(const std::string& id, std::vector<std::string> argv, std::vector<std::string> flags = {}) {
    std::vector<std::string> args = {"exec", id};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("--");
    args.insert(args.end(), argv.begin(), argv.end());
    auto r = Cli(args);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }
  SubprocessResult Sh(const std::string& id, const std::string& script, std::vector<std::string> flags = {}) {
    return Exec(id, {"sh", "-c", script}, std::move(flags));
  }
  void Put(const std::string& id, const std::string& content, const std::string& path, mode_t mode = 0644) {
    const std::string local = dir_.Sub("put-" + std::to_string(puts_++));
    ASSERT_OK(WriteFileAtomic(local, content));
    ASSERT_EQ(::chmod(local.c_str(), mode), 0);
    ASSERT_OK_AND_ASSIGN(auto r, Cli({"cp", local, id + ":" + path}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  int puts_ = 0;
};

TEST_F(FileRulesTest, GraderFilesStayHiddenFromEveryRoute) {
  StartDaemon();
  const std::string id = Create({"--deny", "/grader", "--read-only", "/opt/harness", "--read-only", "/etc/passwd"});
  ASSERT_FALSE(id.empty());
  ASSERT_OK_AND_ASSIGN(std::string prober, ReadFileToString(Prober()));
  Put(id, prober, "/usr/bin/prober", 0755);
  Put(id, "#!/bin/sh\necho harness ran\n", "/opt/harness/run.sh", 0755);

  // A process started before the grader's files arrive, holding
  // descriptors of /grader and of / to hand out later.
  auto hold = Sh(id, "prober hold /tmp/fds /grader / > /tmp/hold.log 2>&1 & "
                     "for i in $(seq 50); do grep -q holding /tmp/hold.log 2>/dev/null && exit 0; sleep 0.1; done; exit 1");
  ASSERT_EQ(hold.exit_code, 0) << hold.err;

  Put(id, std::string(kSecret) + "\n", "/grader/secret");
  // The grader reads them, and keeps a process looking at them (its root,
  // its working directory and an open descriptor are routes to try).
  auto grader = Exec(id, {"cat", "/grader/secret"}, {"--role", "grader"});
  EXPECT_EQ(grader.out, std::string(kSecret) + "\n") << grader.err;
  auto lingering = Sh(id, "(cd /grader && exec 3</grader/secret && exec sleep 120) >/dev/null 2>&1 &", {"--role", "grader"});
  ASSERT_EQ(lingering.exit_code, 0) << lingering.err;

  auto attack = Sh(id, kAttack);
  EXPECT_EQ(attack.out.find(kLeakMark), std::string::npos) << "leaked:\n" << attack.out << attack.err;
  EXPECT_EQ(attack.err.find(kLeakMark), std::string::npos) << "leaked:\n" << attack.err;
  // Every route was tried: the script got to its end, the passed
  // descriptors arrived, openat2 ran with each of its flags.
  EXPECT_NE(attack.out.find("\nend\n"), std::string::npos) << attack.out << attack.err;
  EXPECT_NE(attack.out.find("received 4"), std::string::npos) << attack.out << attack.err;
  EXPECT_NE(attack.out.find("/ openat2 no_xdev: err"), std::string::npos) << attack.out << attack.err;
  EXPECT_NE(attack.out.find("fd3 list: ok"), std::string::npos) << "the listing of / by descriptor: " << attack.out;
  // The same under a shepherd (--kill-leftovers: a process between the
  // agent and the command that never execs).
  auto shepherded = Sh(id, kAttack, {"--kill-leftovers"});
  EXPECT_EQ(shepherded.out.find(kLeakMark), std::string::npos) << "leaked:\n" << shepherded.out << shepherded.err;
  EXPECT_NE(shepherded.out.find("\nend\n"), std::string::npos) << shepherded.out << shepherded.err;
  // The same script as the grader finds the secret: it is a real probe.
  auto control = Sh(id, kAttack, {"--role", "grader"});
  EXPECT_NE(control.out.find(kSecret), std::string::npos) << control.out << control.err;

  // Denied means no writes either; the grader's directory is as it put it.
  auto plant = Sh(id, "echo planted > /grader/conftest.py || echo refused");
  EXPECT_NE(plant.out.find("refused"), std::string::npos) << plant.out << plant.err;
  auto listing = Exec(id, {"ls", "-A", "/grader"}, {"--role", "grader"});
  EXPECT_EQ(listing.out, "secret\n") << listing.err;

  // The harness cannot be changed, renamed, deleted, or swapped out by
  // renaming a directory above it, though the agent is root.
  auto tamper = Sh(id,
                   "echo evil >> /opt/harness/run.sh || echo no-write; rm -f /opt/harness/run.sh || echo no-rm; "
                   "mv /opt/harness /opt/h2 || echo no-mv; mv /opt /opt2 || echo no-mv-parent; "
                   "chmod 777 /opt/harness/run.sh || echo no-chmod; touch /opt/harness/new || echo no-create; "
                   "chown 1:1 /opt/harness || echo no-chown; /opt/harness/run.sh");
  EXPECT_EQ(tamper.out, "no-write\nno-rm\nno-mv\nno-mv-parent\nno-chmod\nno-create\nno-chown\nharness ran\n") << tamper.err;
  auto intact = Exec(id, {"cat", "/opt/harness/run.sh"}, {"--role", "grader"});
  EXPECT_EQ(intact.out, "#!/bin/sh\necho harness ran\n") << intact.err;

  // The caller replaces a read-only file while a command runs: it is
  // written in place, so the running command's rule stays.
  auto waiting = Sh(id, "(while [ ! -e /tmp/go ]; do sleep 0.05; done; (echo evil >> /etc/passwd && echo wrote || echo refused) > /tmp/result "
                        "2>/dev/null) >/dev/null 2>&1 & echo waiting");
  EXPECT_EQ(waiting.out, "waiting\n") << waiting.err;
  Put(id, "root:x:0:0:new:/root:/bin/sh\n", "/etc/passwd");
  auto go = Sh(id, "touch /tmp/go; for i in $(seq 100); do [ -s /tmp/result ] && break; sleep 0.05; done; cat /tmp/result /etc/passwd");
  EXPECT_EQ(go.out, "refused\nroot:x:0:0:new:/root:/bin/sh\n") << go.err;

  // Everything else stays the agent's: /tmp, /root, new top-level
  // directories (made now, used at once and by later commands).
  auto usable = Sh(id, "mkdir /work && echo a > /work/f && cat /work/f && echo b > /tmp/b && echo c > /root/c && "
                       "mkdir -p /opt/other && echo d > /opt/other/d && cat /tmp/b /root/c /opt/other/d && ls / | grep -c grader");
  EXPECT_EQ(usable.out, "a\nb\nc\nd\n1\n") << usable.err;
  auto later = Sh(id, "echo more >> /work/f && cat /work/f");
  EXPECT_EQ(later.out, "a\nmore\n") << later.err;

  // A snapshot leaves the hidden files out (unless an operator asks).
  ASSERT_OK_AND_ASSIGN(json snap, client_->Snapshot(id, "after:1"));
  const std::string next = Create({"--layer", "after:1"});
  auto seen = Sh(next, "test -e /grader && echo grader-there; cat /work/f");
  EXPECT_EQ(seen.out, "a\nmore\n") << seen.err;
  ASSERT_OK_AND_ASSIGN(json all, client_->Snapshot(id, "after:2", true));
  const std::string with = Create({"--layer", "after:2"});
  auto kept = Sh(with, "cat /grader/secret");
  EXPECT_EQ(kept.out, std::string(kSecret) + "\n") << kept.err;

  // Describe shows the rules.
  ASSERT_OK_AND_ASSIGN(json info, client_->Info(id));
  EXPECT_EQ(info["files"], json::parse(R"({"deny": ["/grader"], "read_only": ["/etc/passwd", "/opt/harness"]})")) << info.dump();
  for (const auto& s : {id, next, with}) {
    ASSERT_OK_AND_ASSIGN(auto d, Cli({"destroy", s}));
    EXPECT_EQ(d.exit_code, 0) << d.err;
  }
  ExpectHostClean();
}

TEST_F(FileRulesTest, RulesPerExecAndForFunctionCalls) {
  StartDaemon();
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  // An exec's own rules hold for it alone.
  auto denied = Sh(id, "cat /etc/passwd > /dev/null && echo read || echo refused", {"--deny", "/etc"});
  EXPECT_EQ(denied.out, "refused\n") << denied.err;
  auto ro = Sh(id, "touch /root/x || echo refused", {"--read-only", "/root"});
  EXPECT_EQ(ro.out, "refused\n") << ro.err;
  auto free = Sh(id, "cat /etc/passwd > /dev/null && touch /root/x && echo fine");
  EXPECT_EQ(free.out, "fine\n") << free.err;
  // A denied file (not a directory) cannot be opened at all.
  auto file = Sh(id, "cat /etc/passwd || echo refused; echo x > /etc/passwd || echo refused", {"--deny", "/etc/passwd"});
  EXPECT_EQ(file.out, "refused\nrefused\n") << file.err;
  auto untouched = Exec(id, {"grep", "-c", "root", "/etc/passwd"});
  EXPECT_EQ(untouched.out, "1\n") << untouched.err;

  // Bad rules are refused by name before anything runs.
  auto relative = Sh(id, "true", {"--deny", "grader"});
  EXPECT_NE(relative.exit_code, 0);
  EXPECT_NE(relative.err.find("grader is not an absolute path"), std::string::npos) << relative.err;
  auto proc = Sh(id, "true", {"--deny", "/proc/1"});
  EXPECT_NE(proc.exit_code, 0);
  EXPECT_NE(proc.err.find("/proc/1 is under /proc"), std::string::npos) << proc.err;
  auto missing = Sh(id, "true", {"--read-only", "/no/such"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("files.read_only: /no/such"), std::string::npos) << missing.err;
  // A link on the way is refused: a command could point it elsewhere.
  auto link = Sh(id, "ln -s /etc /etc-link && echo linked");
  EXPECT_EQ(link.out, "linked\n") << link.err;
  auto through = Sh(id, "true", {"--deny", "/etc-link/passwd"});
  EXPECT_NE(through.exit_code, 0);
  EXPECT_NE(through.err.find("/etc-link/passwd leads through a symbolic link to /etc/passwd"), std::string::npos) << through.err;
  auto role = Sh(id, "true", {"--role", "judge"});
  EXPECT_NE(role.exit_code, 0);
  EXPECT_NE(role.err.find("judge"), std::string::npos) << role.err;
  ASSERT_OK_AND_ASSIGN(auto bad_create, Cli({"create", "--layer", "busybox:1", "--deny", "/"}));
  EXPECT_NE(bad_create.exit_code, 0);
  EXPECT_NE(bad_create.err.find("a rule for / itself"), std::string::npos) << bad_create.err;

  // Function calls: each call's own namespaces get the same mounts.
  const std::string fn = Create({"--backend", "fncall", "--deny", "/etc"});
  ASSERT_FALSE(fn.empty());
  auto call = Sh(fn, "ls -A /etc; cat /etc/passwd || echo refused");
  EXPECT_EQ(call.out, "refused\n") << call.err;
  auto grader = Exec(fn, {"grep", "-c", "root", "/etc/passwd"}, {"--role", "grader"});
  EXPECT_EQ(grader.out, "1\n") << grader.err;
  for (const auto& s : {id, fn}) {
    ASSERT_OK_AND_ASSIGN(auto d, Cli({"destroy", s}));
    EXPECT_EQ(d.exit_code, 0) << d.err;
  }
}

// Every command runs under the default seccomp profile: with or without
// file rules, under a shepherd, as the grader, and each function call. In
// a container the agent's own program allows what giving a command its
// namespaces takes (mount, unshare), and each command loads a small
// program on top that refuses those again (kRefusedSyscalls says how the
// probe tells a program's refusal from the kernel's; microvm_test.cc
// checks a guest's commands).
// Through the 32-bit entry, where the host's kernel has one (some hosts,
// a PVM guest's kernel among them, answer int 0x80 with a fault: nothing
// to refuse there, and the probe says so).
constexpr const char* kRefusedSyscalls32[] = {"mount32: err EPERM", "unshare32: err EPERM"};
constexpr const char* kNo32BitEntry[] = {"mount32: no 32-bit entry", "unshare32: no 32-bit entry"};

TEST_F(FileRulesTest, CommandsRunUnderTheDefaultSeccompProfile) {
  StartDaemon();
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  ASSERT_OK_AND_ASSIGN(std::string prober, ReadFileToString(Prober()));
  Put(id, prober, "/usr/bin/prober", 0755);
  // Whether this host has the 32-bit entry: the probe outside any sandbox.
  ASSERT_OK_AND_ASSIGN(auto host, RunCommand({.argv = {Prober(), "syscalls"}}));
  const bool entry32 = host.out.find("mount32: no 32-bit entry\n") == std::string::npos;
  if (!entry32) std::fprintf(stderr, "note: this host's kernel has no 32-bit entry; checking that sandboxes have none either\n");
  const auto& refused32 = entry32 ? kRefusedSyscalls32 : kNo32BitEntry;
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {}, {"--kill-leftovers"}, {"--deny", "/etc/shadow-dir"}, {"--role", "grader"}}) {
    auto r = Exec(id, {"prober", "syscalls"}, flags);
    for (const char* line : refused32) {
      EXPECT_NE(r.out.find(std::string(line) + "\n"), std::string::npos) << line << " with " << ::testing::PrintToString(flags) << ":\n" << r.out << r.err;
    }
    for (const char* line : kRefusedSyscalls) {
      EXPECT_NE(r.out.find(std::string(line) + "\n"), std::string::npos) << line << " with " << ::testing::PrintToString(flags) << ":\n" << r.out << r.err;
    }
  }
  // A call: the prober comes on stdin (the root is read-only; /tmp is the
  // call's own).
  const std::string fn = Create({"--backend", "fncall"});
  ASSERT_FALSE(fn.empty());
  ASSERT_OK_AND_ASSIGN(auto call, Cli({"exec", fn, "--stdin", "--", "sh", "-c", "cat > /tmp/prober && chmod +x /tmp/prober && /tmp/prober syscalls"}, prober));
  for (const char* line : refused32) {
    EXPECT_NE(call.out.find(std::string(line) + "\n"), std::string::npos) << line << " in a call:\n" << call.out << call.err;
  }
  for (const char* line : kRefusedSyscalls) {
    EXPECT_NE(call.out.find(std::string(line) + "\n"), std::string::npos) << line << " in a call:\n" << call.out << call.err;
  }
  for (const auto& s : {id, fn}) {
    ASSERT_OK_AND_ASSIGN(auto d, Cli({"destroy", s}));
    EXPECT_EQ(d.exit_code, 0) << d.err;
  }
}

TEST(FileRulesParseTest, NormalizesAndMerges) {
  ASSERT_OK_AND_ASSIGN(FileRules r, ParseFileRules(json::parse(R"({"deny": ["/a//b/", "/a/b/c", "/z"], "read_only": ["/a", "/z/y", "/q"]})"), "t"));
  EXPECT_EQ(r.deny, (std::vector<std::string>{"/a/b", "/z"}));
  EXPECT_EQ(r.read_only, (std::vector<std::string>{"/a", "/q"}));
  FileRules merged = MergeFileRules(r, *MakeFileRules({"/q/x"}, {"/a/b/d", "/m"}, "t"));
  EXPECT_EQ(merged.deny, (std::vector<std::string>{"/a/b", "/q/x", "/z"}));
  EXPECT_EQ(merged.read_only, (std::vector<std::string>{"/a", "/m", "/q"}));
  EXPECT_EQ(ParseFileRules(json::parse(R"({"deny": ["/a/../etc"]})"), "t").status().code(), EINVAL);
  EXPECT_EQ(ParseFileRules(json::parse(R"({"hide": ["/a"]})"), "t").status().code(), EINVAL);
  EXPECT_EQ(ParseFileRules(json::parse(R"({"deny": "/a"})"), "t").status().code(), EINVAL);
  EXPECT_EQ(ParseFileRules(json::parse(R"({"deny": ["/.strata/run"]})"), "t").status().code(), EINVAL);
  EXPECT_TRUE(ParseFileRules(json(), "t")->empty());
}

}  // namespace
}  // namespace strata::launcher
