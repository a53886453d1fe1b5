// lazyfs client: requests on the daemon's control socket.
#include "lazyfs/client.h"

#include <unistd.h>

#include <thread>

#include "common/control_socket.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"

namespace strata::lazyfs {

using nlohmann::json;

Result<json> Client::Call(std::string_view op, const json& args) {
  // Mounting fetches a layer's metadata, which may take a while. A serving
  // process that dies (or hands over) under a request closes its
  // connection unanswered: the request goes again to its successor, which
  // the supervisor starts at once. Every request is safe to repeat: a
  // repeated mount answers the mount made, a repeated release or umount of
  // what the first one removed is what was asked.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int attempt = 0;; ++attempt) {
    auto r = ControlCall(socket_path_, op, args, std::chrono::seconds(300), kControlProtocol);
    if (attempt > 0 && !r.ok() && r.status().code() == ENOENT && (op == "release" || op == "umount")) return json::object();
    if (r.ok() || r.status().code() != ECONNRESET || std::chrono::steady_clock::now() > deadline) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool Client::Alive() { return ::access(socket_path_.c_str(), F_OK) == 0 && Call("health").ok(); }

std::string FindLazyfsExecutable() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string exe = n > 0 ? std::string(self, static_cast<size_t>(n)) : "";
  if (Basename(exe) == "lazyfs") return exe;
  std::string dir = Dirname(exe);
  for (const std::string& candidate : {dir + "/lazyfs", dir + "/../lazyfs/lazyfs"}) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "lazyfs";  // from PATH
}

Status EnsureDaemon(const DaemonLaunch& launch, Duration wait) {
  Client client(launch.socket_path);
  if (client.Alive()) return OkStatus();
  std::string exe = launch.executable.empty() ? FindLazyfsExecutable() : launch.executable;
  std::vector<std::string> argv = {exe, "daemon", "--socket", launch.socket_path};
  if (!launch.cache_dir.empty()) argv.insert(argv.end(), {"--cache", launch.cache_dir});
  if (!launch.cache_size.empty()) argv.insert(argv.end(), {"--cache-size", launch.cache_size});
  // `lazyfs daemon` returns once it serves (or failed); a loser of a start
  // race fails on the lock and the winner's socket answers below.
  auto started = RunCommand({.argv = argv, .stdout_mode = StdStream::kNull, .timeout = wait});
  std::string detail = started.ok() ? started->err : started.status().ToString();
  auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    if (client.Alive()) return OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  while (!detail.empty() && detail.back() == '\n') detail.pop_back();
  return Error(ECONNREFUSED, StrCat("start the lazyfs daemon on ", launch.socket_path, ": it did not answer",
                                    detail.empty() ? "" : ": " + detail));
}

}  // namespace strata::lazyfs
