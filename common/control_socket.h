// Node-local control sockets: one JSON request and one JSON answer per
// connection, in frames (common/frame.h) on a unix socket. The server greets
// every connection with the protocol version it speaks and the caller names
// its own in the request, so two releases that differ refuse each other at
// once, by name, instead of waiting on an answer that never comes. The lazyfs daemon
// serves its API this way; docs/protocol.md ("Control sockets") has the wire
// format. (The launcher daemon's public API is HTTP: launcher/front/http_server.h.)
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/unique_fd.h"
#include "common/units.h"

namespace strata {

struct ControlRequest {
  std::string op;                    // "acquire", "stats", ...
  nlohmann::json args;               // always an object
  uid_t peer_uid = static_cast<uid_t>(-1);  // SO_PEERCRED of the caller
  gid_t peer_gid = static_cast<gid_t>(-1);
  pid_t peer_pid = 0;
};

// Answers a request: a JSON object, or an error (its message and errno go
// back to the caller).
using ControlHandler = std::function<Result<nlohmann::json>(const ControlRequest&)>;

class ControlServer {
 public:
  // Binds `socket_path` (ListenUnix: a stale socket file is replaced, one a
  // live server answers on refused), chmods it to `mode`, and serves: a
  // thread per connection, so a handler may block.
  static Result<std::unique_ptr<ControlServer>> ListenUnix(const std::string& socket_path, mode_t mode,
                                                           ControlHandler handler, int protocol = 1);
  // Serves on a listening socket that someone else owns (a supervisor hands
  // it over): the server never shuts it down nor removes its file, so the
  // next server takes the connections waiting in its backlog.
  static Result<std::unique_ptr<ControlServer>> Serve(UniqueFd listener, std::string socket_path,
                                                      ControlHandler handler, int protocol = 1);
  // Stops accepting, waits for running handlers, removes the socket file
  // (ListenUnix only).
  ~ControlServer();
  // Stops accepting and waits until every running handler has answered;
  // callers that connect from now on wait in the backlog.
  void Drain();

  const std::string& socket_path() const { return socket_path_; }

 private:
  ControlServer() = default;
  void StopAccepting();
  void AcceptLoop();
  void Answer(int conn);

  static Result<std::unique_ptr<ControlServer>> Start(UniqueFd listener, std::string socket_path,
                                                      ControlHandler handler, int protocol, bool owns_path);
  std::string socket_path_;
  ControlHandler handler_;
  int protocol_ = 1;
  bool owns_path_ = true;
  UniqueFd listener_;
  UniqueFd wake_[2];  // written to stop the acceptor
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable idle_;
  int running_ = 0;     // connections being served
  std::set<int> live_;  // their descriptors
};

// Sends one request to the server on `socket_path` and returns its answer.
// A server that cannot be reached keeps connect's errno (ENOENT,
// ECONNREFUSED); an answer slower than `timeout` is ETIMEDOUT; a server
// that speaks another protocol version, or none, is EPROTO at once; one
// that closes the connection before answering is ECONNRESET.
Result<nlohmann::json> ControlCall(const std::string& socket_path, std::string_view op, const nlohmann::json& args,
                                   Duration timeout, int protocol = 1);

}  // namespace strata
