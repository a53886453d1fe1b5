// The node API's wire, apart from a node: what a request may ask, and how
// an exec's answer is encoded.
#include "launcher/api/wire.h"

#include <gtest/gtest.h>

#include <csignal>
#include <string>

#include "launcher/backends/node_backends.h"
#include "common/strings.h"
#include "launcher/protocol/protocol.h"
#include "tests/testing/test_util.h"

namespace strata::launcher::api {
namespace {

using nlohmann::json;

std::string Why(const Status& s) { return s.ok() ? "" : s.message(); }

TEST(WireTest, AnExecNamesTheFieldItRefuses) {
  auto ok = ParseExec({{"argv", {"echo", "hi"}}, {"timeout", "2s"}, {"output_cap", 1024}, {"stdin", "aGk="}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->argv.size(), 2u);
  EXPECT_EQ(ok->timeout, std::chrono::milliseconds(2000));
  EXPECT_EQ(ok->stdout_cap, 1024u);
  EXPECT_EQ(*ok->stdin_data, "hi");
  EXPECT_FALSE(ok->grader);
  EXPECT_NE(Why(ParseExec({{"argv", json::array()}}).status()).find("argv is empty"), std::string::npos);
  EXPECT_NE(Why(ParseExec({{"argv", {std::string("a\0b", 3)}}}).status()).find("NUL"), std::string::npos);
  EXPECT_NE(Why(ParseExec({{"argv", {"x"}}, {"timeout", -1}}).status()).find("timeout"), std::string::npos);
  EXPECT_NE(Why(ParseExec({{"argv", {"x"}}, {"output_cap", kMaxOutputCap + 1}}).status()).find("output_cap"), std::string::npos);
  EXPECT_NE(Why(ParseExec({{"argv", {"x"}}, {"role", "root"}}).status()).find("role"), std::string::npos);
  EXPECT_NE(Why(ParseExec({{"argv", {"x"}}, {"stdin", "%%%"}}).status()).find("base64"), std::string::npos);
  EXPECT_NE(Why(ParseExec({{"argv", "echo"}}).status()).find("exec:"), std::string::npos);  // the wrong type
  EXPECT_TRUE(ParseExec({{"argv", {"x"}}, {"role", "grader"}})->grader);
}

TEST(WireTest, ASpecNamesTheBackEndsTheNodeHas) {
  NodeConfig node;
  node.backends = NodeBackends();
  auto ok = ParseSpec({{"layers", {"base:1"}}, {"memory", "512M"}, {"ttl", 60}}, node);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->limits.memory, uint64_t{512} << 20);
  EXPECT_EQ(ok->ttl_seconds, 60);
  EXPECT_EQ(ok->backend, kDefaultBackend);
  const std::string bad = Why(ParseSpec({{"layers", {"base:1"}}, {"backend", "zone"}}, node).status());
  EXPECT_NE(bad.find("backend must be"), std::string::npos) << bad;
  EXPECT_NE(bad.find("container"), std::string::npos) << bad;
  EXPECT_NE(Why(ParseSpec({{"layers", json::array()}}, node).status()).find("at least one layer"), std::string::npos);
  EXPECT_NE(Why(ParseSpec({{"layers", {"b:1"}}, {"ttl", -5}}, node).status()).find("ttl"), std::string::npos);
}

// A runtime by name among those the node offers; the default said or not
// is one spec (warm pools match either); none for a microVM, no path.
TEST(WireTest, ASpecNamesARuntimeTheNodeOffersOrIsRefused) {
  NodeConfig node;
  node.backends = NodeBackends();
  node.runtime = "/usr/bin/crun";
  node.runtimes = {"runc"};
  ASSERT_OK_AND_ASSIGN(SandboxSpec runc, ParseSpec({{"layers", {"b:1"}}, {"runtime", "runc"}}, node));
  EXPECT_EQ(runc.runtime, "runc");
  for (const char* dflt : {"", "crun", "/usr/bin/crun"}) {
    ASSERT_OK_AND_ASSIGN(SandboxSpec spec, ParseSpec({{"layers", {"b:1"}}, {"runtime", dflt}}, node));
    EXPECT_EQ(spec.runtime, "") << dflt;
  }
  ASSERT_OK_AND_ASSIGN(SandboxSpec fncall, ParseSpec({{"layers", {"b:1"}}, {"backend", "fncall"}, {"runtime", "runc"}}, node));
  EXPECT_EQ(fncall.runtime, "runc");
  for (const char* bad : {"kata", "/usr/bin/runc", "/tmp/runc"}) {
    const std::string why = Why(ParseSpec({{"layers", {"b:1"}}, {"runtime", bad}}, node).status());
    EXPECT_NE(why.find(StrCat("create: runtime ", bad, ": this node offers crun or runc")), std::string::npos) << why;
  }
  const std::string vm = Why(ParseSpec({{"layers", {"b:1"}}, {"backend", "microvm"}, {"runtime", "runc"}}, node).status());
  EXPECT_NE(vm.find("a microvm sandbox runs no OCI runtime"), std::string::npos) << vm;
}

TEST(WireTest, SignalsByNumberOrName) {
  EXPECT_EQ(*ParseSignal(9), SIGKILL);
  EXPECT_EQ(*ParseSignal("TERM"), SIGTERM);
  EXPECT_EQ(*ParseSignal("SIGINT"), SIGINT);
  EXPECT_FALSE(ParseSignal(0).ok());
  EXPECT_FALSE(ParseSignal(65).ok());
  EXPECT_FALSE(ParseSignal("BOGUS").ok());
}

TEST(WireTest, SandboxPathsAreAbsoluteWithoutDotDot) {
  EXPECT_TRUE(CheckSandboxPath("/work/a.txt").ok());
  EXPECT_FALSE(CheckSandboxPath("work/a.txt").ok());
  EXPECT_FALSE(CheckSandboxPath("/work/../etc/shadow").ok());
  EXPECT_FALSE(CheckSandboxPath(std::string("/a\0b", 4)).ok());
  EXPECT_FALSE(CheckSandboxPath("/" + std::string(5000, 'a')).ok());
}

TEST(WireTest, AnExecsEndingInEachEncoding) {
  const json exit = {{"exit_code", 3}, {"stdout", "kept"}, {"stderr", ""}};
  EXPECT_EQ(json::parse(EncodeEnd(ExecFormat::kNdjson, exit)), json({{"exit", {{"exit_code", 3}}}}));
  const json error = ErrorJson(Error(ENOENT, "gone"));
  EXPECT_EQ(json::parse(EncodeEnd(ExecFormat::kNdjson, error))["errno"], ENOENT);
  const std::string frame = EncodeEnd(ExecFormat::kFrames, exit);
  ASSERT_GE(frame.size(), 5u);
  EXPECT_EQ(static_cast<uint8_t>(frame[0]), static_cast<uint8_t>(Frame::kExit));
  EXPECT_EQ(json::parse(frame.substr(5)), json({{"exit_code", 3}}));
  EXPECT_EQ(json::parse(EncodePiece(ExecFormat::kNdjson, 2, "hi")), json({{"stderr", "aGk="}}));
  EXPECT_EQ(std::string(ContentType(ExecFormat::kNdjson)), "application/x-ndjson");
}

TEST(WireTest, AMissingProgramIsABadRequestNotAMissingSandbox) {
  EXPECT_EQ(CommandFail(Error(ENOENT, "no such program")).status, 400);
  EXPECT_EQ(CommandFail(Error(EIO, "agent gone")).status, 500);
}

}  // namespace
}  // namespace strata::launcher::api
