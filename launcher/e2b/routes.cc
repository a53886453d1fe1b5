#include "launcher/e2b/routes.h"

#include <algorithm>

#include "common/strings.h"
#include "launcher/api/wire.h"

namespace strata::launcher::e2b {

bool IsControlPath(const std::string& path) {
  return path == "/sandboxes" || path.starts_with("/sandboxes/") || path == "/v2/sandboxes" ||
         path.starts_with("/v2/sandboxes/") || path == "/templates" || path.starts_with("/templates/") ||
         path.starts_with("/v2/templates") || path.starts_with("/v3/templates") || path == "/snapshots" ||
         path == "/v1/templates" || path.starts_with("/v1/templates/");
}

std::string SandboxOfHost(const std::string& host) {
  const std::string prefix = StrCat(kEnvdPort, "-");
  if (!host.starts_with(prefix)) return "";
  const size_t dot = host.find('.', prefix.size());
  return dot == std::string::npos ? "" : host.substr(prefix.size(), dot - prefix.size());
}

std::string Header(const HttpServer::Request& r, const char* name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? "" : it->second;
}

std::string EnvdSandboxId(const HttpServer::Request& r) {
  std::string id = Header(r, "e2b-sandbox-id");
  return id.empty() ? SandboxOfHost(Header(r, "host")) : id;
}

bool Claims(const HttpServer::Request& r) { return !EnvdSandboxId(r).empty() || IsControlPath(r.path); }

bool IsSandboxId(const std::string& id) {
  return !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

// An envd path relative to the user's home, made absolute; refuses NUL and "..".
Result<std::string> EnvdPath(std::string path, const std::string& user) {
  if (path.find('\0') != std::string::npos) return Error(EINVAL, "path holds a NUL byte");
  if (path.empty()) return Error(EINVAL, "path is empty");
  if (path[0] != '/') path = (user == "root" ? "/root/" : "/home/" + user + "/") + path;
  for (const auto& part : Split(path, '/')) {
    if (part == "..") return Error(EINVAL, "path " + Quote(path) + " holds \"..\"");
  }
  return path;
}

// The user an envd call names: Authorization: Basic base64("<user>:"),
// or a `username` query, else "user".
std::string EnvdUser(const HttpServer::Request& r) {
  if (auto q = r.query.find("username"); q != r.query.end() && !q->second.empty()) return q->second;
  const std::string auth = Header(r, "authorization");
  if (auth.starts_with("Basic ")) {
    auto decoded = Base64Decode(auth.substr(6));
    if (decoded && !decoded->empty()) return decoded->substr(0, decoded->find(':'));
  }
  return "user";
}

HttpServer::Response RestError(int status, std::string_view message) {
  HttpServer::Response r;
  r.status = status;
  r.body = api::Dump({{"code", status}, {"message", std::string(message)}});
  return r;
}

HttpServer::Response RestError(const Status& s) { return RestError(HttpServer::HttpStatusFor(s.code()), s.message()); }

}  // namespace strata::launcher::e2b
