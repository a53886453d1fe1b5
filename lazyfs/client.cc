// lazyfs client: JSON over the daemon's unix socket.
#include "lazyfs/client.h"

#include <unistd.h>

#include <thread>

#include "cache/http_client.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"

namespace strata::lazyfs {

using nlohmann::json;

Client::Client(std::string socket_path) : socket_path_(std::move(socket_path)) {
  cache::HttpOptions options;
  options.unix_socket = socket_path_;
  options.attempts = 1;  // a local daemon: no retries, but mounts may take a while
  options.connect_timeout = std::chrono::seconds(2);
  options.attempt_timeout = std::chrono::seconds(300);
  options.deadline = std::chrono::seconds(300);
  http_ = std::make_unique<cache::HttpClient>("lazyfs daemon " + socket_path_, options);
}

Client::~Client() = default;

Result<json> Client::Call(const std::string& method, const std::string& path, const json& body) {
  std::string text = body.is_null() ? std::string() : body.dump();
  cache::HttpRequest request;
  request.method = method;
  request.url = "http://lazyfs" + path;
  request.body = text;
  if (!text.empty()) request.headers.push_back("Content-Type: application/json");
  STRATA_ASSIGN_OR_RETURN(cache::HttpResponse response, http_->Perform(request, method + " " + path));
  json j = json::parse(response.body.empty() ? "{}" : response.body, nullptr, false);
  if (response.status / 100 != 2) {
    std::string message = j.is_object() && j.contains("error") ? j["error"].get<std::string>() : response.status_line;
    int code = j.is_object() && j.contains("errno") && j["errno"].is_number_integer() ? j["errno"].get<int>() : EIO;
    return Error(code, message);
  }
  if (j.is_discarded()) return Error(EIO, StrCat("lazyfs daemon ", socket_path_, ": answer is not JSON"));
  return j;
}

bool Client::Alive() { return ::access(socket_path_.c_str(), F_OK) == 0 && Call("GET", "/v1/health").ok(); }

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
