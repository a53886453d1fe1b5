// What the gateway's two files (gateway.cc, gateway_e2b.cc) share.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "launcher/cluster/forward.h"
#include "launcher/front/http_server.h"

namespace strata::launcher::gw {

// How long a call the gateway makes on its own (a list, metrics, a key
// probe) waits for a node; a node slower than that is left out (a list
// names it) or, for a probe, makes the answer unknown.
inline constexpr auto kFanOutTimeout = std::chrono::seconds(10);
inline constexpr auto kProbeTimeout = std::chrono::seconds(3);

// The answer for a sandbox whose node is gone: the caller's SDK retries
// 503s, and the node may come back (its sandboxes are re-adopted).
HttpServer::Response NodeLost(const std::string& node, const std::string& why);
// The request's path and query, encoded again for the node.
std::string Target(const HttpServer::Request& req);
// A node's answer as the caller gets it: the node's refusal of the
// gateway's own credential is the gateway's problem (502), not a reason
// for the caller to doubt its token.
HttpServer::Response FromNode(const std::string& node, HttpServer::Response r);
// A forwarded answer's whole body (one that is not JSON arrives as a
// stream); nullopt when the node's answer broke off.
std::optional<std::string> WholeBody(Forwarder::Outcome& out);

}  // namespace strata::launcher::gw
