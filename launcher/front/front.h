// What the node's API and the gateway share in front of their routes: who
// is calling (Caller, auth.h), and one policy for answering a request — the
// refusal of a caller, the exceptions a route may throw, the retry hint.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "launcher/front/auth.h"
#include "launcher/front/http_server.h"

namespace strata::launcher {

// Answers `request` as every front does. `authenticate` says who calls;
// its refusal is the answer (AuthRefusal). `route` answers for that caller, and no
// exception leaves here: a JSON field of the wrong type or a value that
// is not one (std::logic_error) is 400 naming the request, any other
// exception 500 (ENOMEM for a failed allocation, EIO else). A 429 or 503 says Retry-After: 1
// unless `route` gave its own (a node's, passed on by a gateway).
HttpServer::Response Answer(const HttpServer::Request& request,
                            const std::function<Result<Caller>(const HttpServer::Request&)>& authenticate,
                            const std::function<HttpServer::Response(const HttpServer::Request&, const Caller&)>& route);

}  // namespace strata::launcher
