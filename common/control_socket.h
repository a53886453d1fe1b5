// Node-local control sockets: one JSON request and one JSON answer per
// connection, in frames (common/frame.h) on a unix socket. The lazyfs daemon
// serves its API this way; docs/protocol.md ("Control sockets") has the wire
// format. (The launcher daemon's public API is HTTP: common/http_server.h.)
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
                                                           ControlHandler handler);
  // Stops accepting, waits for running handlers, removes the socket file.
  ~ControlServer();

  const std::string& socket_path() const { return socket_path_; }

 private:
  ControlServer() = default;
  void AcceptLoop();
  void Serve(int conn);

  std::string socket_path_;
  ControlHandler handler_;
  UniqueFd listener_;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable idle_;
  int running_ = 0;     // connections being served
  std::set<int> live_;  // their descriptors
};

// Sends one request to the server on `socket_path` and returns its answer.
// A server that cannot be reached keeps connect's errno (ENOENT,
// ECONNREFUSED); an answer slower than `timeout` is ETIMEDOUT.
Result<nlohmann::json> ControlCall(const std::string& socket_path, std::string_view op, const nlohmann::json& args,
                                   Duration timeout);

}  // namespace strata
