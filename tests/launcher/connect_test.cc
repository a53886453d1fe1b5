// The Connect protocol as the E2B plane frames it, apart from a node:
// calls parsed from requests in both encodings, envelopes, and the
// errors bad ones get.
#include "launcher/e2b/connect.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "launcher/e2b/process.pb.h"

namespace strata::launcher::e2b {
namespace {

HttpServer::Request Post(const std::string& path, const std::string& type, std::string body) {
  HttpServer::Request r;
  r.method = "POST";
  r.path = path;
  r.headers["content-type"] = type;
  r.body = std::move(body);
  return r;
}

std::string Why(const Status& s) { return s.ok() ? "" : s.message(); }

TEST(ConnectTest, AUnaryJsonCallDecodesIgnoringUnknownFields) {
  auto call = ParseCall(Post("/process.Process/SendSignal", "application/json; charset=utf-8",
                             R"({"process": {"pid": 42}, "signal": "SIGNAL_SIGKILL", "later": 1})"));
  ASSERT_TRUE(call.ok()) << call.status().ToString();
  EXPECT_EQ(call->service, "process.Process");
  EXPECT_EQ(call->method, "SendSignal");
  EXPECT_FALSE(call->streaming);
  process::SendSignalRequest in;
  ASSERT_TRUE(Decode(*call, 0, &in).ok());
  EXPECT_EQ(in.process().pid(), 42u);
  EXPECT_EQ(in.signal(), process::SIGNAL_SIGKILL);
  // An empty body is the empty message.
  auto empty = ParseCall(Post("/process.Process/List", "application/json", ""));
  ASSERT_TRUE(empty.ok());
  process::ListRequest list;
  EXPECT_TRUE(Decode(*empty, 0, &list).ok());
}

TEST(ConnectTest, AStreamingCallHoldsEnvelopesAndAnswersInThem) {
  process::StartRequest start;
  start.mutable_process()->set_cmd("/bin/bash");
  start.mutable_process()->add_args("-c");
  std::string binary;
  start.SerializeToString(&binary);
  auto call = ParseCall(Post("/process.Process/Start", "application/connect+proto", Envelope(0, binary)));
  ASSERT_TRUE(call.ok()) << call.status().ToString();
  EXPECT_TRUE(call->streaming);
  EXPECT_TRUE(call->binary);
  process::StartRequest in;
  ASSERT_TRUE(Decode(*call, 0, &in).ok());
  EXPECT_EQ(in.process().cmd(), "/bin/bash");
  // Answers: a data envelope, then the end (JSON whatever the encoding).
  process::StartResponse event;
  event.mutable_event()->mutable_data()->set_stdout("hi\n");
  const std::string piece = StreamMessage(*call, event);
  ASSERT_GE(piece.size(), 5u);
  EXPECT_EQ(piece[0], 0);
  process::StartResponse back;
  ASSERT_TRUE(back.ParseFromString(piece.substr(5)));
  EXPECT_EQ(back.event().data().stdout(), "hi\n");
  const std::string end = StreamEnd(Error(ENOENT, "process 7 not found"));
  EXPECT_EQ(end[0], 2);
  auto j = nlohmann::json::parse(end.substr(5));
  EXPECT_EQ(j["error"]["code"], "not_found");
  EXPECT_EQ(j["error"]["message"], "process 7 not found");
  EXPECT_EQ(StreamEnd().substr(5), "{}");
  // In JSON, bytes are base64 and names camelCase.
  auto json_call = ParseCall(Post("/process.Process/Start", "application/connect+json", Envelope(0, "{}")));
  ASSERT_TRUE(json_call.ok());
  process::StartResponse ended;
  ended.mutable_event()->mutable_end()->set_exit_code(3);
  auto text = nlohmann::json::parse(StreamMessage(*json_call, ended).substr(5));
  EXPECT_EQ(text["event"]["end"]["exitCode"], 3);
  EXPECT_EQ(nlohmann::json::parse(StreamMessage(*json_call, event).substr(5))["event"]["data"]["stdout"], "aGkK");
}

TEST(ConnectTest, BadCallsAreRefusedSayingWhy) {
  EXPECT_NE(Why(ParseCall(Post("/process.Process/Start", "text/plain", "")).status()).find("content type"), std::string::npos);
  EXPECT_EQ(ParseCall(Post("/nothing", "application/json", "")).status().code(), ENOENT);
  EXPECT_EQ(ParseCall(Post("/a/b/c", "application/json", "")).status().code(), ENOENT);
  const std::string type = "application/connect+json";
  EXPECT_NE(Why(ParseCall(Post("/p.P/S", type, std::string("\0\0\0", 3))).status()).find("cut short"), std::string::npos);
  EXPECT_NE(Why(ParseCall(Post("/p.P/S", type, std::string("\0\0\0\0\x09{}", 7))).status()).find("holds only"), std::string::npos);
  EXPECT_EQ(ParseCall(Post("/p.P/S", type, std::string("\0\x7f\0\0\0", 5))).status().code(), EFBIG);
  EXPECT_NE(Why(ParseCall(Post("/p.P/S", type, Envelope(1, "x"))).status()).find("compressed"), std::string::npos);
  EXPECT_NE(Why(ParseCall(Post("/p.P/S", type, Envelope(2, "{}"))).status()).find("flags"), std::string::npos);
  auto get = Post("/p.P/S", type, "");
  get.method = "GET";
  EXPECT_EQ(ParseCall(get).status().code(), EOPNOTSUPP);
  auto gz = Post("/p.P/S", "application/json", "{}");
  gz.headers["content-encoding"] = "gzip";
  EXPECT_EQ(ParseCall(gz).status().code(), EOPNOTSUPP);
  auto call = ParseCall(Post("/process.Process/SendSignal", "application/json", R"({"process": "seven"})"));
  ASSERT_TRUE(call.ok());
  process::SendSignalRequest in;
  EXPECT_NE(Why(Decode(*call, 0, &in)).find("SendSignalRequest"), std::string::npos);
  auto binary = ParseCall(Post("/process.Process/SendSignal", "application/proto", "\xff\xff\xff"));
  ASSERT_TRUE(binary.ok());
  EXPECT_FALSE(Decode(*binary, 0, &in).ok());
}

TEST(ConnectTest, ErrorsCarryConnectsCodeAndItsHttpStatus) {
  auto r = ErrorReply(Error(ENOENT, "no such file"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.content_type, "application/json");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["code"], "not_found");
  EXPECT_EQ(j["message"], "no such file");
  EXPECT_EQ(ErrorReply(Error(EEXIST, "x")).status, 409);
  EXPECT_EQ(ErrorReply(Error(EACCES, "x")).status, 403);
  EXPECT_EQ(ErrorReply(Code::kUnauthenticated, "x").status, 401);
  EXPECT_EQ(ErrorReply(Error(ENOSYS, "x")).status, 501);
  EXPECT_EQ(ErrorReply(Error(EIO, "x")).status, 500);
}

}  // namespace
}  // namespace strata::launcher::e2b
