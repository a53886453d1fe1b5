// The Connect protocol (connectrpc.com/docs/protocol) over our HTTP server,
// as envd's clients speak it: unary and server-streaming calls, in JSON
// (what the JavaScript SDK sends) or binary protobuf, with Connect's error
// format. Messages are libprotobuf's (the .proto files beside this one);
// this file only frames them. Client streaming is served from a body that
// is already whole (HTTP/1.1 cannot interleave it with the answer).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <string_view>
#include <vector>

#include <google/protobuf/message.h>

#include "common/status.h"
#include "common/unique_fd.h"
#include "launcher/front/http_server.h"

namespace strata::launcher::e2b {

// Connect's error codes ("not_found", ...), each with its HTTP status.
enum class Code {
  kCanceled,
  kUnknown,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kAborted,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
  kUnauthenticated,
};
const char* CodeName(Code code);
int HttpStatusOf(Code code);
// The code of a strata error (ENOENT: not_found, EACCES: permission_denied, ...).
Code CodeOf(const Status& status);

// The most one message may hold (a larger one is resource_exhausted).
inline constexpr size_t kMaxMessageBytes = size_t{4} << 20;

// One call as it arrived.
struct Call {
  std::string service;  // "process.Process"
  std::string method;   // "Start"
  bool streaming = false;  // application/connect+json|proto
  bool binary = false;     // protobuf rather than JSON
  // The request's messages: one for unary and server-streaming calls,
  // any number for client streaming.
  std::vector<std::string> messages;
};

// Reads a call from `request` (POST /<service>/<method>): its encoding
// from the content type, its messages from the body (one, or a stream of
// envelopes). An error names what is wrong (an unknown content type, a
// malformed or oversized envelope, a compressed message).
Result<Call> ParseCall(const HttpServer::Request& request);

// Decodes message `index` of `call` into `out` (JSON: unknown fields are
// ignored, as Connect servers do).
Status Decode(const Call& call, size_t index, google::protobuf::Message* out);
// `message` in the call's encoding.
std::string Encode(const Call& call, const google::protobuf::Message& message);

// The request's content type, lowercased, without its parameters.
std::string MediaType(const HttpServer::Request& request);

// The error answer to a call, framed as its content type asks: a
// streaming call's (application/connect+*) is a stream of its end alone.
HttpServer::Response ErrorFor(const HttpServer::Request& request, Code code, std::string_view message);

// A unary call's answers.
HttpServer::Response UnaryReply(const Call& call, const google::protobuf::Message& message);
HttpServer::Response ErrorReply(Code code, std::string_view message);
HttpServer::Response ErrorReply(const Status& status);

// A streaming call's pieces: one message, and the end of the stream (with
// the error, if the call failed).
std::string StreamMessage(const Call& call, const google::protobuf::Message& message);
std::string StreamEnd(const Status& status = OkStatus());
std::string StreamEnd(Code code, std::string_view message);
// The content type of a streamed answer to `call`.
std::string StreamContentType(const Call& call);

// One envelope: flags (0x02: the end of a stream), length, data.
std::string Envelope(uint8_t flags, std::string_view data);

// The seconds between keepalives a streaming call's client asks for
// (Keepalive-Ping-Interval; 0: none; at most an hour).
int64_t KeepAliveInterval(const HttpServer::Request& request);
// A copy of the caller's connection, for a stream to notice it hang up
// (holding -1 for a request without one).
std::shared_ptr<UniqueFd> CallerConnection(const HttpServer::Request& request);

// A stream's keepalive: calls `tick` every `seconds` (the client's
// Keepalive-Ping-Interval) on a thread of its own until stopped (or
// destroyed); 0: never.
class KeepAlive {
 public:
  KeepAlive(int64_t seconds, std::function<void()> tick) {
    if (seconds <= 0) return;
    thread_ = std::thread([this, seconds, tick = std::move(tick)] {
      std::unique_lock lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return stop_; })) {
        lock.unlock();
        tick();
        lock.lock();
      }
    });
  }
  ~KeepAlive() { Stop(); }
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata::launcher::e2b
