// Client side of the lazyfs daemon's socket, and starting the daemon on
// first use.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/units.h"

namespace strata::lazyfs {

// The control socket's protocol (common/control_socket.h): 2 is frames with
// the greeting. Client and daemon of one release speak the same.
inline constexpr int kControlProtocol = 2;

class Client {
 public:
  explicit Client(std::string socket_path) : socket_path_(std::move(socket_path)) {}

  // Sends one request (docs/architecture.md lists them: health, stats,
  // mount, umount, acquire, release); an error answer becomes the daemon's
  // error, with its errno.
  Result<nlohmann::json> Call(std::string_view op, const nlohmann::json& args = nlohmann::json::object());
  // Whether a daemon answers on the socket.
  bool Alive();
  const std::string& socket_path() const { return socket_path_; }

 private:
  std::string socket_path_;
};

struct DaemonLaunch {
  std::string socket_path;
  std::string cache_dir;      // empty: the daemon's default
  std::string cache_size;     // empty: the daemon's default
  // The lazyfs executable; empty: this process's own executable when it is
  // lazyfs, else "lazyfs" beside it, in the build tree's lazyfs/, or in PATH.
  std::string executable;
};

// Where the lazyfs executable is, as DaemonLaunch::executable explains.
std::string FindLazyfsExecutable();

// Returns once a daemon answers on launch.socket_path, starting one (this
// executable, "daemon", in the background) when none does. Several callers
// racing to start one end up sharing the one that wins.
Status EnsureDaemon(const DaemonLaunch& launch, Duration wait = std::chrono::seconds(20));

}  // namespace strata::lazyfs
