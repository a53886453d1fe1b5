// The launcher daemon's API: HTTP/JSON on a unix socket (docs/api.md).
#pragma once

#include <memory>
#include <string>

#include "common/http_server.h"
#include "launcher/manager.h"

namespace strata::launcher {

struct ServeOptions {
  std::string socket_path = kDefaultLauncherSocket;
  std::string state_dir = kDefaultLauncherState;
  // Besides root: members of this group may call (the socket becomes
  // root:<group> 0660), and/or anyone presenting this token
  // ("Authorization: Bearer <token>", the socket then 0666).
  std::string allow_group;
  std::string token;
};

class LauncherServer {
 public:
  static Result<std::unique_ptr<LauncherServer>> Start(const ServeOptions& options, SandboxManager& manager);
  ~LauncherServer();

  // Whether the caller may use the API (exposed for tests).
  static bool Allowed(const HttpServer::Request& request, const ServeOptions& options, gid_t group);

 private:
  LauncherServer(const ServeOptions& options, SandboxManager& manager) : options_(options), manager_(manager) {}
  HttpServer::Response Handle(const HttpServer::Request& request);
  HttpServer::Response Route(const HttpServer::Request& request);

  ServeOptions options_;
  SandboxManager& manager_;
  gid_t group_ = static_cast<gid_t>(-1);
  std::unique_ptr<HttpServer> server_;
};

}  // namespace strata::launcher
