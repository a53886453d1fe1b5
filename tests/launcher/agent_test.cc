// The agent outside a container: the protocol, caps, timeouts, files.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "common/fs.h"
#include "common/subprocess.h"
#include "common/unix_socket.h"
#include "launcher/sandbox/agent_client.h"
#include "tests/testing/test_util.h"

namespace strata::launcher {
namespace {

using namespace std::chrono_literals;

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // As the launcher starts it: the socket bound here, handed over as descriptor 3.
    ASSERT_OK_AND_ASSIGN(UniqueFd listener, ListenUnix(dir_.Sub("agent.sock"), 0600));
    auto p = Subprocess::Start({.argv = {testing::TestBinaryDir() + "/../../launcher/strata-agent"},
                                .stdout_mode = StdStream::kNull, .stderr_mode = StdStream::kInherit,
                                .pass_fds = {listener.get()}});
    ASSERT_TRUE(p.ok());
    agent_.emplace(std::move(*p));
    client_ = std::make_unique<AgentClient>(dir_.Sub("agent.sock"));
    ASSERT_OK(client_->WaitReady(10s));
  }

  Result<ExecResult> Exec(ExecRequest r, std::string* out, std::string* err) {
    return client_->Exec(r, [&](int s, std::string_view b) { (s == 1 ? out : err)->append(b); });
  }

  TempDir dir_ = testing::MakeTempDir();
  std::optional<Subprocess> agent_;
  std::unique_ptr<AgentClient> client_;
};

TEST_F(AgentTest, StreamsOutputAndReportsExit) {
  std::string out, err;
  ASSERT_OK_AND_ASSIGN(auto r, Exec({.argv = {"sh", "-c", "echo a; echo b >&2; exit 7"}}, &out, &err));
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(out, "a\n");
  EXPECT_EQ(err, "b\n");
  out.clear();
  // More stdin than a pipe holds, echoed while it is still being written.
  ASSERT_OK_AND_ASSIGN(auto in, Exec({.argv = {"cat"}, .stdout_cap = 8 << 20, .stdin_data = std::string(3 << 20, 'z')}, &out, &err));
  EXPECT_EQ(in.exit_code, 0);
  EXPECT_EQ(out.size(), 3u << 20);
  EXPECT_TRUE(out == std::string(3 << 20, 'z'));
}

TEST_F(AgentTest, CapsOutputButKeepsReading) {
  std::string out, err;
  ASSERT_OK_AND_ASSIGN(auto r, Exec({.argv = {"head", "-c", "5000000", "/dev/zero"}, .stdout_cap = 1000}, &out, &err));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(out.size(), 1000u);
  EXPECT_TRUE(r.stdout_truncated);
  EXPECT_EQ(r.stdout_bytes, 5000000u);
}

TEST_F(AgentTest, TimeoutKillsTheGroupAndReturnsPromptly) {
  std::string out, err;
  auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(auto r, Exec({.argv = {"sh", "-c", "sleep 60 & sleep 60 & wait"}, .timeout = 300ms}, &out, &err));
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST_F(AgentTest, BackgroundProcessesDoNotHoldTheAnswer) {
  std::string out, err;
  auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(auto r, Exec({.argv = {"sh", "-c", "sleep 30 & echo started"}}, &out, &err));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(out, "started\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST_F(AgentTest, PutsAndGetsFiles) {
  std::string data = testing::RandomBytes(3 << 20, 1);
  ASSERT_OK(client_->Put(dir_.Sub("sub/dir/file"), data, 0640, std::nullopt));
  ASSERT_OK_AND_ASSIGN(std::string got, client_->Get(dir_.Sub("sub/dir/file")));
  EXPECT_EQ(got, data);
  struct stat st;
  ASSERT_EQ(::stat(dir_.Sub("sub/dir/file").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  auto missing = client_->Get(dir_.Sub("nope"));
  EXPECT_EQ(missing.status().code(), ENOENT);
  std::string out, err;
  auto bad = Exec({.argv = {"/no/such/binary"}}, &out, &err);
  EXPECT_EQ(bad.status().code(), ENOENT);
  // The step that failed is named: a missing working directory is not a missing program.
  auto no_dir = Exec({.argv = {"true"}, .cwd = "/no/such/dir"}, &out, &err);
  EXPECT_EQ(no_dir.status().code(), ENOENT);
  EXPECT_NE(no_dir.status().ToString().find("working directory /no/such/dir"), std::string::npos) << no_dir.status().ToString();
}

TEST_F(AgentTest, WaitingForAGoneAgentFailsAtOnce) {
  ASSERT_OK(client_->WaitReady(10s));
  agent_->Kill(SIGKILL);
  while (agent_->Running()) std::this_thread::sleep_for(1ms);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(client_->WaitReady(10s).ok());
  EXPECT_FALSE(client_->Ping().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(AgentStartTest, RefusesADescriptorThatIsNotAListeningSocket) {
  ASSERT_OK_AND_ASSIGN(auto r, RunCommand({.argv = {testing::TestBinaryDir() + "/../../launcher/strata-agent"}}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a listening socket"), std::string::npos) << r.err;
  ASSERT_OK_AND_ASSIGN(auto usage, RunCommand({.argv = {testing::TestBinaryDir() + "/../../launcher/strata-agent", "--socket", "/x"}}));
  EXPECT_EQ(usage.exit_code, 2);
}

}  // namespace
}  // namespace strata::launcher
