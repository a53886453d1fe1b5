// nginx and s3rver as test fixtures: config, start, readiness, teardown.
#include "tests/testing/store_servers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "cache/http_client.h"
#include "common/strings.h"

#ifndef STRATA_SOURCE_DIR
#error "STRATA_SOURCE_DIR must name the source tree"
#endif

namespace strata::testing {
namespace {

constexpr auto kReadyTimeout = std::chrono::seconds(20);

bool Exited(pid_t pid) {
  auto stat = ReadFileToString(StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return true;
  size_t paren = stat->rfind(')');
  return paren == std::string::npos || paren + 2 >= stat->size() || (*stat)[paren + 2] == 'Z';
}

bool OnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (const auto& dir : Split(path ? path : "/usr/bin:/bin", ':')) {
    if (!dir.empty() && ::access(JoinPath(dir, name).c_str(), X_OK) == 0) return true;
  }
  return ::access(("/usr/sbin/" + name).c_str(), X_OK) == 0;
}

// Polls `url` until it answers 200 with a body containing `marker`, or the
// process exits, or the readiness timeout passes.
Status WaitReady(const std::string& what, pid_t pid, const std::string& url, const std::string& marker,
                 const std::string& log_path) {
  cache::HttpOptions options;
  options.attempts = 1;
  options.attempt_timeout = std::chrono::seconds(2);
  options.connect_timeout = std::chrono::seconds(1);
  cache::HttpClient probe(what, options);
  cache::HttpRequest req;
  req.url = url;
  auto give_up = std::chrono::steady_clock::now() + kReadyTimeout;
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < give_up) {
    if (Exited(pid)) {
      std::string log = log_path.empty() ? "" : ReadFileToString(log_path).value_or("");
      return Error(ECHILD, StrCat(what, " exited during startup", log.empty() ? "" : ": ", log));
    }
    auto r = probe.Perform(req, "readiness probe");
    if (r.ok() && r->status == 200 && r->body.find(marker) != std::string::npos) return OkStatus();
    last = r.ok() ? r->status_line : r.status().message();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Error(ETIMEDOUT, StrCat(what, " did not become ready within ", kReadyTimeout.count(), "s (last: ", last, ")"));
}

std::string RandomToken() {
  std::mt19937_64 rng{std::random_device{}()};
  return StrCat("ready", rng() % 1000000000);
}

}  // namespace

Result<int> FreeLoopbackPort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return ErrnoError(errno, "bind");
  socklen_t len = sizeof addr;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return ErrnoError(errno, "getsockname");
  return static_cast<int>(ntohs(addr.sin_port));
}

Result<std::unique_ptr<NginxServer>> NginxServer::Start(int workers) {
  if (!OnPath("nginx")) return Error(ENOENT, "nginx is not installed (scripts/setup installs nginx-light)");
  Status last;
  // A port picked free can be taken before nginx binds it: try a few.
  for (int tries = 0; tries < 3; ++tries) {
    STRATA_ASSIGN_OR_RETURN(TempDir dir, TempDir::Create("strata-nginx"));
    STRATA_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
    STRATA_RETURN_IF_ERROR(MakeDirs(dir.Sub("root")));
    const std::string token = RandomToken();
    const std::string d = dir.path();
    std::string process_lines = workers == 0 ? "master_process off;\n"
                                             : StrCat("worker_processes ", workers, ";\n",
                                                      ::geteuid() == 0 ? "user root root;\n" : "");
    std::string conf = StrCat(
        "daemon off;\n", process_lines, "pid ", d, "/nginx.pid;\n", "error_log ", d, "/error.log warn;\n",
        "events { worker_connections 4096; }\n",
        "http {\n",
        "  access_log off;\n",
        "  client_body_temp_path ", d, "/body;\n  proxy_temp_path ", d, "/proxy;\n",
        "  fastcgi_temp_path ", d, "/fastcgi;\n  uwsgi_temp_path ", d, "/uwsgi;\n  scgi_temp_path ", d, "/scgi;\n",
        "  client_max_body_size 0;\n  sendfile on;\n  keepalive_requests 100000;\n",
        "  server {\n",
        "    listen 127.0.0.1:", port, ";\n",
        "    root ", d, "/root;\n",
        "    location = /strata-ready { return 200 \"", token, "\"; }\n",
        "    location / {\n",
        "      dav_methods PUT DELETE MOVE;\n      create_full_put_path on;\n",
        "      autoindex on;\n      autoindex_format json;\n",
        "    }\n  }\n}\n");
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(dir.Sub("nginx.conf"), conf, false));
    SubprocessOptions options;
    options.argv = {"setpriv", "--pdeathsig", "KILL", "--", "nginx", "-p", d, "-c", dir.Sub("nginx.conf"), "-e",
                    dir.Sub("error.log")};
    options.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    options.stdout_mode = StdStream::kNull;
    options.stderr_mode = StdStream::kNull;
    STRATA_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Start(std::move(options)));
    last = WaitReady("nginx", process.pid(), StrCat("http://127.0.0.1:", port, "/strata-ready"), token,
                     dir.Sub("error.log"));
    if (last.ok()) return std::unique_ptr<NginxServer>(new NginxServer(std::move(dir), std::move(process), port));
  }
  return last.Annotate("start nginx");
}

std::string NginxServer::url() const { return StrCat("http://127.0.0.1:", port_); }

std::optional<std::string> S3rverServer::Find() {
  if (const char* env = std::getenv("STRATA_S3RVER"); env && *env) {
    if (::access(env, X_OK) == 0) return std::string(env);
    return std::nullopt;
  }
  std::string path = StrCat(STRATA_SOURCE_DIR, "/build/npm/node_modules/.bin/s3rver");
  if (::access(path.c_str(), X_OK) == 0 && OnPath("node")) return path;
  return std::nullopt;
}

Result<std::unique_ptr<S3rverServer>> S3rverServer::Start(const std::vector<std::string>& buckets) {
  auto exe = Find();
  if (!exe) {
    return Error(ENOENT, StrCat("s3rver is not installed (scripts/setup installs it into ", STRATA_SOURCE_DIR,
                                "/build/npm; needs node and npm)"));
  }
  if (buckets.empty()) return Error(EINVAL, "s3rver: at least one bucket");
  Status last;
  for (int tries = 0; tries < 3; ++tries) {
    STRATA_ASSIGN_OR_RETURN(TempDir dir, TempDir::Create("strata-s3rver"));
    STRATA_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
    STRATA_RETURN_IF_ERROR(MakeDirs(dir.Sub("data")));
    SubprocessOptions options;
    options.argv = {"setpriv", "--pdeathsig", "KILL", "--", *exe, "-d", dir.Sub("data"), "-a", "127.0.0.1",
                    "-p", std::to_string(port), "--silent", "--service-endpoint", "localhost"};
    for (const auto& b : buckets) {
      options.argv.push_back("--configure-bucket");
      options.argv.push_back(b);
    }
    // s3rver makes continuation tokens with DES, which OpenSSL 3 keeps in its
    // legacy provider: without it every truncated listing is a 500.
    options.env = {"NODE_OPTIONS=--openssl-legacy-provider"};
    options.stdout_mode = StdStream::kNull;
    options.stderr_mode = StdStream::kNull;
    STRATA_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Start(std::move(options)));
    // A listing of the first bucket names it: that is s3rver, and it is ready.
    last = WaitReady("s3rver", process.pid(), StrCat("http://127.0.0.1:", port, "/", buckets[0], "?list-type=2"),
                     StrCat("<Name>", buckets[0], "</Name>"), "");
    if (last.ok()) return std::unique_ptr<S3rverServer>(new S3rverServer(std::move(dir), std::move(process), port));
  }
  return last.Annotate("start s3rver");
}

std::string S3rverServer::endpoint() const { return StrCat("http://127.0.0.1:", port_); }

}  // namespace strata::testing
