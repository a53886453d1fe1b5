// How E2B's calls are told apart and routed: what the node's plane and a
// gateway both need to know of a request before either looks inside it.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "launcher/front/http_server.h"

namespace strata::launcher::e2b {

// The port E2B's clients address envd by.
inline constexpr int kEnvdPort = 49983;

// Whether `path` is the control plane's (E2B's REST API, or strata's
// /v1/templates); anything else the plane claims is an envd call.
bool IsControlPath(const std::string& path);

// "49983-<id>.<domain>" -> id; empty if the host is not of that form.
std::string SandboxOfHost(const std::string& host);

// The sandbox an envd call names: its E2b-Sandbox-Id header, else its
// Host; empty if neither names one.
std::string EnvdSandboxId(const HttpServer::Request& request);

// Whether `request` is E2B's: a control path, or an envd call.
bool Claims(const HttpServer::Request& request);

bool IsSandboxId(const std::string& id);

// A header's value, "" when absent (names are lowercase).
std::string Header(const HttpServer::Request& r, const char* name);

// An envd path relative to the user's home, made absolute; refuses NUL and "..".
Result<std::string> EnvdPath(std::string path, const std::string& user);
// The user an envd call names: Authorization: Basic base64("<user>:"),
// or a `username` query, else "user".
std::string EnvdUser(const HttpServer::Request& r);

// E2B's REST error: {"code": <HTTP status>, "message": ...}.
HttpServer::Response RestError(int status, std::string_view message);
HttpServer::Response RestError(const Status& s);

}  // namespace strata::launcher::e2b
