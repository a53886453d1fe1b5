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

HttpServer::Response RestError(int status, std::string_view message) {
  HttpServer::Response r;
  r.status = status;
  r.body = api::Dump({{"code", status}, {"message", std::string(message)}});
  return r;
}

HttpServer::Response RestError(const Status& s) { return RestError(HttpServer::HttpStatusFor(s.code()), s.message()); }

}  // namespace strata::launcher::e2b
