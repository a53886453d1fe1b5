#include "common/control_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/frame.h"
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


// Client and server of different releases refuse each other by name, at
// once — neither waits for an answer that never comes.
TEST(ControlSocketTest, AProtocolMismatchIsAClearErrorWithinASecond) {
  TempDir dir = testing::MakeTempDir();
  const std::string path = dir.Sub("control.sock");
  auto handler = [](const ControlRequest&) -> Result<json> { return json::object(); };
  ASSERT_OK_AND_ASSIGN(auto server, ControlServer::ListenUnix(path, 0600, handler, /*protocol=*/3));
  ASSERT_OK(ControlCall(path, "health", json::object(), 30s, 3).status());
  for (int client : {2, 4}) {
    const auto start = std::chrono::steady_clock::now();
    auto r = ControlCall(path, "health", json::object(), 30s, client);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
    EXPECT_EQ(r.status().code(), EPROTO);
    EXPECT_NE(r.status().ToString().find("the server speaks protocol 3, this client " + std::to_string(client)),
              std::string::npos)
        << r.status().ToString();
  }
  // A caller that sends no version (an older client) is told so.
  ASSERT_OK_AND_ASSIGN(UniqueFd raw, ConnectUnix(path, 5s));
  ASSERT_OK(WriteFrame(raw.get(), 1, R"({"op":"health","args":{}})"));
  uint8_t type = 0;
  std::string payload;
  ASSERT_OK(ReadFrame(raw.get(), &type, &payload));
  EXPECT_EQ(type, 3) << payload;
  EXPECT_NE(payload.find("none (an older release)"), std::string::npos) << payload;

  // A server of an older release takes the greeting for a malformed
  // request and says so at once; the client never sends it the request.
  const std::string old_path = dir.Sub("old.sock");
  ASSERT_OK_AND_ASSIGN(UniqueFd listener, ListenUnix(old_path, 0600));
  std::thread old([&] {
    int conn = ::accept(listener.get(), nullptr, nullptr);
    uint8_t t = 0;
    std::string p;
    if (ReadFrame(conn, &t, &p).ok()) {
      EXPECT_EQ(t, 4) << "the first thing sent is the greeting, not the request";
      WriteFrame(conn, 3, R"({"error":"control socket: malformed request","errno":71})").IgnoreError();
    }
    ::close(conn);
  });
  const auto start = std::chrono::steady_clock::now();
  auto r = ControlCall(old_path, "health", json::object(), 30s, 2);
  old.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_EQ(r.status().code(), EPROTO);
  EXPECT_NE(r.status().ToString().find("speaks no protocol version"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace strata
