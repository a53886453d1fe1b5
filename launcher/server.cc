// LauncherServer: requests to SandboxManager calls.
#include "launcher/server.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "common/strings.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "launcher/agent_protocol.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

HttpServer::Response Json(const json& j, int status = 200) {
  HttpServer::Response r;
  r.status = status;
  r.body = j.dump();
  return r;
}

// Every group the peer process is in (SO_PEERCRED gives only its primary).
bool InGroup(pid_t pid, gid_t primary, gid_t group) {
  if (primary == group) return true;
  std::ifstream status(StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with("Groups:")) continue;
    std::istringstream in(line.substr(7));
    gid_t g;
    while (in >> g) {
      if (g == group) return true;
    }
  }
  return false;
}

bool SameToken(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Result<SandboxSpec> ParseSpec(const json& j) {
  SandboxSpec spec;
  try {
    spec.layers = j.at("layers").get<std::vector<std::string>>();
    spec.store = j.value("store", "");
    spec.backend = j.value("backend", "container");
    if (spec.backend != "container" && spec.backend != "fncall") {
      return Error(EINVAL, "create: backend must be container or fncall, not " + Quote(spec.backend));
    }
    spec.limits.cpus = j.value("cpus", 0.0);
    spec.limits.pids = j.value("pids", int64_t{0});
    if (j.contains("memory")) {
      STRATA_ASSIGN_OR_RETURN(spec.limits.memory, j["memory"].is_string() ? ParseSize(j["memory"].get<std::string>())
                                                                          : Result<uint64_t>(j["memory"].get<uint64_t>()));
    }
    if (j.contains("disk")) {
      STRATA_ASSIGN_OR_RETURN(spec.disk, j["disk"].is_string() ? ParseSize(j["disk"].get<std::string>())
                                                               : Result<uint64_t>(j["disk"].get<uint64_t>()));
    }
    std::string net = j.value("network", "none");
    if (net != "none" && net != "host") return Error(EINVAL, "create: network must be none or host");
    spec.host_network = net == "host";
    spec.env = j.value("env", std::vector<std::string>{});
    spec.workdir = j.value("workdir", "/");
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("create: ", e.what()));
  }
  if (spec.layers.empty()) return Error(EINVAL, "create: layers must name at least one layer");
  return spec;
}

Result<ExecRequest> ParseExec(const json& j) {
  ExecRequest r;
  try {
    r.argv = j.at("argv").get<std::vector<std::string>>();
    r.env = j.value("env", std::vector<std::string>{});
    r.cwd = j.value("cwd", "");
    if (j.contains("timeout")) {
      if (j["timeout"].is_string()) {
        STRATA_ASSIGN_OR_RETURN(r.timeout, ParseDuration(j["timeout"].get<std::string>()));
      } else {
        r.timeout = std::chrono::milliseconds(static_cast<int64_t>(j["timeout"].get<double>() * 1000));
      }
    }
    uint64_t cap = j.value("output_cap", uint64_t{1} << 20);
    r.stdout_cap = r.stderr_cap = cap;
    if (j.contains("stdin")) {
      auto in = Base64Decode(j["stdin"].get<std::string>());
      if (!in) return Error(EINVAL, "exec: stdin is not base64");
      r.stdin_data = std::move(*in);
    }
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("exec: ", e.what()));
  }
  if (r.argv.empty()) return Error(EINVAL, "exec: argv is empty");
  return r;
}

}  // namespace

bool LauncherServer::Allowed(const HttpServer::Request& request, const ServeOptions& options, gid_t group) {
  if (request.peer_uid == 0) return true;
  if (group != static_cast<gid_t>(-1) && InGroup(request.peer_pid, request.peer_gid, group)) return true;
  if (!options.token.empty()) {
    auto it = request.headers.find("authorization");
    if (it != request.headers.end() && it->second.starts_with("Bearer ") &&
        SameToken(std::string_view(it->second).substr(7), options.token)) {
      return true;
    }
  }
  return false;
}

Result<std::unique_ptr<LauncherServer>> LauncherServer::Start(const ServeOptions& options, SandboxManager& manager) {
  std::unique_ptr<LauncherServer> s(new LauncherServer(options, manager));
  mode_t mode = 0600;
  if (!options.allow_group.empty()) {
    group* g = ::getgrnam(options.allow_group.c_str());
    if (!g) return Error(ENOENT, "serve: no group named " + Quote(options.allow_group));
    s->group_ = g->gr_gid;
    mode = 0660;
  }
  if (!options.token.empty()) mode = 0666;  // the token is the gate
  STRATA_ASSIGN_OR_RETURN(s->server_, HttpServer::ListenUnix(options.socket_path, mode,
                                                             [p = s.get()](const HttpServer::Request& r) { return p->Handle(r); }));
  if (s->group_ != static_cast<gid_t>(-1) && ::chown(options.socket_path.c_str(), 0, s->group_) != 0) {
    return ErrnoError(errno, "chown " + options.socket_path);
  }
  return s;
}

LauncherServer::~LauncherServer() = default;

HttpServer::Response LauncherServer::Handle(const HttpServer::Request& req) {
  if (!Allowed(req, options_, group_)) {
    return HttpServer::ErrorResponse(Error(EACCES, "launcher: not allowed (root, the allowed group, or a token)"));
  }
  try {
    return Route(req);
  } catch (const json::exception& e) {  // a field of the wrong type
    return HttpServer::ErrorResponse(Error(EINVAL, StrCat(req.method, " ", req.path, ": ", e.what())));
  } catch (const std::logic_error& e) {  // a number that is not one
    return HttpServer::ErrorResponse(Error(EINVAL, StrCat(req.method, " ", req.path, ": bad value (", e.what(), ")")));
  }
}

HttpServer::Response LauncherServer::Route(const HttpServer::Request& req) {
  if (req.method == "GET" && req.path == "/metrics") {
    HttpServer::Response r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = manager_.Metrics();
    return r;
  }
  if (req.method == "GET" && req.path == "/v1/health") {
    return Json({{"ok", true}, {"pid", ::getpid()}, {"sandboxes", manager_.Count()}});
  }
  // (A PUT's body is the file itself.)
  json body = req.method == "PUT" ? json::object() : json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
  if (req.method != "PUT" && (body.is_discarded() || !body.is_object())) {
    return HttpServer::ErrorResponse(Error(EINVAL, "request body is not a JSON object"));
  }
  if (req.path == "/v1/sandboxes") {
    if (req.method == "GET") return Json(manager_.List());
    if (req.method == "POST") {
      auto spec = ParseSpec(body);
      if (!spec.ok()) return HttpServer::ErrorResponse(spec.status());
      auto info = manager_.Create(std::move(*spec));
      return info.ok() ? Json(*info, 201) : HttpServer::ErrorResponse(info.status());
    }
  }
  const std::string prefix = "/v1/sandboxes/";
  if (!req.path.starts_with(prefix)) return HttpServer::ErrorResponse(Error(ENOENT, "no API " + req.method + " " + req.path));
  std::string rest = req.path.substr(prefix.size());
  std::string id = rest.substr(0, rest.find('/'));
  std::string verb = rest.size() > id.size() ? rest.substr(id.size() + 1) : "";
  auto status_reply = [](const Status& s) { return s.ok() ? Json(json::object()) : HttpServer::ErrorResponse(s); };

  if (verb.empty() && req.method == "GET") {
    auto info = manager_.Info(id);
    return info.ok() ? Json(*info) : HttpServer::ErrorResponse(info.status());
  }
  if (verb.empty() && req.method == "DELETE") return status_reply(manager_.Destroy(id));
  if (verb == "pause" && req.method == "POST") return status_reply(manager_.Pause(id));
  if (verb == "resume" && req.method == "POST") return status_reply(manager_.Resume(id));
  if (verb == "files") {
    auto path = req.query.find("path");
    if (path == req.query.end() || path->second.empty() || path->second[0] != '/') {
      return HttpServer::ErrorResponse(Error(EINVAL, "files: ?path=/absolute/path is required"));
    }
    if (req.method == "PUT") {
      uint32_t mode = 0644;
      if (auto m = req.query.find("mode"); m != req.query.end()) mode = static_cast<uint32_t>(std::stoul(m->second, nullptr, 8));
      return status_reply(manager_.Put(id, path->second, req.body, mode));
    }
    if (req.method == "GET") {
      auto data = manager_.Get(id, path->second);
      if (!data.ok()) return HttpServer::ErrorResponse(data.status());
      HttpServer::Response r;
      r.content_type = "application/octet-stream";
      r.body = std::move(*data);
      return r;
    }
  }
  if (verb == "exec" && req.method == "POST") {
    auto exec = ParseExec(body);
    if (!exec.ok()) return HttpServer::ErrorResponse(exec.status());
    // A client that goes away abandons its command (the agent kills it). A
    // copy of the connection's descriptor: valid as long as the exec runs,
    // whatever the server does with its own.
    auto watch = std::make_shared<UniqueFd>(req.connection_fd >= 0 ? ::fcntl(req.connection_fd, F_DUPFD_CLOEXEC, 0) : -1);
    exec->cancel_fd = watch->get();
    if (!body.value("stream", true)) {
      std::string out, err;
      auto result = manager_.Exec(id, std::move(*exec), [&](int stream, std::string_view b) { (stream == 1 ? out : err).append(b); });
      if (!result.ok()) return HttpServer::ErrorResponse(result.status());
      json j = ExecResultJson(*result);
      j["stdout"] = Base64Encode(out);
      j["stderr"] = Base64Encode(err);
      return Json(j);
    }
    // Streamed: agent-protocol frames as they come (stdout, stderr, then
    // exit or error), so a client sees output before the command ends.
    HttpServer::Response r;
    r.content_type = "application/vnd.strata.frames";
    r.stream = [this, id, request = std::move(*exec), watch](const HttpServer::StreamWriter& write) mutable {
      auto result = manager_.Exec(id, std::move(request), [&](int stream, std::string_view b) {
        write(EncodeFrame(stream == 1 ? Frame::kStdout : Frame::kStderr, b));
      });
      if (result.ok()) {
        write(EncodeFrame(Frame::kExit, ExecResultJson(*result).dump()));
      } else {
        write(EncodeFrame(Frame::kError, json{{"error", result.status().ToString()}, {"errno", result.status().code()}}.dump()));
      }
    };
    return r;
  }
  if (verb == "snapshot" && req.method == "POST") {
    std::vector<std::string> excludes;
    try {
      excludes = body.value("exclude", std::vector<std::string>{});
    } catch (const json::exception& e) {
      return HttpServer::ErrorResponse(Error(EINVAL, StrCat("snapshot: exclude: ", e.what())));
    }
    if (!body.contains("tag") || !body["tag"].is_string()) {
      return HttpServer::ErrorResponse(Error(EINVAL, "snapshot: tag (NAME:VERSION) is required"));
    }
    auto r = manager_.Snapshot(id, body["tag"].get<std::string>(), std::move(excludes));
    return r.ok() ? Json(*r, 201) : HttpServer::ErrorResponse(r.status());
  }
  return HttpServer::ErrorResponse(Error(ENOENT, "no API " + req.method + " " + req.path));
}

}  // namespace strata::launcher
