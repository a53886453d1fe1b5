// HttpServer: the launcher daemon's HTTP/JSON API on a unix socket (libmicrohttpd on
// a socket we bind ourselves). One thread per connection, so a handler may
// block (an exec streaming output, a snapshot).
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"

namespace strata {

class HttpServer {
 public:
  struct Request {
    std::string method;  // "GET", "POST", ...
    std::string path;    // "/v1/sandboxes"
    std::map<std::string, std::string> query;
    std::map<std::string, std::string> headers;  // names lowercased
    std::string body;
    uid_t peer_uid = static_cast<uid_t>(-1);  // SO_PEERCRED of the client
    gid_t peer_gid = static_cast<gid_t>(-1);
    pid_t peer_pid = 0;
    // The client's connection, to notice it going away (poll it, or a dup
    // of it, for POLLHUP only: never read, write or close it).
    int connection_fd = -1;
  };

  // Writes a streamed body piece by piece; returns false once the client
  // has gone away.
  using StreamWriter = std::function<bool(std::string_view chunk)>;

  struct Response {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    // When set, the body is produced by this function (chunked encoding)
    // on the connection's thread after the headers are sent.
    std::function<void(const StreamWriter&)> stream;
  };

  using Handler = std::function<Response(const Request&)>;

  // Binds `socket_path` (replacing a stale socket file, refusing one a live
  // server answers on), chmods it to `mode`, and serves. The handler must
  // not throw (a thrown exception becomes a 500 response).
  static Result<std::unique_ptr<HttpServer>> ListenUnix(const std::string& socket_path, mode_t mode, Handler handler);
  // Stops accepting, waits for handlers to return, removes the socket file.
  ~HttpServer();

  const std::string& socket_path() const { return socket_path_; }

  // {"error": message} with the status for the error's errno.
  static Response ErrorResponse(const Status& status);
  static int HttpStatusFor(int err);

  struct Impl;  // defined in the .cc

 private:
  HttpServer() = default;
  std::string socket_path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
