#include "common/control_socket.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/unix_socket.h"
#include "tests/testing/test_util.h"

namespace strata {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

TEST(ControlSocketTest, AnswersErrorsAndUnreachableServersKeepTheirErrno) {
  TempDir dir = testing::MakeTempDir();
  const std::string path = dir.Sub("control.sock");
  auto missing = ControlCall(path, "health", json::object(), 5s);
  EXPECT_EQ(missing.status().code(), ENOENT) << missing.status().ToString();  // lazyfs starts its daemon on this

  auto server = ControlServer::ListenUnix(path, 0600, [](const ControlRequest& r) -> Result<json> {
    if (r.op == "echo") return json{{"args", r.args}, {"uid", r.peer_uid}};
    if (r.op == "bad-utf8") return json{{"name", std::string("\xff\xfe")}};
    return Error(ENOENT, "no request \"" + r.op + "\"");
  });
  ASSERT_OK(server.status());
  ASSERT_OK_AND_ASSIGN(json echo, ControlCall(path, "echo", {{"x", 1}}, 5s));
  EXPECT_EQ(echo["args"]["x"], 1);
  EXPECT_EQ(echo["uid"], ::geteuid());
  auto unknown = ControlCall(path, "nope", json::object(), 5s);
  EXPECT_EQ(unknown.status().code(), ENOENT);
  EXPECT_NE(unknown.status().ToString().find("no request \"nope\""), std::string::npos) << unknown.status().ToString();
  ASSERT_OK_AND_ASSIGN(json odd, ControlCall(path, "bad-utf8", json::object(), 5s));  // not a dead server
  EXPECT_TRUE(odd["name"].is_string());

  // A caller that connects and says nothing does not hold up the server's end.
  ASSERT_OK_AND_ASSIGN(UniqueFd silent, ConnectUnix(path));
  const auto start = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  auto gone = ControlCall(path, "echo", json::object(), 5s);
  EXPECT_TRUE(gone.status().code() == ENOENT || gone.status().code() == ECONNREFUSED) << gone.status().ToString();
}

}  // namespace
}  // namespace strata
