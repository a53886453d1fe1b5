#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "tests/testing/test_util.h"

namespace strata {
namespace {

TEST(SubprocessTest, CapturesOutputAndExitCode) {
  ASSERT_OK_AND_ASSIGN(auto r, RunCommand({.argv = {"sh", "-c", "echo out; echo err >&2; exit 3"}}));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_FALSE(r.success());
}

TEST(SubprocessTest, PassesStdinEnvAndCwd) {
  ASSERT_OK_AND_ASSIGN(auto r, RunCommand({.argv = {"sh", "-c", "cat; echo $STRATA_X; pwd"},
                                           .env = {"STRATA_X=hello"},
                                           .cwd = "/",
                                           .stdin_data = std::string(200000, 'a')}));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, std::string(200000, 'a') + "hello\n/\n");
}

// A child that exits without reading its stdin: the rest of the input is
// dropped, and this process (SIGPIPE at its default, which kills) lives on.
TEST(SubprocessTest, ChildThatLeavesItsStdinUnreadDoesNotKillUs) {
  auto old = ::signal(SIGPIPE, SIG_DFL);
  auto r = RunCommand({.argv = {"sh", "-c", "exit 4"}, .stdin_data = std::string(1 << 20, 'a')});
  ::signal(SIGPIPE, old);
  ASSERT_OK(r.status());
  EXPECT_EQ(r->exit_code, 4);
  sigset_t pending;
  ASSERT_EQ(sigpending(&pending), 0);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE));
}

TEST(SubprocessTest, PassesDescriptorsInOrderAndNothingElse) {
  // Two pipes whose write ends land on 3 and 4 in the child; the write ends
  // here sit at 50 and up, and a third pipe's stays behind.
  int a[2], b[2], c[2];
  for (int* p : {a, b, c}) {
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    int high = ::fcntl(p[1], F_DUPFD_CLOEXEC, 50);
    ASSERT_GE(high, 50);
    ::close(p[1]);
    p[1] = high;
  }
  ASSERT_OK_AND_ASSIGN(auto r, RunCommand({.argv = {"sh", "-c", "echo first >&3; echo second >&4; ls /proc/self/fd | tr '\\n' ' '"},
                                           .pass_fds = {b[1], a[1]}}));
  char buf[64] = {};
  ASSERT_GT(::read(b[0], buf, sizeof buf - 1), 0);
  EXPECT_STREQ(buf, "first\n");
  std::fill(std::begin(buf), std::end(buf), 0);
  ASSERT_GT(::read(a[0], buf, sizeof buf - 1), 0);
  EXPECT_STREQ(buf, "second\n");
  for (int fd : {a[1], b[1], c[1]}) EXPECT_EQ(r.out.find(" " + std::to_string(fd) + " "), std::string::npos) << r.out;
  for (int fd : {a[0], b[0], c[0], a[1], b[1], c[1]}) ::close(fd);
}

TEST(SubprocessTest, TimeoutKillsTheWholeGroup) {
  auto start = std::chrono::steady_clock::now();
  // The grandchild would keep stdout open for 30 s if it survived.
  ASSERT_OK_AND_ASSIGN(auto r, RunCommand({.argv = {"sh", "-c", "sleep 30 & sleep 30"},
                                           .timeout = std::chrono::milliseconds(200)}));
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(SubprocessTest, SignalIsReported) {
  ASSERT_OK_AND_ASSIGN(auto r, RunCommand({.argv = {"sh", "-c", "kill -TERM $$"}}));
  EXPECT_EQ(r.term_signal, SIGTERM);
  EXPECT_NE(r.Describe().find("signal 15"), std::string::npos);
}

TEST(SubprocessTest, DestructorKillsAndReaps) {
  pid_t pid;
  {
    ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Start({.argv = {"sleep", "30"}}));
    pid = p.pid();
    ASSERT_EQ(::kill(pid, 0), 0);
  }
  EXPECT_NE(::kill(pid, 0), 0);  // reaped, not a zombie
}

TEST(SubprocessTest, MissingProgramIsAClearError) {
  auto r = RunCommand({.argv = {"/nonexistent/strata-tool"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("/nonexistent/strata-tool"), std::string::npos);
}

TEST(SubprocessTest, RunCheckedNamesStepAndStderr) {
  auto r = RunChecked({.argv = {"sh", "-c", "echo broken image >&2; exit 1"}}, "build layer");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ToString(), "build layer: sh exited with status 1: broken image");
}

}  // namespace
}  // namespace strata
